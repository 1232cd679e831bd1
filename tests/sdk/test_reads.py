"""The SDK's reads against a live `tally serve`: sales, commissions, payouts, partners and programs
as iterators that follow the API's pages, typed like the track calls, in both clients; filters,
page sizes at and around the row count, the credentials a read takes, and the raw answer on
errors; one partner with their balances, and their statement (CONTRACT 15) through a batch paid,
a row failed and a batch cancelled. Requests are counted by a transport that wraps httpx's own
(real HTTP to the server)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import pytest

from tally_sdk import (
    AsyncTally,
    CommissionRow,
    ConfigurationError,
    NotFoundError,
    Page,
    PartnerData,
    PayoutBatch,
    PermissionDeniedError,
    ProgramData,
    RetryPolicy,
    SaleRow,
    Statement,
    Tally,
    TrackResult,
    ValidationError,
)
from tests.conftest import OP, LiveServer, World, make_world
from tests.helpers import payee
from tests.sdk.helpers import check_shape

NO_RETRY = RetryPolicy(max_retries=0)
SALES = 5


class Counting(httpx.HTTPTransport):
    """httpx's own transport (real HTTP), recording each request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return super().handle_request(request)


class AsyncCounting(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await super().handle_async_request(request)


@pytest.fixture(scope="module")
def books(live_server: LiveServer) -> Iterator[World]:
    """A program (no holding period) with a partner, five attributed sales in January 2026 and
    one unattributed in February, reconciled, and a payout batch up to January's end."""
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        yield _books(live_server, http)


def _books(live_server: LiveServer, http: httpx.Client) -> World:
    world = make_world(http, holding_days=0)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
    click = http.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    lead = {"customer_external_id": "buyer", "click_id": click.json()["data"]["click_id"]}
    assert http.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    with Tally(base_url=live_server.url, api_key=world.api_key) as tally:
        for n in range(SALES):
            at = datetime(2026, 1, 10 + n, 12, tzinfo=UTC)
            tally.track_sale(
                customer_external_id="buyer", amount=1000 * (n + 1), invoice_id=f"in_{n}", occurred_at=at
            )
        tally.track_sale(
            customer_external_id="nobody", amount=700, invoice_id="in_feb", occurred_at="2026-02-03T00:00:00Z"
        )
    assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    payee(world)  # a batch pays only partners with payout details
    r = http.post(
        f"/api/v1/programs/{world.program_id}/payouts", json={"up_to": "2026-01-31"}, headers=world.owner
    )
    assert r.status_code == 201, r.text
    return world


@pytest.fixture
def reads(live_server: LiveServer, books: World) -> Iterator[tuple[Tally, Counting]]:
    transport = Counting()
    with Tally(
        base_url=live_server.url, account_token=books.account_token, transport=transport, retry=NO_RETRY
    ) as tally:
        yield tally, transport


def queries(transport: Counting) -> list[dict[str, str]]:
    return [dict(r.url.params) for r in transport.requests]


@pytest.mark.parametrize("page_size", [1, 2, 5, 6, 1000])
def test_sales_follow_the_pages_in_order(reads: tuple[Tally, Counting], books: World, page_size: int) -> None:
    tally, transport = reads
    sales = list(tally.list_sales(books.program_id, page_size=page_size))
    assert [s["transaction_id"] for s in sales] == [f"in_{n}" for n in range(SALES)] + ["in_feb"]
    for sale in sales:
        check_shape(sale, SaleRow)
    pages = -(-(SALES + 1) // page_size) + (
        1 if (SALES + 1) % page_size == 0 else 0
    )  # a full last page asks once more
    offsets = [str(n * page_size) for n in range(pages)]
    assert queries(transport) == [{"limit": str(page_size), "offset": o} for o in offsets]
    assert {r.headers["authorization"] for r in transport.requests} == {f"Bearer {books.account_token}"}
    assert len({r.headers["x-request-id"] for r in transport.requests}) == pages  # one id per page


def test_pages_say_where_the_next_one_starts(reads: tuple[Tally, Counting], books: World) -> None:
    tally, transport = reads
    pager = tally.list_sales(books.program_id, page_size=4)
    assert transport.requests == []  # nothing is sent before a row is asked for
    pages = list(pager.pages())
    assert [(p.offset, p.next_offset, p.has_more, len(p.data)) for p in pages] == [
        (0, 4, True, 4),
        (4, None, False, 2),
    ]
    first = pages[0]
    assert isinstance(first, Page) and first.status == 200 and first.attempts == 1
    assert first.request_id == transport.requests[0].headers["x-request-id"]
    assert first.headers["content-type"].startswith("application/json")


def test_sales_filters(reads: tuple[Tally, Counting], books: World) -> None:
    tally, transport = reads
    pid = books.program_id

    def ids(**kw: Any) -> list[str | None]:
        return [s["transaction_id"] for s in tally.list_sales(pid, **kw)]

    assert ids(transaction_id="in_3") == ["in_3"]
    assert ids(attributed=False) == ["in_feb"]
    assert ids(start=date(2026, 1, 12), end=date(2026, 1, 13)) == ["in_2", "in_3"]  # `end`'s day included
    assert ids(start=datetime(2026, 1, 14, 12, tzinfo=UTC), end="2026-02-28") == ["in_4", "in_feb"]
    assert queries(transport)[2:4] == [
        {"from": "2026-01-12", "to": "2026-01-13", "limit": "100", "offset": "0"},
        {"from": "2026-01-14T12:00:00Z", "to": "2026-02-28", "limit": "100", "offset": "0"},
    ]


def test_commissions_paged_and_by_month(reads: tuple[Tally, Counting], books: World) -> None:
    tally, _ = reads
    lines = list(tally.list_commissions(books.program_id, page_size=2))
    assert [line["transaction_id"] for line in lines] == [f"in_{n}" for n in range(SALES)]
    assert [line["amount"] for line in lines] == [300 * (n + 1) for n in range(SALES)]  # 30 %
    for line in lines:
        check_shape(line, CommissionRow)
    assert {line["status"] for line in lines} == {"approved"}
    january = list(tally.list_commissions(books.program_id, period=date(2026, 1, 31)))
    assert january == lines
    assert list(tally.list_commissions(books.program_id, period="2026-02")) == []


def test_payouts_partners_and_programs(reads: tuple[Tally, Counting], books: World) -> None:
    tally, transport = reads
    (batch,) = tally.list_payouts(books.program_id)
    check_shape(batch, PayoutBatch)
    assert (batch["up_to"], batch["status"], batch["lines"]) == ("2026-01-31", "open", SALES)
    assert [(row["partner_code"], row["amount"]) for row in batch["rows"]] == [("alice", 300 * 15)]
    (partner,) = tally.list_partners(books.program_id)
    check_shape(partner, PartnerData)
    assert (partner["code"], partner["email"]) == ("alice", "alice@partner.test")
    (program,) = tally.list_programs()
    check_shape(program, ProgramData)
    assert program["program_id"] == books.program_id and program["holding_days"] == 0
    assert books.api_key[-4:] == program["api_token_masked"][-4:] and books.api_key not in str(program)
    assert [r.url.params.get("limit") for r in transport.requests] == [None, None, None]  # one answer each


def test_read_errors_carry_the_raw_answer(
    reads: tuple[Tally, Counting], live_server: LiveServer, books: World
) -> None:
    tally, _ = reads
    with pytest.raises(NotFoundError) as missing:
        list(tally.list_sales("prog_nope"))
    error = missing.value
    assert (error.code, error.status) == ("program_not_found", 404)
    assert error.headers["x-request-id"] == error.request_id
    assert error.json_body["error"]["code"] == "program_not_found"
    assert '"program_not_found"' in (error.body or "")
    assert error.response is not None and error.response.status_code == 404

    with httpx.Client(base_url=live_server.url, timeout=10) as http:
        member = _member_token(http, books)
    with Tally(base_url=live_server.url, account_token=member, retry=NO_RETRY) as as_member:
        assert [
            s["transaction_id"] for s in as_member.list_sales(books.program_id, transaction_id="in_0")
        ] == ["in_0"]
        with pytest.raises(PermissionDeniedError) as refused:
            list(as_member.list_payouts(books.program_id))
    assert (refused.value.code, refused.value.status) == ("owner_required", 403)
    assert refused.value.json_body["error"]["message"] == refused.value.message


def _member_token(http: httpx.Client, books: World) -> str:
    r = http.post(
        f"/api/v1/workspaces/{books.workspace_id}/members",
        json={"email": "finance@brand.test", "role": "member"},
        headers=books.owner,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["token"])


def test_each_call_takes_its_own_credential(live_server: LiveServer, books: World) -> None:
    transport = Counting()
    with Tally(
        base_url=live_server.url, api_key=books.api_key, transport=transport, retry=NO_RETRY
    ) as key_only:
        with pytest.raises(ConfigurationError, match="TALLY_ACCOUNT_TOKEN"):
            list(key_only.list_partners(books.program_id))
        assert key_only.track_test_sale().data["test_mode"] is True
    with Tally(
        base_url=live_server.url, account_token=books.account_token, transport=transport
    ) as token_only:
        with pytest.raises(ConfigurationError, match="SERVICE_API_KEY"):
            token_only.track_test_sale()
        assert len(list(token_only.list_partners(books.program_id))) == 1
    assert [r.headers["authorization"] for r in transport.requests] == [
        f"Bearer {books.api_key}",
        f"Bearer {books.account_token}",
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"page_size": 0}, "page_size"),
        ({"page_size": 1001}, "page_size"),
        ({"page_size": True}, "page_size"),
        ({"start": datetime(2026, 1, 1)}, "start"),  # noqa: DTZ001  (naive: refused)
        ({"transaction_id": " "}, "transaction_id"),
        ({"attributed": "yes"}, "attributed"),
    ],
)
def test_arguments_are_checked_before_sending(
    reads: tuple[Tally, Counting], books: World, kwargs: dict[str, Any], field: str
) -> None:
    tally, transport = reads
    with pytest.raises(ValidationError) as info:
        tally.list_sales(books.program_id, **kwargs)
    assert info.value.status is None and [f["field"] for f in info.value.fields] == [field]
    with pytest.raises(ValidationError):
        tally.list_commissions("")
    assert transport.requests == []


