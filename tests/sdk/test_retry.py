"""sdk retries: only safe failures, bounded, with backoff; counted by a scripted transport."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sdk import (
    AuthenticationError,
    ConnectionFailed,
    DuplicateError,
    RateLimitError,
    RetryPolicy,
    ServerError,
    Tally,
    TrackResult,
    ValidationError,
)
from tests.sdk.helpers import Script, Sleeps, async_client, client, err, ok


def track(tally: Tally) -> TrackResult:
    return tally.track_sale(customer_external_id="user_42", amount=100, invoice_id="in_1")


def status(code: int) -> httpx.Response:
    return httpx.Response(code, json={"error": {"code": f"http_{code}", "message": "x"}})


@pytest.mark.parametrize("code", [429, 502, 503, 504])
def test_retryable_statuses_are_retried_then_succeed(code: int) -> None:
    script, sleeps = Script(status(code), ok({"sale_id": "s"})), Sleeps()
    result = track(client(script, sleeps))
    assert len(script.requests) == 2
    assert result.attempts == 2
    assert sleeps == [0.5]
    # The same request (and request id) is sent again.
    assert script.requests[0].headers["x-request-id"] == script.requests[1].headers["x-request-id"]
    assert script.bodies[0] == script.bodies[1]


@pytest.mark.parametrize(
    ("response", "cls"),
    [
        (status(500), ServerError),
        (status(501), ServerError),
        (err(401, "invalid_api_key"), AuthenticationError),
        (err(422, "validation_error"), ValidationError),
        (err(409, "duplicate_transaction"), DuplicateError),
    ],
)
def test_other_failures_are_not_retried(response: httpx.Response, cls: type[Exception]) -> None:
    script, sleeps = Script(response, ok({})), Sleeps()
    with pytest.raises(cls):
        track(client(script, sleeps))
    assert (len(script.requests), sleeps) == (1, [])


def test_retries_are_bounded_with_exponential_backoff() -> None:
    script, sleeps = Script(status(503)), Sleeps()
    with pytest.raises(ServerError) as info:
        track(client(script, sleeps, retries=4))
    assert len(script.requests) == 5
    assert sleeps == [0.5, 1.0, 2.0, 4.0]
    assert info.value.status == 503


def test_retry_after_is_honoured() -> None:
    limited = err(429, "rate_limited")
    limited.headers["Retry-After"] = "3"
    script, sleeps = Script(limited, ok({})), Sleeps()
    track(client(script, sleeps))
    assert sleeps == [3.0]


def test_rate_limit_exhausted_raises_with_retry_after() -> None:
    limited = err(429, "rate_limited")
    limited.headers["Retry-After"] = "1"
    script, sleeps = Script(limited), Sleeps()
    with pytest.raises(RateLimitError) as info:
        track(client(script, sleeps, retries=1))
    assert (len(script.requests), sleeps, info.value.retry_after) == (2, [1.0], 1.0)


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
def test_transport_errors_are_retried_for_sales(exc: Exception) -> None:
    script = Script(exc, ok({"sale_id": "s"}))
    assert track(client(script)).data == {"sale_id": "s"}
    assert len(script.requests) == 2


def test_transport_errors_exhausted_raise_connection_failed() -> None:
    script, sleeps = Script(httpx.ConnectError("refused")), Sleeps()
    with pytest.raises(ConnectionFailed) as info:
        track(client(script, sleeps, retries=2))
    assert len(script.requests) == 3
    assert sleeps == [0.5, 1.0]
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert (info.value.code, info.value.status) == ("connection_error", None)


def test_configuration_transport_errors_are_not_retried() -> None:
    script = Script(httpx.UnsupportedProtocol("ftp?"))
    with pytest.raises(ConnectionFailed):
        track(client(script))
    assert len(script.requests) == 1


@pytest.mark.parametrize(
    ("first", "after_retry"),
    [
        (httpx.ReadTimeout("the first attempt may have landed"), True),
        (status(502), True),
        (httpx.ConnectError("never sent"), False),
        (status(503), False),
    ],
)
def test_duplicate_after_a_retry_says_whether_the_first_attempt_may_have_landed(
    first: httpx.Response | Exception, after_retry: bool
) -> None:
    script = Script(first, err(409, "duplicate_transaction"))
    with pytest.raises(DuplicateError) as info:
        track(client(script))
    assert info.value.after_retry is after_retry
    assert len(script.requests) == 2


@pytest.mark.parametrize(
    ("failure", "requests"),
    [
        (httpx.ReadTimeout("may have landed"), 1),
        (httpx.RemoteProtocolError("may have landed"), 1),
        (status(502), 1),
        (status(504), 1),
        (httpx.ConnectError("never sent"), 2),
        (status(503), 2),
        (status(429), 2),
    ],
)
def test_test_sale_is_retried_only_when_surely_not_processed(
    failure: httpx.Response | Exception, requests: int
) -> None:
    script = Script(failure, ok({"test_mode": True}))
    try:
        client(script).track_test_sale()
    except (ConnectionFailed, ServerError):
        assert requests == 1
    assert len(script.requests) == requests


def test_retry_policy_delays() -> None:
    policy = RetryPolicy(max_retries=5, backoff=1.0, max_backoff=3.0, max_retry_after=10.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 3.0, 3.0, 3.0, None]
    assert policy.delay(1, retry_after=5.0) == 5.0
    assert policy.delay(2, retry_after=0.0) == 2.0
    assert policy.delay(1, retry_after=11.0) is None
    assert RetryPolicy(max_retries=0).delay(1) is None


def test_async_client_retries_the_same_way() -> None:
    script, sleeps = Script(httpx.ConnectError("refused"), status(503), ok({"sale_id": "s"})), Sleeps()

    async def run() -> TrackResult:
        tally = async_client(script, sleeps)
        return await tally.track_sale(customer_external_id="u", amount=5, invoice_id="in_5")

    result = asyncio.run(run())
    assert (result.attempts, len(script.requests), sleeps) == (3, 3, [0.5, 1.0])
