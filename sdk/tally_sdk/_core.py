"""The I/O-free core shared by `Tally` and `AsyncTally`: calls, retry decisions, responses, logs.

The clients only move bytes: `attempts()` is a generator that yields how long to wait before
each attempt and receives that attempt's outcome (a response or a transport error) and how long
it took; it returns the parsed result or raises the typed error. Both clients drive the same
generator. It logs each attempt to `logging.getLogger("tally_sdk")`: the method, path and query,
status, time and request id at DEBUG, each retry at INFO; never a header (the credentials travel
in `Authorization`) and never a body (customer emails), only the names of the body's fields.
"""

from __future__ import annotations

import email.utils
import logging
import os
import uuid
import warnings
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar, cast
from urllib.parse import urlencode

import httpx

from tally_sdk._version import __version__
from tally_sdk.errors import (
    ApiKeyRotationWarning,
    ConfigurationError,
    ConnectionFailed,
    InvalidResponseError,
    TallyAPIError,
    error_class,
)
from tally_sdk.responses import ApiWarning

SDK_VERSION = __version__
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
ROTATION_CODE = "api_key_rotation_required"

log = logging.getLogger("tally_sdk")

Outcome = httpx.Response | httpx.TransportError
Credential = Literal["program", "account"]

# Failures after which a retry is allowed. A call that is not idempotent is retried only when
# the server surely did not process it (refused at the door, timed out reading the request, or
# never reached). 501 and 505 say the server cannot ever do it: never retried.
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_STATUSES_UNSAFE = frozenset({408, 429, 503})
_AMBIGUOUS_STATUSES = frozenset({500, 502, 504})  # the server may have processed it
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_MAYBE_SENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


DataT = TypeVar("DataT")