def test_the_server_refuses_a_malformed_period_as_a_validation_error(
    reads: tuple[Tally, Counting], books: World
) -> None:
    tally, _ = reads
    with pytest.raises(ValidationError) as info:
        list(tally.list_commissions(books.program_id, period="2026-13"))
    assert info.value.status == 422 and [f["field"] for f in info.value.fields] == ["period"]


def test_async_reads_match_the_sync_ones(live_server: LiveServer, books: World) -> None:
    transport = AsyncCounting()

    async def run() -> tuple[list[SaleRow], list[Page[SaleRow]], list[CommissionRow], list[PartnerData]]:
        async with AsyncTally(
            base_url=live_server.url, account_token=books.account_token, transport=transport, retry=NO_RETRY
        ) as tally:
            sales = [sale async for sale in tally.list_sales(books.program_id, page_size=4)]
            pages = [page async for page in tally.list_sales(books.program_id, page_size=3).pages()]
            lines = [line async for line in tally.list_commissions(books.program_id, period="2026-01")]
            partners = [p async for p in tally.list_partners(books.program_id)]
            return sales, pages, lines, partners

    sales, pages, lines, partners = asyncio.run(run())
    with Tally(base_url=live_server.url, account_token=books.account_token) as sync:
        assert sales == list(sync.list_sales(books.program_id))
        assert lines == list(sync.list_commissions(books.program_id, period="2026-01"))
        assert partners == list(sync.list_partners(books.program_id))
    assert [(p.offset, p.next_offset) for p in pages] == [(0, 3), (3, 6), (6, None)]
    assert len(transport.requests) == 2 + 3 + 1 + 1


