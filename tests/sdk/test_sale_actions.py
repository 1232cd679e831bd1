"""The SDK explains, holds, releases and voids any sale id the ingest accepts (issue 48 item 1),
against a live `tally serve` over real HTTP, in both clients: ids holding `/`, `..`, `%`, `?`,
`#`, a space and a non-ASCII letter travel as one encoded path segment, so each call reaches the
sale it names and only it: the other sales' lines and the open payout batch an id spells a path
to stay as they were."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tally_sdk import (
    AsyncTally,
    ConflictError,
    NotFoundError,
    RetryPolicy,
    SaleExplanation,
    SaleLines,
    Tally,
    TrackResult,
    ValidationError,
)
from tests.conftest import OP, LiveServer, make_world
from tests.helpers import payee
from tests.sdk.helpers import check_shape

NO_RETRY = RetryPolicy(max_retries=0)
PLAIN = "in_plain"  # a January sale: in the open batch, never acted on


def hostile_ids(payout_id: str) -> list[str]:
    return ["a/b", f"x/../../payouts/{payout_id}/paid", "100%", "q?x#y", "é space"]


class Books:
    """A program (no holding period) whose partner has a January sale in an open payout batch and
    a February sale under each hostile id, reconciled."""

    def __init__(self, live_server: LiveServer, http: httpx.Client) -> None:
        self.http = http
        self.world = world = make_world(http, holding_days=0)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
        click = http.post(
            "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
        )
        lead = {"customer_external_id": "buyer", "click_id": click.json()["data"]["click_id"]}
        assert http.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
        with Tally(base_url=live_server.url, api_key=world.api_key) as tally:
            at = datetime(2026, 1, 10, tzinfo=UTC)
            tally.track_sale(customer_external_id="buyer", amount=1000, invoice_id=PLAIN, occurred_at=at)
            self.reconcile()
            payee(world)
            r = http.post(f"{self.program}/payouts", json={"up_to": "2026-01-31"}, headers=world.owner)
            assert r.status_code == 201, r.text
            self.payout_id = str(r.json()["data"]["payout_id"])
            self.ids = hostile_ids(self.payout_id)
            for n, transaction_id in enumerate(self.ids):
                at = datetime(2026, 2, 1 + n, tzinfo=UTC)
                tally.track_sale(
                    customer_external_id="buyer", amount=2000, invoice_id=transaction_id, occurred_at=at
                )
        self.reconcile()

    @property
    def program(self) -> str:
        return f"/api/v1/programs/{self.world.program_id}"

    def reconcile(self) -> None:
        assert self.http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200

    def statuses(self) -> dict[str, str]:
        """Each sale's commission status, by transaction id (the raw API, not the SDK)."""
        r = self.http.get(f"{self.program}/commissions", params={"limit": 1000}, headers=self.world.owner)
        assert r.status_code == 200, r.text
        return {line["transaction_id"]: line["status"] for line in r.json()["data"]}

    def batch(self) -> tuple[str, int]:
        r = self.http.get(f"{self.program}/payouts/{self.payout_id}", headers=self.world.owner)
        assert r.status_code == 200, r.text
        return r.json()["data"]["status"], r.json()["data"]["lines"]


@pytest.fixture
def books(live_server: LiveServer) -> Iterator[Books]:
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        yield Books(live_server, http)


Step = Callable[[str], TrackResult[Any]]


def act_on_each(books: Books, explain: Step, hold: Step, release: Step, void: Step) -> None:
    """Explain, hold, release and void each hostile id in turn; after each call only that sale's
    lines differ from before, and the batch stays open with its one line."""
    expected = books.statuses()
    assert expected == {PLAIN: "approved", **dict.fromkeys(books.ids, "approved")}
    assert books.batch() == ("open", 1)
    for transaction_id in books.ids:
        explained = explain(transaction_id)
        check_shape(explained.data, SaleExplanation)
        sale = explained.data["sale"]
        assert (sale["transaction_id"], sale["partner_code"], sale["amount"]) == (
            transaction_id,
            "alice",
            2000,
        )
        assert [(line["kind"], line["status"]) for line in explained.data["lines"]] == [
            ("commission", "approved")
        ]
        for step, status in ((hold, "held"), (release, "approved"), (void, "void")):
            result = step(transaction_id)
            check_shape(result.data, SaleLines)
            assert result.data["transaction_id"] == transaction_id
            assert [(line["transaction_id"], line["status"]) for line in result.data["lines"]] == [
                (transaction_id, status)
            ]
            expected[transaction_id] = status
            assert books.statuses() == expected, f"{step.__name__} {transaction_id!r} changed another sale"
            assert books.batch() == ("open", 1)
        (line,) = explain(transaction_id).data["lines"]
        assert (line["status"], line["status_reason"]) == ("void", f"void {transaction_id}")
    assert books.statuses() == {PLAIN: "approved", **dict.fromkeys(books.ids, "void")}


