"""The SDK against the real tally: `Tally` over HTTP to a live server, `AsyncTally` through
`httpx.ASGITransport` into the in-process app. No scripted transport: real statuses, real bodies."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import pytest
from starlette.testclient import TestClient

from tally_sdk import (
    ApiKeyRotationRequired,
    ApiKeyRotationWarning,
    AsyncTally,
    AuthenticationError,
    DuplicateError,
    RetryPolicy,
    Tally,
    TallyAPIError,
    ValidationError,
)
from tally_sdk.renewals import handle_invoice_paid, handle_invoice_paid_async
from tests.conftest import OP, LiveServer, World, make_world
from tests.stripe_fixtures import load_event, with_metadata

T = TypeVar("T")
RENEWAL = "stripe-sync-engine__invoice_paid.json"  # invoice.paid, subscription_cycle, legacy layout
RENEWAL_INVOICE = "in_1KJqKBJDPojXS6LNJbvLUgEy"
NO_RETRY = RetryPolicy(max_retries=0)


def renewal_event(customer_key: str, amount: int = 2900) -> dict[str, Any]:
    event = load_event(RENEWAL)
    event["data"]["object"]["amount_paid"] = amount
    return with_metadata(event, {"svc_customer_key": customer_key}, where="legacy")


def click_and_lead(world: World, customer: str) -> str:
    r = world.client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
    )
    click_id = str(r.json()["data"]["click_id"])
    r = world.client.post(
        "/api/v1/track/lead", json={"customer_external_id": customer, "click_id": click_id}, headers=world.key
    )
    assert r.status_code == 200, r.text
    return click_id


def flag_rotation(world: World, deadline: datetime) -> None:
    r = world.client.post(
        f"/api/v1/operator/programs/{world.program_id}/api-key/rotation",
        json={"deadline": deadline.isoformat()},
        headers=OP,
    )
    assert r.status_code == 200, r.text


# -- sync client, live server -----------------------------------------------------------------------
@pytest.fixture
def live_world(live_server: LiveServer) -> Iterator[World]:
    with httpx.Client(base_url=live_server.url, timeout=10) as http:
        yield make_world(http)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient


@pytest.fixture
def tally(live_server: LiveServer, live_world: World) -> Iterator[Tally]:
    with Tally(base_url=live_server.url, api_key=live_world.api_key, retry=NO_RETRY) as client:
        yield client


def test_sync_happy_path_lead_sale_and_test_sale(tally: Tally, live_world: World) -> None:
    click_id = click_and_lead(live_world, "user_42")
    result = tally.track_sale(
        customer_external_id="user_42", amount=4900, invoice_id="in_sdk_1", currency="EUR"
    )
    assert result.status == 200 and result.attempts == 1
    assert result.warnings == () and result.rotation_flagged is False and result.rotation_deadline is None
    assert re.fullmatch(r"[0-9a-f]{32}", result.request_id or "")  # the SDK's id, echoed
    assert dict(result.data) == {
        "sale_id": result.data["sale_id"],
        "transaction_id": "in_sdk_1",
        "test_mode": False,
        "attributed": True,
        "partner_code": "alice",
        "customer_external_id": "user_42",
        "amount": 4900,
        "currency": "eur",
    }
    assert str(result.data["sale_id"]).startswith("sale_")
    lead = tally.track_lead(customer_external_id="user_43", click_id=click_id)
    assert (lead.data["status"], lead.data["provisional"]) == ("settled", False)
    test_sale = tally.track_test_sale()
    assert test_sale.data["test_mode"] is True
    unattributed = tally.track_sale(customer_external_id="stranger", amount=100, invoice_id="in_sdk_2")
    assert unattributed.data["attributed"] is False
    assert [w["code"] for w in unattributed.warnings] == ["customer_not_attributed"]


def test_sync_typed_errors(tally: Tally, live_server: LiveServer, live_world: World) -> None:
    wrong = Tally(base_url=live_server.url, api_key="aff_" + "x" * 40, retry=NO_RETRY)
    with wrong, pytest.raises(AuthenticationError) as auth:
        wrong.track_test_sale()
    assert (auth.value.code, auth.value.status) == ("invalid_api_key", 401)
    assert not isinstance(auth.value, ApiKeyRotationRequired)
    assert auth.value.doc_url == f"{live_server.url}/docs/errors#invalid_api_key"

    tally.track_sale(customer_external_id="u1", amount=1000, invoice_id="in_dup")
    with pytest.raises(DuplicateError) as dup:
        tally.track_sale(customer_external_id="u1", amount=1000, invoice_id="in_dup")
    assert (dup.value.code, dup.value.status, dup.value.after_retry) == ("duplicate_transaction", 409, False)

    with pytest.raises(ValidationError) as invalid:  # the SDK lets any non-empty currency through
        tally.track_sale(customer_external_id="u1", amount=1000, invoice_id="in_bad_cur", currency="dollars")
    assert (invalid.value.code, invalid.value.status) == ("validation_error", 422)
    assert [f["field"] for f in invalid.value.fields] == ["currency"]

    with pytest.raises(ValidationError) as too_much:
        tally.track_refund(transaction_id="in_dup", refund_id="re_1", amount=1001)
    assert (too_much.value.code, too_much.value.details["remaining"]) == ("refund_exceeds_sale", 1000)


def test_sync_rotation_warning_then_refusal_after_deadline(tally: Tally, live_world: World) -> None:
    deadline = (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0)
    flag_rotation(live_world, deadline)
    with pytest.warns(ApiKeyRotationWarning, match="regenerate it"):
        result = tally.track_sale(customer_external_id="u1", amount=1000, invoice_id="in_rot_1")
    assert result.rotation_flagged is True and result.rotation_deadline == deadline
    codes = [w["code"] for w in result.warnings]
    assert codes == ["api_key_rotation_required", "customer_not_attributed"]

    flag_rotation(live_world, datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(ApiKeyRotationRequired) as refused:  # no warning: the key no longer works
        tally.track_sale(customer_external_id="u1", amount=1000, invoice_id="in_rot_2")
    assert refused.value.status == 401 and refused.value.deadline is not None


def test_sync_renewal_helper_tracks_once_then_skips(tally: Tally, live_world: World) -> None:
    click_and_lead(live_world, "user_renew")
    decision = handle_invoice_paid(renewal_event("user_renew"), tally)
    assert (decision.action, decision.code) == ("tracked", "tracked")
    assert decision.result is not None
    assert decision.result.data["transaction_id"] == RENEWAL_INVOICE
    assert (decision.result.data["amount"], decision.result.data["partner_code"]) == (2900, "alice")
    assert decision.sale is not None and decision.sale["subscription_id"] == "sub_JsuPyCPhXWfZar"
    assert decision.sale["is_recurring"] is True and decision.sale["sale_type"] == "subscription"
    again = handle_invoice_paid(renewal_event("user_renew"), tally)
    assert (again.action, again.code, again.result) == ("skipped", "already_tracked", None)
    free = handle_invoice_paid(renewal_event("user_renew", amount=0), tally)
    assert (free.action, free.code) == ("skipped", "nothing_paid")


# -- async client, in-process app ---------------------------------------------------------------------
def run_async(client: TestClient, api_key: str, work: Callable[[AsyncTally], Awaitable[T]]) -> T:
    """Run `work` with an AsyncTally wired into the app that `client` started (lifespan included)."""

    async def main() -> T:
        transport = httpx.ASGITransport(app=client.app)
        async with AsyncTally(
            base_url="http://testserver", api_key=api_key, transport=transport, retry=NO_RETRY
        ) as tally:
            return await work(tally)

    return asyncio.run(main())


def test_async_happy_path_and_typed_errors(world: World) -> None:
    click_and_lead(world, "user_a")

    async def work(tally: AsyncTally) -> list[Any]:
        sale = await tally.track_sale(customer_external_id="user_a", amount=2500, invoice_id="in_async_1")
        outcomes: list[Any] = [sale]
        for call in (
            tally.track_sale(customer_external_id="user_a", amount=2500, invoice_id="in_async_1"),
            tally.track_sale(customer_external_id="user_a", amount=2500, invoice_id="in_x", currency="euro"),
        ):
            try:
                outcomes.append(await call)
            except TallyAPIError as exc:  # collected and asserted below
                outcomes.append(exc)
        return outcomes

    sale, dup, invalid = run_async(world.client, world.api_key, work)
    assert (sale.data["transaction_id"], sale.data["partner_code"], sale.data["attributed"]) == (
        "in_async_1",
        "alice",
        True,
    )
    assert isinstance(dup, DuplicateError) and dup.code == "duplicate_transaction"
    assert isinstance(invalid, ValidationError) and [f["field"] for f in invalid.fields] == ["currency"]

    async def wrong_key(tally: AsyncTally) -> Any:
        return await tally.track_test_sale()

    with pytest.raises(AuthenticationError) as auth:
        run_async(world.client, "aff_" + "y" * 40, wrong_key)
    assert (auth.value.code, auth.value.status) == ("invalid_api_key", 401)


def test_async_rotation_warning(world: World) -> None:
    deadline = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    flag_rotation(world, deadline)

    async def work(tally: AsyncTally) -> Any:
        return await tally.track_test_sale()

    with pytest.warns(ApiKeyRotationWarning):
        result = run_async(world.client, world.api_key, work)
    assert result.data["test_mode"] is True
    assert (result.rotation_flagged, result.rotation_deadline) == (True, deadline)


def test_async_renewal_helper_tracks_once_then_skips(world: World) -> None:
    async def work(tally: AsyncTally) -> tuple[Any, Any]:
        first = await handle_invoice_paid_async(renewal_event("user_r"), tally)
        again = await handle_invoice_paid_async(renewal_event("user_r"), tally)
        return first, again

    first, again = run_async(world.client, world.api_key, work)
    assert (first.action, first.result.data["transaction_id"]) == ("tracked", RENEWAL_INVOICE)
    assert first.result.data["attributed"] is False  # no lead for user_r: recorded, with a warning
    assert [w["code"] for w in first.result.warnings] == ["customer_not_attributed"]
    assert (again.action, again.code) == ("skipped", "already_tracked")