# -- one partner, and their statement (CONTRACT 15) ---------------------------------------------------
def test_a_partner_with_balances_and_the_statement(reads: tuple[Tally, Counting], books: World) -> None:
    """alice's five approved lines (300 to 1,500) are in the open batch: owed still (only a paid
    batch pays), so the statement is five commissions and the balance their sum."""
    tally, transport = reads
    found = tally.get_partner(books.program_id, "alice")
    assert isinstance(found, TrackResult) and found.status == 200
    check_shape(found.data, PartnerData)
    assert (found.data["code"], found.data["payout_method"], found.data["payout_email"]) == (
        "alice",
        "paypal",
        "alice@paypal.test",
    )
    owed = {"currency": "usd", "approved_unpaid": 4_500, "pending": 0, "held": 0}
    assert found.data["balances"] == [owed]
    (listed,) = tally.list_partners(books.program_id)
    assert listed["balances"] == [owed]

    statement = tally.get_statement(books.program_id, "alice", currency="USD").data
    check_shape(statement, Statement)
    assert (statement["partner_code"], statement["currency"], statement["from"], statement["to"]) == (
        "alice",
        "usd",
        None,
        None,
    )
    entries = statement["entries"]  # in the order their bookings were logged
    assert sorted((e["transaction_id"], e["kind"], e["amount"]) for e in entries) == [
        (f"in_{n}", "commission", 300 * (n + 1)) for n in range(SALES)
    ]
    assert [e["balance"] for e in entries] == list(itertools.accumulate(e["amount"] for e in entries))
    assert (statement["opening_balance"], statement["closing_balance"]) == (0, 4_500)
    assert (
        tally.get_statement(books.program_id, "alice").data == statement
    )  # one currency: no need to name it

    # `start` / `end` bound the entries by when they were booked (today, on the server's clock)
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    later = tally.get_statement(books.program_id, "alice", start=tomorrow).data
    assert (later["opening_balance"], later["entries"], later["closing_balance"]) == (4_500, [], 4_500)
    before = tally.get_statement(books.program_id, "alice", end=date(2020, 1, 31)).data
    assert (before["opening_balance"], before["entries"], before["closing_balance"]) == (0, [], 0)
    assert queries(transport)[:2] == [{}, {}] and queries(transport)[2:] == [
        {"currency": "usd"},
        {},
        {"from": tomorrow.isoformat().replace("+00:00", "Z")},
        {"to": "2020-01-31"},
    ]
    paths = [r.url.path for r in transport.requests]
    assert paths[0] == f"/api/v1/programs/{books.program_id}/partners/alice"
    assert paths[2] == f"/api/v1/programs/{books.program_id}/partners/alice/statement"


