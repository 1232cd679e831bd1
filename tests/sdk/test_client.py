"""sdk.client: request shapes, settings and client-side validation, against the real app.

Each request the SDK builds is recorded by `RealApp` and answered by the in-process tally, so a
shape the server does not accept fails here; requests refused before sending never reach it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from tally_sdk import AsyncTally, ConfigurationError, Tally, TrackResult, ValidationError
from tests.conftest import World, make_world
from tests.sdk.helpers import APP_URL, RealApp, real_async_client, real_client, settled_lead


def test_track_sale_sends_documented_camelcase_shape(world: World) -> None:
    click_id = settled_lead(world, "user_42")
    app = RealApp(world)
    result = real_client(app).track_sale(
        customer_external_id="user_42",
        amount=4900,
        invoice_id="in_1",
        currency="EUR",
        is_recurring=True,
        sale_type="subscription",
        subscription_id="sub_1",
        email="a@example.com",
        click_id=click_id,
        occurred_at=datetime(2026, 11, 21, 11, 0, tzinfo=timezone(timedelta(hours=1))),
    )
    (request,) = app.requests
    assert request.method == "POST"
    assert str(request.url) == f"{APP_URL}/api/v1/track/sale"
    assert request.headers["authorization"] == f"Bearer {world.api_key}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"] == "tally-python/0.4.0"
    assert len(request.headers["x-request-id"]) == 32
    assert app.bodies[0] == {
        "customerExternalId": "user_42",
        "invoiceId": "in_1",
        "amount": 4900,
        "currency": "eur",
        "isRecurring": True,
        "saleType": "subscription",
        "subscriptionId": "sub_1",
        "email": "a@example.com",
        "click_id": click_id,
        "occurred_at": "2026-11-21T10:00:00Z",
    }
    # The server took every field: the sale is the one sent, attributed through the click.
    assert result == TrackResult(
        data={
            "sale_id": result.data["sale_id"],
            "transaction_id": "in_1",
            "test_mode": False,
            "attributed": True,
            "partner_code": "alice",
            "customer_external_id": "user_42",
            "amount": 4900,
            "currency": "eur",
        },
        request_id=request.headers["x-request-id"],
    )


def test_minimal_sale_defaults_currency_and_omits_the_rest(world: World) -> None:
    app = RealApp(world)
    result = real_client(app).track_sale(customer_external_id="user_42", amount=1, invoice_id="in_1")
    assert app.bodies == [
        {"customerExternalId": "user_42", "invoiceId": "in_1", "amount": 1, "currency": "usd"}
    ]
    assert (result.data["transaction_id"], result.data["amount"], result.data["currency"]) == (
        "in_1",
        1,
        "usd",
    )


def test_track_sale_payload_accepts_the_seed_shape(world: World) -> None:
    app = RealApp(world)
    payload = {
        "customerExternalId": "user_42",
        "amount": 2500,
        "invoiceId": "in_2",
        "currency": "usd",
        "isRecurring": False,
        "saleType": "one_time",
        "subscriptionId": None,
    }
    result = real_client(app).track_sale_payload(payload)
    assert app.bodies == [
        {
            "customerExternalId": "user_42",
            "invoiceId": "in_2",
            "amount": 2500,
            "currency": "usd",
            "isRecurring": False,
            "saleType": "one_time",
        }
    ]
    assert (result.data["transaction_id"], result.data["amount"]) == ("in_2", 2500)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"customerExternalId": "u", "amount": 1, "invoiceId": "i", "invoice_id": "x"}, "invoice_id"),
        ({"customerExternalId": "u", "amount": 1}, "invoiceId"),
        ({"amount": 1, "invoiceId": "i"}, "customerExternalId"),
        ({"customerExternalId": "u", "amount": 0, "invoiceId": "i"}, "amount"),
    ],
)
def test_track_sale_payload_refuses_bad_shapes_without_sending(
    world: World, payload: dict[str, Any], field: str
) -> None:
    app = RealApp(world)
    with pytest.raises(ValidationError) as info:
        real_client(app).track_sale_payload(payload)
    assert info.value.fields[0]["field"] == field
    assert app.requests == []


@pytest.mark.parametrize("amount", [0, -1, -4900, 1.5, 10.0, True, "100", None])
def test_non_positive_or_non_integer_amounts_rejected_before_sending(world: World, amount: Any) -> None:
    app = RealApp(world)
    tally = real_client(app)
    with pytest.raises(ValidationError) as info:
        tally.track_sale(customer_external_id="user_42", amount=amount, invoice_id="in_1")
    with pytest.raises(ValidationError):
        tally.track_refund(transaction_id="in_1", refund_id="re_1", amount=amount)
    assert app.requests == []
    error = info.value
    assert (error.code, error.status, error.request_id) == ("validation_error", None, None)
    assert error.fields[0]["field"] == "amount"
    assert "nothing was sent" in error.message


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"customer_external_id": ""}, "customer_external_id", "must be a non-empty string"),
        ({"invoice_id": "  "}, "invoice_id", "must be a non-empty string"),
        ({"is_recurring": "yes"}, "is_recurring", "must be a boolean"),
        (
            {"occurred_at": datetime(2026, 1, 1)},  # noqa: DTZ001 - naive on purpose
            "occurred_at",
            "must be an aware datetime or an RFC 3339 string",
        ),
        ({"currency": 840}, "currency", "must be a non-empty string"),
    ],
)
def test_other_invalid_arguments_rejected_before_sending(
    world: World, kwargs: dict[str, Any], field: str, message: str
) -> None:
    app = RealApp(world)
    args: dict[str, Any] = {"customer_external_id": "u", "amount": 100, "invoice_id": "in_1"}
    with pytest.raises(ValidationError) as info:
        real_client(app).track_sale(**(args | kwargs))
    assert info.value.fields == [{"field": field, "message": message}]
    assert info.value.message == f"{field} {message} (refused by the SDK, nothing was sent)"
    assert app.requests == []


def test_test_sale_sends_additional_data_alone(world: World) -> None:
    app = RealApp(world)
    result = real_client(app).track_test_sale()
    assert app.bodies == [{"additional_data": {"test_mode": True}}]
    assert str(app.requests[0].url) == f"{APP_URL}/api/v1/track/sale"
    assert result.data == {"sale_id": result.data["sale_id"], "transaction_id": None, "test_mode": True}


def test_lead_and_refund_bodies_are_snake_case(world: World) -> None:
    click_id = settled_lead(world, "someone_else")
    app = RealApp(world)
    tally = real_client(app)
    lead = tally.track_lead(customer_external_id="user_42", email="a@example.com", click_id=click_id)
    named = tally.track_lead(customer_external_id="user_43", name="Ada")
    refund = tally.track_refund(transaction_id="in_1", refund_id="re_1", amount=500, reason="requested")
    assert [str(r.url) for r in app.requests] == [
        f"{APP_URL}/api/v1/track/lead",
        f"{APP_URL}/api/v1/track/lead",
        f"{APP_URL}/api/v1/track/refund",
    ]
    assert app.bodies == [
        {"customer_external_id": "user_42", "email": "a@example.com", "click_id": click_id},
        {"customer_external_id": "user_43", "name": "Ada"},
        {"transaction_id": "in_1", "refund_id": "re_1", "amount": 500, "reason": "requested"},
    ]
    assert all(r.headers["authorization"] == f"Bearer {world.api_key}" for r in app.requests)
    assert [lead.data["customer_external_id"], named.data["customer_external_id"]] == ["user_42", "user_43"]
    assert (lead.data["status"], named.data["status"]) == ("settled", "settled")
    assert (refund.data["refund_id"], refund.data["amount"]) == ("re_1", 500)
    assert [w["code"] for w in refund.warnings] == ["sale_not_found"]  # in_1 is not known: kept


def test_settings_come_from_the_environment(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", world.api_key)
    monkeypatch.setenv("TALLY_BASE_URL", "http://brand-tally.test/prefix")
    app = RealApp(world, mount="/prefix")  # tally served under a path by the brand's proxy
    tally = Tally(transport=httpx.MockTransport(app))
    result = tally.track_sale(customer_external_id="u", amount=1, invoice_id="in_1")
    assert str(app.requests[0].url) == "http://brand-tally.test/prefix/api/v1/track/sale"
    assert app.requests[0].headers["authorization"] == f"Bearer {world.api_key}"
    assert result.data["transaction_id"] == "in_1"
    assert world.api_key not in repr(tally)
    assert repr(tally) == "Tally(base_url='http://brand-tally.test/prefix')"


def test_defaults_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVICE_API_KEY", raising=False)
    monkeypatch.delenv("TALLY_ACCOUNT_TOKEN", raising=False)
    monkeypatch.delenv("TALLY_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match=r"SERVICE_API_KEY.*TALLY_ACCOUNT_TOKEN"):
        Tally()
    with pytest.raises(ConfigurationError):
        AsyncTally()
    assert Tally(api_key="aff_x").base_url == "http://127.0.0.1:8000"
    assert Tally(account_token="acct_x").base_url == "http://127.0.0.1:8000"  # reads only
    monkeypatch.setenv("TALLY_ACCOUNT_TOKEN", "acct_env")
    assert repr(Tally()) == "Tally(base_url='http://127.0.0.1:8000')"  # never a credential


def test_explicit_arguments_win_over_environment(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", "aff_env")  # the app would refuse this key
    monkeypatch.setenv("TALLY_BASE_URL", "http://env.test")
    app = RealApp(world)
    with real_client(app) as tally:
        assert tally.track_test_sale().data["test_mode"] is True
    assert str(app.requests[0].url).startswith(APP_URL)
    assert app.requests[0].headers["authorization"] == f"Bearer {world.api_key}"


def comparable(result: TrackResult) -> tuple[Any, ...]:
    """A result without what differs between two programs: generated ids, warning messages."""
    data = {k: v for k, v in result.data.items() if k not in {"sale_id", "lead_id"}}
    return data, [w["code"] for w in result.warnings], result.status, result.attempts


def test_async_client_sends_the_same_requests(world: World) -> None:
    sync_app, async_app = RealApp(world), RealApp(make_world(world.client))  # two programs
    kwargs: dict[str, Any] = {"customer_external_id": "u", "amount": 990, "invoice_id": "in_10"}
    payload = {"customerExternalId": "u", "amount": 990, "invoiceId": "in_9"}

    async def run() -> list[TrackResult]:
        async with real_async_client(async_app) as tally:
            return [
                await tally.track_lead(customer_external_id="u"),
                await tally.track_refund(transaction_id="in_9", refund_id="re_9", amount=10),
                await tally.track_test_sale(),
                await tally.track_sale_payload(payload),
                await tally.track_sale(**kwargs),
            ]

    async_results = asyncio.run(run())
    tally = real_client(sync_app)
    sync_results = [
        tally.track_lead(customer_external_id="u"),
        tally.track_refund(transaction_id="in_9", refund_id="re_9", amount=10),
        tally.track_test_sale(),
        tally.track_sale_payload(payload),
        tally.track_sale(**kwargs),
    ]
    assert async_app.bodies == sync_app.bodies
    assert [r.url for r in async_app.requests] == [r.url for r in sync_app.requests]
    assert [comparable(r) for r in async_results] == [comparable(r) for r in sync_results]
    assert async_results[-1].data["transaction_id"] == "in_10"


def test_occurred_at_accepts_utc_and_strings(world: World) -> None:
    app = RealApp(world)
    tally = real_client(app)
    base: dict[str, Any] = {"customer_external_id": "u", "amount": 1}
    tally.track_sale(**base, invoice_id="in_1", occurred_at=datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC))
    tally.track_sale(**base, invoice_id="in_2", occurred_at="2026-02-01T00:00:00Z")
    assert [b["occurred_at"] for b in app.bodies] == [
        "2026-01-31T23:59:59Z",
        "2026-02-01T00:00:00Z",
    ]
