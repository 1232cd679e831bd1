"""sdk retries: only safe failures, bounded, with backoff; against the real app (`RealApp`).

Refusals that retries must not repeat are the app's real answers; 503 and 429 are built by the
app's own error map (without running the request, as the app does when it refuses at the door);
502/504 are a proxy's page, and network failures are raised before the request reaches the app or
after the app processed it (`lost`). The app's tracking log shows what it really processed."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ingest.domain.errors import DatabaseUnavailable, RateLimited, TallyError
from tally_sdk import (
    AuthenticationError,
    ConnectionFailed,
    DuplicateError,
    RateLimitError,
    RetryPolicy,
    ServerError,
    Tally,
    TallyAPIError,
    TrackResult,
    ValidationError,
)
from tests.conftest import World
from tests.sdk.helpers import (
    APP_URL,
    Answer,
    RealApp,
    Refusal,
    Sleeps,
    outcomes,
    proxy,
    real_async_client,
    real_client,
)

SALE = ("track/sale", 200, "accepted")
DUPLICATE = ("track/sale", 409, "duplicate_transaction")


def track(tally: Tally) -> TrackResult:
    return tally.track_sale(customer_external_id="user_42", amount=100, invoice_id="in_1")


def down() -> DatabaseUnavailable:
    return DatabaseUnavailable("the database cannot be written; nothing was acknowledged")


def processed(world: World) -> list[tuple[str, int, str]]:
    """What the app processed, without request ids."""
    return [entry[:3] for entry in outcomes(world)]


@pytest.mark.parametrize(
    ("code", "sleep"),
    [(429, 1.0), (502, 0.5), (503, 1.0), (504, 0.5)],  # the app's 429 and 503 always say Retry-After
)
def test_retryable_statuses_are_retried_then_succeed(world: World, code: int, sleep: float) -> None:
    app, sleeps = RealApp(world), Sleeps()
    refusals: dict[int, Answer] = {
        429: app.error(RateLimited("too many requests", retry_after=1)),
        503: app.error(down()),
    }
    app.faults = [refusals.get(code) or proxy(code)]
    result = track(real_client(app, sleeps))
    assert len(app.requests) == 2
    assert (result.attempts, result.status, result.data["transaction_id"]) == (2, 200, "in_1")
    assert sleeps == [sleep]
    # The same request (and request id) is sent again; the app echoes it and records the sale once.
    assert app.requests[0].headers["x-request-id"] == app.requests[1].headers["x-request-id"]
    assert app.bodies[0] == app.bodies[1]
    assert result.request_id == app.requests[0].headers["x-request-id"]
    assert outcomes(world) == [(*SALE, result.request_id)]


def internal_error() -> TallyError:
    return TallyError("internal error; request req_1 identifies it in the logs")


def test_a_500_is_retried_for_a_sale(world: World) -> None:
    """The sale is idempotent (its invoice id): a 500 is retried, and the sale is recorded once."""
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(internal_error())]
    result = track(real_client(app, sleeps))
    assert (len(app.requests), sleeps, result.attempts) == (2, [0.5], 2)
    assert processed(world) == [SALE]


def test_a_500_after_the_sale_landed_makes_the_retry_a_duplicate_after_retry(world: World) -> None:
    app = RealApp(world)

    def landed_then_500(request: httpx.Request) -> httpx.Response:
        app.forward(request)  # the sale is written, then the answer is the error map's 500
        return app.error(internal_error())(request)

    app.faults = [landed_then_500]
    with pytest.raises(DuplicateError) as info:
        track(real_client(app))
    assert info.value.after_retry is True  # a 500 may come after the write: the sale is in, once
    assert processed(world) == [SALE, DUPLICATE]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (Refusal("not_implemented", 501, "no"), 501),
        (Refusal("http_version_not_supported", 505, "no"), 505),
    ],
)
def test_server_errors_that_cannot_pass_are_not_retried(world: World, error: TallyError, status: int) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(error)]
    with pytest.raises(ServerError) as info:
        track(real_client(app, sleeps))
    assert (len(app.requests), sleeps, info.value.status) == (1, [], status)


def test_a_500_is_not_retried_for_the_test_sale(world: World) -> None:
    """The test sale has no idempotency key: after a 500 it may be in already."""
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(internal_error())]
    with pytest.raises(ServerError) as info:
        real_client(app, sleeps).track_test_sale()
    assert (len(app.requests), sleeps, info.value.status, info.value.after_retry) == (1, [], 500, False)


WRONG_KEY = "aff_" + "x" * 40


@pytest.mark.parametrize(
    ("client_args", "sale_args", "cls"),
    [
        ({"api_key": WRONG_KEY}, {}, AuthenticationError),
        ({}, {"currency": "dollars"}, ValidationError),
        ({}, {"invoice_id": "in_recorded"}, DuplicateError),
    ],
    ids=["invalid_api_key", "validation_error", "duplicate_transaction"],
)
def test_real_refusals_are_not_retried(
    world: World, client_args: dict[str, Any], sale_args: dict[str, Any], cls: type[TallyAPIError]
) -> None:
    assert world.sale(transaction_id="in_recorded").status_code == 200
    app, sleeps = RealApp(world), Sleeps()
    tally = real_client(app, sleeps, **client_args)
    with pytest.raises(cls) as info:
        tally.track_sale(**{"customer_external_id": "u", "amount": 100, "invoice_id": "in_1", **sale_args})
    assert (len(app.requests), sleeps, info.value.after_retry) == (1, [], False)


def test_retries_are_bounded_with_exponential_backoff(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(down())] * 5
    with pytest.raises(ServerError) as info:
        track(real_client(app, sleeps, retries=4))
    assert len(app.requests) == 5
    assert sleeps == [1.0, 1.0, 2.0, 4.0]  # the backoff, never shorter than the 503's `Retry-After: 1`
    assert (info.value.status, info.value.code) == (503, "database_unavailable")
    assert processed(world) == []  # refused at the door: the sale can still be sent
    assert track(real_client(app)).data["transaction_id"] == "in_1"


def test_retry_after_is_honoured(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(RateLimited("too many requests", retry_after=3))]
    track(real_client(app, sleeps))
    assert sleeps == [3.0]
    assert processed(world) == [SALE]


def test_rate_limit_exhausted_raises_with_retry_after(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [app.error(RateLimited("too many requests", retry_after=1))] * 2
    with pytest.raises(RateLimitError) as info:
        track(real_client(app, sleeps, retries=1))
    assert (len(app.requests), sleeps, info.value.retry_after) == (2, [1.0], 1.0)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("slow connect"),
        httpx.ReadTimeout("slow read"),
        httpx.ReadError("reset"),
        httpx.RemoteProtocolError("server hung up"),
    ],
)
def test_transport_errors_are_retried_for_sales(world: World, exc: Exception) -> None:
    app = RealApp(world, exc)  # the first attempt does not reach the app
    result = track(real_client(app))
    assert (result.attempts, result.data["transaction_id"]) == (2, "in_1")
    assert len(app.requests) == 2
    assert processed(world) == [SALE]


def test_transport_errors_exhausted_raise_connection_failed(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [httpx.ConnectError("refused")] * 3
    with pytest.raises(ConnectionFailed) as info:
        track(real_client(app, sleeps, retries=2))
    assert len(app.requests) == 3
    assert sleeps == [0.5, 1.0]
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert (info.value.code, info.value.status) == ("connection_error", None)


def test_configuration_transport_errors_are_not_retried() -> None:
    sleeps = Sleeps()  # httpx's own transport refuses the scheme; nothing is ever sent
    tally = Tally(base_url="ftp://tally.test", api_key=WRONG_KEY, sleep=sleeps)
    with pytest.raises(ConnectionFailed) as info:
        track(tally)
    assert isinstance(info.value.__cause__, httpx.UnsupportedProtocol)
    assert sleeps == []


@pytest.mark.parametrize(
    ("first", "after_retry"),
    [
        ("lost_read_timeout", True),
        ("lost_behind_502", True),
        ("connect_error", False),
        ("database_unavailable", False),
    ],
)
def test_duplicate_after_a_retry_says_whether_the_first_attempt_may_have_landed(
    world: World, first: str, after_retry: bool
) -> None:
    app = RealApp(world)
    faults: dict[str, Answer] = {
        "lost_read_timeout": app.lost(httpx.ReadTimeout("the answer never came back")),
        "lost_behind_502": app.lost(proxy(502)),
        "connect_error": httpx.ConnectError("never sent"),
        "database_unavailable": app.error(down()),
    }
    if not after_retry:  # the sale came in before, by another call: not this call's first attempt
        assert world.sale(transaction_id="in_1").status_code == 200
    app.faults = [faults[first]]
    with pytest.raises(DuplicateError) as info:
        track(real_client(app))
    assert info.value.after_retry is after_retry
    assert len(app.requests) == 2
    # Either way the app holds the sale once, and refused the retry as the duplicate it is.
    rid = app.requests[0].headers["x-request-id"]
    if after_retry:
        assert outcomes(world) == [(*SALE, rid), (*DUPLICATE, rid)]
    else:
        assert processed(world) == [SALE, DUPLICATE]


@pytest.mark.parametrize(
    ("failure", "requests", "cls"),
    [
        ("lost_read_timeout", 1, ConnectionFailed),
        ("lost_remote_protocol_error", 1, ConnectionFailed),
        ("lost_behind_502", 1, ServerError),
        ("lost_behind_504", 1, ServerError),
        ("connect_error", 2, None),
        ("database_unavailable", 2, None),
        ("rate_limited", 2, None),
    ],
)
def test_test_sale_is_retried_only_when_surely_not_processed(
    world: World, failure: str, requests: int, cls: type[TallyAPIError] | None
) -> None:
    app = RealApp(world)
    faults: dict[str, Answer] = {
        "lost_read_timeout": app.lost(httpx.ReadTimeout("may have landed")),
        "lost_remote_protocol_error": app.lost(httpx.RemoteProtocolError("may have landed")),
        "lost_behind_502": app.lost(proxy(502)),
        "lost_behind_504": app.lost(proxy(504)),
        "connect_error": httpx.ConnectError("never sent"),
        "database_unavailable": app.error(down()),
        "rate_limited": app.error(RateLimited("too many requests", retry_after=1)),
    }
    app.faults = [faults[failure]]
    tally = real_client(app)
    if cls is None:
        assert tally.track_test_sale().data["test_mode"] is True
    else:
        with pytest.raises(cls) as info:
            tally.track_test_sale()
        assert info.value.after_retry is False
    assert len(app.requests) == requests
    assert processed(world) == [("track/sale", 200, "test_mode")]  # once, whichever way


def test_retry_policy_delays() -> None:
    policy = RetryPolicy(max_retries=5, backoff=1.0, max_backoff=3.0, max_retry_after=10.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 3.0, 3.0, 3.0, None]
    assert policy.delay(1, retry_after=5.0) == 5.0
    assert policy.delay(2, retry_after=0.0) == 2.0
    assert policy.delay(1, retry_after=11.0) is None
    assert RetryPolicy(max_retries=0).delay(1) is None


def test_async_client_retries_the_same_way(world: World) -> None:
    app, sleeps = RealApp(world), Sleeps()
    app.faults = [httpx.ConnectError("refused"), app.error(down())]

    async def run() -> TrackResult:
        async with real_async_client(app, sleeps) as tally:
            return await tally.track_sale(customer_external_id="u", amount=5, invoice_id="in_5")

    result = asyncio.run(run())
    assert (result.attempts, len(app.requests), sleeps) == (3, 3, [0.5, 1.0])
    assert result.data["transaction_id"] == "in_5"
    assert {r.headers["x-request-id"] for r in app.requests} == {result.request_id}
    assert [str(r.url) for r in app.requests] == [f"{APP_URL}/api/v1/track/sale"] * 3
    assert processed(world) == [SALE]