def test_partner_and_statement_refusals(
    reads: tuple[Tally, Counting], live_server: LiveServer, books: World
) -> None:
    tally, transport = reads
    with pytest.raises(NotFoundError) as missing:
        tally.get_partner(books.program_id, "nobody")
    assert (missing.value.code, missing.value.status) == ("partner_not_found", 404)
    with pytest.raises(NotFoundError) as missing:
        tally.get_statement(books.program_id, "nobody")
    assert missing.value.code == "partner_not_found"
    sent = len(transport.requests)
    for bad in ({"currency": "us"}, {"currency": "u$d"}, {"start": datetime(2026, 1, 1)}):  # noqa: DTZ001
        with pytest.raises(ValidationError) as info:
            tally.get_statement(books.program_id, "alice", **bad)
        assert info.value.status is None and [f["field"] for f in info.value.fields] == [next(iter(bad))]
    with pytest.raises(ValidationError):
        tally.get_partner(books.program_id, " ")
    assert len(transport.requests) == sent  # refused before sending
    with pytest.raises(ValidationError) as info:
        tally.get_statement(books.program_id, "alice", end="2026-13-01")
    assert info.value.status == 422 and [f["field"] for f in info.value.fields] == ["to"]
    # a member reads partners and statements (payouts are an owner's)
    with httpx.Client(base_url=live_server.url, timeout=10) as http:
        member = _member_token(http, books)
    with Tally(base_url=live_server.url, account_token=member, retry=NO_RETRY) as as_member:
        assert as_member.get_statement(books.program_id, "alice").data["closing_balance"] == 4_500
        assert (
            as_member.get_partner(books.program_id, "alice").data["balances"][0]["approved_unpaid"] == 4_500
        )