def test_sync_client_explains_holds_releases_and_voids_any_id(live_server: LiveServer, books: Books) -> None:
    pid = books.world.program_id
    with Tally(base_url=live_server.url, account_token=books.world.account_token, retry=NO_RETRY) as tally:

        def explain(tid: str) -> TrackResult[SaleExplanation]:
            return tally.explain_sale(pid, tid)

        def hold(tid: str) -> TrackResult[SaleLines]:
            return tally.hold_sale(pid, tid, reason=f"hold {tid}")

        def release(tid: str) -> TrackResult[SaleLines]:
            return tally.release_sale(pid, tid, reason=f"release {tid}")

        def void(tid: str) -> TrackResult[SaleLines]:
            return tally.void_sale(pid, tid, reason=f"void {tid}")

        act_on_each(books, explain, hold, release, void)


def test_async_client_explains_holds_releases_and_voids_any_id(live_server: LiveServer, books: Books) -> None:
    pid = books.world.program_id
    tally = AsyncTally(base_url=live_server.url, account_token=books.world.account_token, retry=NO_RETRY)
    loop = asyncio.new_event_loop()

    def run(call: Any) -> Any:
        return loop.run_until_complete(call)

    def explain(tid: str) -> TrackResult[SaleExplanation]:
        return run(tally.explain_sale(pid, tid))  # type: ignore[no-any-return]

    def hold(tid: str) -> TrackResult[SaleLines]:
        return run(tally.hold_sale(pid, tid, reason=f"hold {tid}"))  # type: ignore[no-any-return]

    def release(tid: str) -> TrackResult[SaleLines]:
        return run(tally.release_sale(pid, tid, reason=f"release {tid}"))  # type: ignore[no-any-return]

    def void(tid: str) -> TrackResult[SaleLines]:
        return run(tally.void_sale(pid, tid, reason=f"void {tid}"))  # type: ignore[no-any-return]

    try:
        act_on_each(books, explain, hold, release, void)
    finally:
        run(tally.aclose())
        loop.close()


def test_each_id_is_one_encoded_path_segment(live_server: LiveServer, books: Books) -> None:
    """What goes on the wire: the id quoted with `safe=''`, so no `/`, `?`, `#` or `..` segment
    of it is path or query syntax; and the refusals a caller can meet."""
    requests: list[httpx.Request] = []
    pid = books.world.program_id

    class Recording(httpx.HTTPTransport):  # httpx's own (real HTTP), closed with the client
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            requests.append(request)
            return super().handle_request(request)

    with Tally(
        base_url=live_server.url,
        account_token=books.world.account_token,
        transport=Recording(),
        retry=NO_RETRY,
    ) as tally:
        for transaction_id in books.ids:
            tally.explain_sale(pid, transaction_id)
        tally.hold_sale(pid, "q?x#y", reason="dispute")
        with pytest.raises(ConflictError) as twice:
            tally.hold_sale(pid, "q?x#y", reason="dispute")
        assert twice.value.code == "invalid_transition"
        with pytest.raises(ConflictError) as batched:
            tally.void_sale(pid, PLAIN, reason="in the batch")
        assert batched.value.code == "line_in_batch"
        with pytest.raises(NotFoundError) as missing:
            tally.explain_sale(pid, "a")  # `a/b`'s first segment is no sale of its own
        assert (missing.value.code, missing.value.details["recorded"]) == ("sale_not_found", False)
        sent = len(requests)
        with pytest.raises(ValidationError) as blank:
            tally.void_sale(pid, "a/b", reason=" ")
        assert blank.value.status is None and [f["field"] for f in blank.value.fields] == ["reason"]
        with pytest.raises(ValidationError):
            tally.explain_sale(pid, "")
        assert len(requests) == sent  # refused before sending
    paths = [r.url.raw_path.decode() for r in requests[:5]]
    program = f"/api/v1/programs/{pid}/sales/"
    assert paths == [
        f"{program}a%2Fb/explain",
        f"{program}x%2F..%2F..%2Fpayouts%2F{books.payout_id}%2Fpaid/explain",
        f"{program}100%25/explain",
        f"{program}q%3Fx%23y/explain",
        f"{program}%C3%A9%20space/explain",
    ]
    assert requests[5].url.raw_path.decode() == f"/api/v1/programs/{pid}/commissions/q%3Fx%23y/hold"
    assert requests[5].headers["authorization"] == f"Bearer {books.world.account_token}"
    assert books.batch() == ("open", 1)