@dataclass(frozen=True)
class TrackResult(Generic[DataT]):
    """A successful call: the envelope's `data` (a `tally_sdk.responses` typed dict, or a list of
    them for a read) and `warnings`, plus what the headers said, and the raw `httpx.Response`."""

    data: DataT
    warnings: tuple[ApiWarning, ...] = ()
    rotation_deadline: datetime | None = None
    rotation_flagged: bool = False
    request_id: str | None = None
    status: int = 200
    attempts: int = 1
    raw_response: httpx.Response | None = field(default=None, repr=False, compare=False)

    @property
    def headers(self) -> httpx.Headers:
        """The answer's headers (empty for a result made without one)."""
        return self.raw_response.headers if self.raw_response is not None else httpx.Headers()


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff; `Retry-After` is honoured up to `max_retry_after` seconds."""

    max_retries: int = 2
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 30.0

    def delay(self, retry: int, retry_after: float | None = None) -> float | None:
        """Seconds to wait before retry number `retry` (1-based), or None to give up."""
        if retry > self.max_retries:
            return None
        backoff = min(self.max_backoff, self.backoff * (1 << (retry - 1)))
        if retry_after is None:
            return backoff
        return None if retry_after > self.max_retry_after else max(retry_after, backoff)


@dataclass(frozen=True)
class Call:
    """One API call to make: method, path, query, JSON body, the credential it needs, whether
    repeating it is harmless, and what its `data` is (an object, or a list for a read)."""

    path: str
    body: Mapping[str, Any] | None
    idempotent: bool
    method: str = "POST"
    params: Mapping[str, str] = field(default_factory=dict)
    credential: Credential = "program"
    expects: Literal["object", "list"] = "object"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def request_args(self) -> dict[str, Any]:
        """Keyword arguments for `httpx.Client.build_request` / `AsyncClient.build_request`
        (the credential's `Authorization` header is the client's to add)."""
        args: dict[str, Any] = {
            "method": self.method,
            "url": self.path,
            "headers": {"X-Request-Id": self.request_id},
        }
        if self.params:
            args["params"] = dict(self.params)
        if self.body is not None:
            args["json"] = dict(self.body)
        return args

    @property
    def target(self) -> str:
        """`METHOD /path?query` as the log shows it (no credential travels in either)."""
        query = f"?{urlencode(self.params)}" if self.params else ""
        return f"{self.method} {self.path}{query}"


@dataclass(frozen=True, repr=False)
class Credentials:
    """The program key (track calls) and the account token (reads); either may be missing."""

    api_key: str | None
    account_token: str | None

    def header(self, call: Call) -> dict[str, str]:
        """`Authorization` for `call`; `ConfigurationError` when its credential was not given."""
        if call.credential == "account":
            if not self.account_token:
                raise ConfigurationError(
                    "reads need an account token (acct_...): pass account_token=... or set"
                    " TALLY_ACCOUNT_TOKEN"
                )
            return {"Authorization": f"Bearer {self.account_token}"}
        if not self.api_key:
            raise ConfigurationError("no Tally API key: pass api_key=... or set SERVICE_API_KEY")
        return {"Authorization": f"Bearer {self.api_key}"}

    def __repr__(self) -> str:  # never shows either value
        return "Credentials(...)"


def resolve_settings(
    base_url: str | None, api_key: str | None, account_token: str | None = None
) -> tuple[str, dict[str, str], Credentials]:
    """Base URL, default headers and credentials, from the arguments or `TALLY_BASE_URL`,
    `SERVICE_API_KEY` (the program key, for track calls) and `TALLY_ACCOUNT_TOKEN` (reads)."""
    url = base_url or os.environ.get("TALLY_BASE_URL") or DEFAULT_BASE_URL
    key = api_key or os.environ.get("SERVICE_API_KEY")
    token = account_token or os.environ.get("TALLY_ACCOUNT_TOKEN")
    if not key and not token:
        raise ConfigurationError(
            "no Tally API key: pass api_key=... or set SERVICE_API_KEY (track calls), and/or pass"
            " account_token=... or set TALLY_ACCOUNT_TOKEN (reads)"
        )
    headers = {"Accept": "application/json", "User-Agent": f"tally-python/{SDK_VERSION}"}
    return url, headers, Credentials(key or None, token or None)


Sent = tuple[Outcome, float]  # an attempt's outcome and how long it took, in seconds


def attempts(call: Call, policy: RetryPolicy) -> Generator[float, Sent, TrackResult[Any]]:
    """Yield the delay before each attempt, receive its outcome; return or raise at the end."""
    delay, attempt, landed = 0.0, 0, False
    while True:
        outcome, took = yield delay
        attempt += 1
        _log_attempt(call, attempt, outcome, took)
        if isinstance(outcome, httpx.Response):
            status = outcome.status_code
            allowed = _RETRY_STATUSES if call.idempotent else _RETRY_STATUSES_UNSAFE
            wait = policy.delay(attempt, _retry_after(outcome)) if status in allowed else None
            if wait is None:
                result, warning = finish(outcome, after_retry=landed, attempts=attempt, expects=call.expects)
                if warning is not None:
                    warnings.warn(warning, stacklevel=4)  # the caller of Tally.track_*
                if isinstance(result, TallyAPIError):
                    raise result
                return result
            landed = landed or status in _AMBIGUOUS_STATUSES
            why = f"HTTP {status}"
        else:
            retryable = _MAYBE_SENT if call.idempotent else _NOT_SENT
            wait = policy.delay(attempt) if isinstance(outcome, retryable) else None
            if wait is None:
                message = f"could not reach Tally ({type(outcome).__name__}: {outcome})"
                raise ConnectionFailed(
                    "connection_error", message, None, None, after_retry=landed
                ) from outcome
            landed = landed or not isinstance(outcome, _NOT_SENT)
            why = type(outcome).__name__
        log.info(
            "retrying %s in %.2f s after %s (attempt %d of at most %d, request %s)",
            call.target,
            wait,
            why,
            attempt + 1,
            policy.max_retries + 1,
            call.request_id,
        )
        delay = wait


def _log_attempt(call: Call, attempt: int, outcome: Outcome, took: float) -> None:
    if not log.isEnabledFor(logging.DEBUG):
        return
    fields = f" (body fields: {', '.join(sorted(call.body))})" if call.body else ""
    if isinstance(outcome, httpx.Response):
        answered = outcome.headers.get("x-request-id") or call.request_id
        log.debug(
            "%s%s -> %d in %.1f ms (attempt %d, request %s)",
            call.target,
            fields,
            outcome.status_code,
            took * 1000,
            attempt,
            answered,
        )
    else:
        log.debug(
            "%s%s -> %s after %.1f ms (attempt %d, request %s): %s",
            call.target,
            fields,
            type(outcome).__name__,
            took * 1000,
            attempt,
            call.request_id,
            outcome,
        )


def finish(
    response: httpx.Response,
    *,
    after_retry: bool = False,
    attempts: int = 1,
    expects: Literal["object", "list"] = "object",
) -> tuple[TrackResult[Any] | TallyAPIError, ApiKeyRotationWarning | None]:
    """Parse a final response into a result or an error, plus a rotation warning if flagged."""
    status, request_id = response.status_code, response.headers.get("x-request-id")
    body = _json_object(response)
    raw_warnings = body.get("warnings") if body else None
    raw_warnings = raw_warnings if isinstance(raw_warnings, list) else []
    notes = tuple(cast(ApiWarning, w) for w in raw_warnings if isinstance(w, Mapping) and "code" in w)
    rotation = [w for w in notes if w.get("code") == ROTATION_CODE]
    flagged = bool(rotation) or "deprecation" in response.headers
    deadline = (_rfc3339(rotation[0].get("deadline")) if rotation else None) or _sunset(response)
    deadline = deadline if flagged else None
    outcome: TrackResult[Any] | TallyAPIError
    if 200 <= status < 300:
        data = body.get("data") if body else None
        if isinstance(data, list if expects == "list" else Mapping):
            outcome = TrackResult(data, notes, deadline, flagged, request_id, status, attempts, response)
        else:
            message = f"HTTP {status} without a JSON {{'data': <{expects}>}} envelope"
            outcome = InvalidResponseError("invalid_response", message, status, request_id, response=response)
    else:
        error = body.get("error") if body else None
        error = error if isinstance(error, Mapping) else {}
        raw_code = error.get("code")
        code = raw_code if isinstance(raw_code, str) and raw_code else f"http_{status}"
        if code == ROTATION_CODE:
            deadline, flagged = _rfc3339(error.get("deadline")) or _sunset(response), False
        outcome = error_class(code, status)(
            code,
            str(error.get("message") or response.reason_phrase or "request refused"),
            status,
            request_id,
            doc_url=error.get("doc_url") if isinstance(error.get("doc_url"), str) else None,
            details={k: v for k, v in error.items() if k not in {"code", "message", "doc_url"}},
            rotation_deadline=deadline,
            retry_after=_retry_after(response),
            after_retry=after_retry,
            response=response,
        )
    return outcome, _rotation_warning(deadline, response) if flagged else None


def _rotation_warning(deadline: datetime | None, response: httpx.Response) -> ApiKeyRotationWarning:
    when = deadline.isoformat().replace("+00:00", "Z") if deadline else "an announced deadline"
    link = response.headers.get("link", "")
    docs = f" See {link.split('>')[0].lstrip('<')}" if link.startswith("<") else ""
    return ApiKeyRotationWarning(
        f"the Tally API key is flagged for mandatory rotation and stops working at {when}: "
        f"regenerate it in the program settings and redeploy SERVICE_API_KEY.{docs}"
    )


def _json_object(response: httpx.Response) -> Mapping[str, Any] | None:
    try:
        body = response.json()
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    return body if isinstance(body, Mapping) else None


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "").strip()
    if value.isdigit():
        return float(value)
    when = _http_date(value)
    return max(0.0, (when - datetime.now(UTC)).total_seconds()) if when else None


def _sunset(response: httpx.Response) -> datetime | None:
    return _http_date(response.headers.get("sunset", ""))


def _http_date(value: str) -> datetime | None:
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _rfc3339(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