@pytest.fixture(scope="module")
def paid_books(live_server: LiveServer) -> Iterator[World]:
    """Another program (no holding period): alice's sale of 20.00 (6.00 commission) and a manual
    bonus of 25.00; a batch paying her 31.00, marked paid, whose row then failed; a second batch
    for the same 31.00, cancelled."""
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        world = make_world(http, holding_days=0)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
        payee(world)
        pid, owner = world.program_id, world.owner
        click = http.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"})
        lead = {"customer_external_id": "buyer", "click_id": click.json()["data"]["click_id"]}
        assert http.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
        sale = {"customer_external_id": "buyer", "amount": 2_000, "transaction_id": "in_paid"}
        assert http.post("/api/v1/track/sale", json=sale, headers=world.key).status_code == 200
        assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        bonus = {"amount": 2_500, "currency": "usd", "reason": "launch bonus"}
        r = http.post(f"/api/v1/programs/{pid}/partners/alice/adjustments", json=bonus, headers=owner)
        assert r.status_code == 201, r.text
        up_to = datetime.now(UTC).date().isoformat()
        r = http.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": up_to}, headers=owner)
        assert r.status_code == 201, r.text
        paid = r.json()["data"]["payout_id"]
        assert http.post(f"/api/v1/programs/{pid}/payouts/{paid}/paid", headers=owner).status_code == 200
        r = http.post(
            f"/api/v1/programs/{pid}/payouts/{paid}/rows/alice/usd/failed",
            json={"reason": "PayPal returned it"},
            headers=owner,
        )
        assert r.status_code == 200, r.text
        r = http.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": up_to}, headers=owner)
        assert r.status_code == 201, r.text
        again = r.json()["data"]["payout_id"]
        r = http.post(
            f"/api/v1/programs/{pid}/payouts/{again}/cancel", json={"reason": "made twice"}, headers=owner
        )
        assert r.status_code == 200, r.text
        yield world


def test_a_statement_through_a_payment_that_failed(live_server: LiveServer, paid_books: World) -> None:
    with Tally(base_url=live_server.url, account_token=paid_books.account_token, retry=NO_RETRY) as tally:
        statement = tally.get_statement(paid_books.program_id, "alice").data
        (cancelled, paid) = tally.list_payouts(paid_books.program_id)
        partner = tally.get_partner(paid_books.program_id, "alice").data
    check_shape(statement, Statement)
    entries = statement["entries"]
    assert [(e["kind"], e["amount"], e["balance"]) for e in entries] == [
        ("commission", 600, 600),
        ("manual", 2_500, 3_100),
        ("payout", -3_100, 0),
        ("payout_failed", 3_100, 3_100),
    ]
    assert (entries[1]["reason"], entries[1]["payout_id"]) == ("launch bonus", None)
    assert [e["payout_id"] for e in entries[2:]] == [paid["payout_id"]] * 2
    assert entries[3]["reason"] == "PayPal returned it"
    assert statement["closing_balance"] == 3_100 == partner["balances"][0]["approved_unpaid"]
    for batch in (cancelled, paid):
        check_shape(batch, PayoutBatch)
    assert (paid["status"], paid["snapshot"], paid["program_name"]) == ("paid", True, "Brand partners")
    (row,) = paid["rows"]
    assert (row["outcome"], row["payout_method"], row["payout_email"], row["amount"]) == (
        "failed",
        "paypal",
        "alice@paypal.test",
        3_100,
    )
    assert row["failure"] is not None and row["failure"]["reason"] == "PayPal returned it"
    assert paid["totals"] == []  # a failed row pays nothing
    assert (cancelled["status"], cancelled["cancel_reason"], cancelled["cancelled_by"]) == (
        "cancelled",
        "made twice",
        paid["created_by"],
    )
    assert [r["outcome"] for r in cancelled["rows"]] == ["cancelled"]


def test_async_partner_and_statement_match_the_sync_ones(live_server: LiveServer, paid_books: World) -> None:
    transport = AsyncCounting()
    pid = paid_books.program_id

    async def run() -> tuple[PartnerData, Statement, Statement]:
        async with AsyncTally(
            base_url=live_server.url,
            account_token=paid_books.account_token,
            transport=transport,
            retry=NO_RETRY,
        ) as tally:
            partner = (await tally.get_partner(pid, "alice")).data
            statement = (await tally.get_statement(pid, "alice", currency="usd")).data
            bounded = (await tally.get_statement(pid, "alice", end=date(2020, 1, 1))).data
            with pytest.raises(NotFoundError):
                await tally.get_statement(pid, "nobody")
            return partner, statement, bounded

    partner, statement, bounded = asyncio.run(run())
    with Tally(base_url=live_server.url, account_token=paid_books.account_token) as sync:
        assert partner == sync.get_partner(pid, "alice").data
        assert statement == sync.get_statement(pid, "alice", currency="usd").data
    assert (bounded["entries"], bounded["closing_balance"]) == ([], 0)
    assert [dict(r.url.params) for r in transport.requests] == [
        {},
        {"currency": "usd"},
        {"to": "2020-01-01"},
        {},
    ]
