"""sdk per-call options, the debug logger and the raw answer, against the real app (`RealApp`):

- `timeout=` and `retry=` on any call override the client's for that call alone (a read's pages
  included);
- reads retry like the idempotent calls they are (GET), the same request id on every attempt;
- `logging.getLogger("tally_sdk")` says what was sent, what came back and each retry, and never
  a credential, a header or a body's values;
- errors and results keep the raw answer: status, headers, body, request id."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import httpx
import pytest

from ingest.domain.errors import DatabaseUnavailable, RateLimited, RequestTimeout
from tally_sdk import (
    AsyncTally,
    ConnectionFailed,
    RetryPolicy,
    ServerError,
    Tally,
    ValidationError,
)
from tests.conftest import OP, World
from tests.sdk.helpers import APP_URL, RealApp, Sleeps, outcomes, proxy, real_async_client, real_client

EMAIL = "buyer.secret@example.com"


def down() -> DatabaseUnavailable:
    return DatabaseUnavailable("the database cannot be written; nothing was acknowledged")


def reader(app: RealApp, sleeps: Sleeps | None = None, retries: int = 2) -> Tally:
    return real_client(app, sleeps, retries, account_token=app.world.account_token)


def reconciled(world: World) -> None:
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200


# -- timeout= and retry= per call ------------------------------------------------------------------
def test_a_calls_own_timeout_goes_on_its_request(world: World) -> None:
    app = RealApp(world)
    tally = reader(app)
    tally.track_lead(customer_external_id="u")
    tally.track_lead(customer_external_id="u", timeout=2.5)
    tally.track_lead(customer_external_id="u", timeout=httpx.Timeout(1.0, connect=0.25))
    list(tally.list_partners(world.program_id, timeout=4))
    assert [r.extensions["timeout"] for r in app.requests] == [
        {"connect": 10.0, "read": 10.0, "write": 10.0, "pool": 10.0},  # the client's (DEFAULT_TIMEOUT)
        {"connect": 2.5, "read": 2.5, "write": 2.5, "pool": 2.5},
        {"connect": 0.25, "read": 1.0, "write": 1.0, "pool": 1.0},
        {"connect": 4, "read": 4, "write": 4, "pool": 4},
    ]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_a_calls_own_timeout_ends_a_silent_answer(silent_port: int) -> None:
    sleeps = Sleeps()
    tally = Tally(base_url=f"http://127.0.0.1:{silent_port}", api_key="aff_x", sleep=sleeps)
    with tally, pytest.raises(ConnectionFailed) as info:
        tally.track_sale(
            customer_external_id="u",
            amount=1,
            invoice_id="in_1",
            timeout=0.2,
            retry=RetryPolicy(max_retries=1),
        )
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)
    assert sleeps == [0.5]  # retried once (the sale is idempotent), then given up
    assert info.value.after_retry is True  # the request was sent: it may have landed


def test_a_calls_own_retry_policy_wins_over_the_clients(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(down())]
    with pytest.raises(ServerError):
        reader(app, sleeps, retries=3).track_lead(customer_external_id="u", retry=RetryPolicy(max_retries=0))
    assert (len(app.requests), sleeps) == (1, [])
    app.faults = [proxy(502)] * 2  # (no `Retry-After`: the policy's own backoff)
    result = reader(app, sleeps, retries=0).track_lead(
        customer_external_id="u", retry=RetryPolicy(max_retries=2, backoff=0.1)
    )
    assert (result.attempts, sleeps) == (3, [0.1, 0.2])


def test_reads_retry_network_failures_and_5xx_with_one_request_id_per_page(world: World) -> None:
    world.sale(transaction_id="in_1")
    world.sale(transaction_id="in_2")
    reconciled(world)
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [
        app.lost(httpx.ReadTimeout("the first page's answer was lost")),  # a GET may be repeated
        app.error(down()),
        None,  # the first page
        app.lost(proxy(502)),
        app.error(RateLimited("too many requests", retry_after=2)),
    ]
    sales = list(reader(app, sleeps, retries=3).list_sales(world.program_id, page_size=2, retry=None))
    assert [s["transaction_id"] for s in sales] == ["in_1", "in_2"]
    assert sleeps == [0.5, 1.0, 0.5, 2.0]
    first, second = (
        {r.headers["x-request-id"] for r in app.requests[:3]},
        {r.headers["x-request-id"] for r in app.requests[3:]},
    )
    assert len(first) == len(second) == 1 and first != second
    assert [dict(r.url.params)["offset"] for r in app.requests] == ["0", "0", "0", "2", "2", "2"]


def test_a_408_is_retried_even_for_the_test_sale(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(RequestTimeout("the request body took too long"))]
    assert reader(app, sleeps).track_test_sale().data["test_mode"] is True  # 408: surely not processed
    assert (len(app.requests), sleeps) == (2, [0.5])
    assert [o[:3] for o in outcomes(world)] == [("track/sale", 200, "test_mode")]


# -- the logger ------------------------------------------------------------------------------------
def test_the_logger_says_what_was_sent_and_each_retry_and_never_a_secret(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.sale(transaction_id="in_log", email=EMAIL)
    reconciled(world)
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(down())]
    tally = reader(app, sleeps)
    with caplog.at_level(logging.DEBUG, logger="tally_sdk"):
        sale = tally.track_sale(customer_external_id="user_42", amount=100, invoice_id="in_9", email=EMAIL)
        rows = list(tally.list_sales(world.program_id, transaction_id="in_log"))
        with pytest.raises(ValidationError):
            tally.track_refund(transaction_id="in_9", refund_id="re_9", amount=10**13)
    assert rows[0]["transaction_id"] == "in_log"
    records = [r for r in caplog.records if r.name == "tally_sdk"]
    text = "\n".join(r.getMessage() for r in records)
    rid = sale.request_id
    assert [(r.levelname, r.getMessage()) for r in records if r.levelno == logging.INFO] == [
        (
            "INFO",
            "retrying POST /api/v1/track/sale in 1.00 s after HTTP 503"  # its `Retry-After: 1`
            f" (attempt 2 of at most 3, request {rid})",
        )
    ]
    assert (
        "POST /api/v1/track/sale (body fields: amount, currency, customerExternalId, email, invoiceId)"
        " -> 503 in" in text
    )
    assert f"(attempt 2, request {rid})" in text
    assert (
        f"GET /api/v1/programs/{world.program_id}/sales?transaction_id=in_log&limit=100&offset=0 -> 200 in"
        in text
    )
    assert "POST /api/v1/track/refund (body fields: amount, refund_id, transaction_id) -> 422 in" in text
    for secret in (world.api_key, world.account_token, world.api_key[-12:], world.account_token[-12:], EMAIL):
        assert secret not in text
        for record in records:
            assert secret not in repr(record.args) and secret not in str(record.msg)


def test_the_logger_is_silent_unless_configured() -> None:
    logger = logging.getLogger("tally_sdk")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.level == logging.NOTSET  # the application decides (logging.basicConfig, dictConfig)


# -- the raw answer --------------------------------------------------------------------------------
def test_errors_keep_the_raw_answer(world: World) -> None:
    app = RealApp(world)
    with pytest.raises(ValidationError) as info:
        real_client(app).track_sale(
            customer_external_id="u", amount=100, invoice_id="in_1", currency="dollars"
        )
    error = info.value
    assert error.response is not None and error.response.status_code == error.status == 422
    assert error.headers["x-request-id"] == error.request_id == app.requests[0].headers["x-request-id"]
    assert error.headers["content-type"].startswith("application/json")
    assert error.json_body["error"]["fields"] == error.fields
    assert error.body == error.response.text and '"validation_error"' in error.body

    app.faults = [proxy(502)] * 3
    with pytest.raises(ServerError) as behind:
        real_client(app).track_sale(customer_external_id="u", amount=100, invoice_id="in_2")
    assert behind.value.code == "http_502" and behind.value.json_body is None
    assert "<h1>502 Bad Gateway</h1>" in (behind.value.body or "")

    app.faults = [httpx.ConnectError("refused")] * 3
    with pytest.raises(ConnectionFailed) as unreached:
        real_client(app).track_sale(customer_external_id="u", amount=100, invoice_id="in_3")
    assert unreached.value.response is None and unreached.value.body is None
    assert dict(unreached.value.headers) == {} and unreached.value.json_body is None

    refused = ValidationError("validation_error", "amount must be positive")  # as the SDK raises it
    assert (refused.response, refused.body, refused.json_body, dict(refused.headers)) == (
        None,
        None,
        None,
        {},
    )


def test_results_keep_the_raw_answer(world: World) -> None:
    app = RealApp(world)
    result = real_client(app).track_lead(customer_external_id="u")
    assert result.raw_response is not None and result.raw_response.json()["data"] == result.data
    assert result.headers["x-request-id"] == result.request_id
    assert "raw_response" not in repr(result)


def test_the_async_client_takes_the_same_options(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(down())] * 2

    async def run() -> None:
        async with real_async_client(app, sleeps, retries=0) as tally:
            lead = await tally.track_lead(
                customer_external_id="u", timeout=1.5, retry=RetryPolicy(max_retries=2)
            )
            assert lead.attempts == 3
        async with AsyncTally(
            base_url=APP_URL,
            account_token=world.account_token,
            transport=httpx.MockTransport(app),
            sleep=sleeps.asleep,
        ) as reads:
            partners = [p async for p in reads.list_partners(world.program_id, timeout=3)]
            assert [p["code"] for p in partners] == ["alice"]

    asyncio.run(run())
    assert [r.extensions["timeout"]["read"] for r in app.requests] == [1.5, 1.5, 1.5, 3]
    assert sleeps == [1.0, 1.0]  # the backoff, never shorter than the 503's `Retry-After: 1`
