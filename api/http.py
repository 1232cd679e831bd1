"""HTTP plumbing shared by every route: request ids, bounded JSON bodies, strict parsing, the
success envelope and the rotation headers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from datetime import UTC, date, datetime
from email.utils import format_datetime
from time import monotonic
from types import CoroutineType
from typing import Any, NamedTuple, TypeVar, overload

import orjson
from pydantic import BaseModel, ValidationError
from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest.domain.clock import rfc3339, utcnow
from ingest.domain.errors import InvalidJson, PayloadTooLarge, RequestTimeout, ValidationFailed
from ingest.domain.records import Credential
from ingest.domain.tokens import new_id

MAX_BODY = 1024 * 1024
M = TypeVar("M", bound=BaseModel)
CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type",
    "Access-Control-Max-Age": "86400",
}
_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


_DUMPS_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


def dumps(payload: Any) -> bytes:
    """Compact UTF-8 JSON; datetimes as RFC 3339 UTC with `Z` (second precision)."""
    return orjson.dumps(payload, default=_default, option=_DUMPS_OPTIONS)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(payload), status, headers, media_type="application/json")


def assign_request_id(scope: Scope) -> str:
    """The request's id, kept in its state: the client's `X-Request-Id` when sane, else a new one."""
    request_id = None
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            candidate = value.decode("latin-1")
            if _SANE_ID.match(candidate):
                request_id = candidate
            break
    if request_id is None:
        request_id = new_id("req")
    scope.setdefault("state", {})["request_id"] = request_id
    return request_id


class RequestIdMiddleware:
    """Every response carries `X-Request-Id`: the client's when it sent a sane one, else a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = assign_request_id(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-Id"] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)


def kept_headers(request: Request, names: frozenset[bytes]) -> str:
    """The headers worth keeping beside a raw body, as JSON with sorted keys (never credentials).
    The first value of a repeated header is kept, as `request.headers[name]` would give."""
    kept: dict[str, str] = {}
    for name, value in request.scope["headers"]:
        if name in names:
            kept.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return orjson.dumps(kept, option=orjson.OPT_SORT_KEYS).decode()


def remember(request: Request, **values: Any) -> None:
    """Keep per-request values where `request.state.<name>` reads them (the scope's state),
    without the attribute machinery's cost on the track endpoints."""
    request.scope.setdefault("state", {}).update(values)


def recall(request: Request, name: str) -> Any:
    """A value kept by `remember` (or set on `request.state`), None when absent."""
    return request.scope.get("state", {}).get(name)


def request_id(request: Request) -> str | None:
    value: str | None = recall(request, "request_id")
    return value


def header(request: Request, name: bytes) -> str | None:
    """One request header by its lower-case name (the first, as `request.headers[name]` gives),
    read straight from the ASGI scope: the track endpoints ask for two or three per call."""
    raw: list[tuple[bytes, bytes]] = request.scope["headers"]
    for key, value in raw:
        if key == name:
            return value.decode("latin-1")
    return None


def header_names(request: Request) -> tuple[str, ...]:
    """The names of the request's headers (a refusal's note keeps the known ones)."""
    return tuple(name.decode("latin-1") for name, _ in request.scope["headers"])


def at_once(pending: Awaitable[Message]) -> Message | None:
    """The message `pending` (a call of an ASGI `receive`) gives, when the server already holds it
    (a body that came with its headers: nearly every call), taken without arming a timer; None
    when it would have to wait, and then the call is closed where it waits (it has taken no
    message) and the caller asks again under its timeouts. Arming and disarming an asyncio
    timeout costs about 8 us a call under uvloop, more than reading and validating the body."""
    if type(pending) is not CoroutineType:  # an awaitable that cannot be polled: awaited as it is
        return None
    try:
        pending.send(None)
    except StopIteration as done:
        message: Message = done.value
        return message
    pending.close()
    return None


async def read_body(request: Request) -> bytes:
    """The raw body, refusing more than 1 MiB (413) without reading past the limit, and a client
    that pauses longer than `TALLY_BODY_TIMEOUT_SECONDS` between parts of it or takes longer
    than `TALLY_BODY_TOTAL_TIMEOUT_SECONDS` over all of it (408; the answer closes the
    connection). Reads the ASGI messages directly (`request.stream()` is an async
    generator, costly per call). A second call (a request decided again) gets the same bytes."""
    kept: bytes | None = getattr(request, "_body", None)
    if kept is not None:
        return kept
    declared = header(request, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise PayloadTooLarge(f"request body is over {MAX_BODY} bytes")
    started = monotonic()
    chunks: list[bytes] = []
    size = 0
    receive = request.receive
    while True:
        pending = receive()
        message = at_once(pending)
        if message is None:  # the server has to wait for it: under the timeouts
            if type(pending) is CoroutineType:  # (polled, and closed: ask again)
                pending = receive()
            settings = request.scope["app"].state.tally.settings
            wait, total = settings.body_timeout_seconds, settings.body_total_timeout_seconds
            pause = min(wait, started + total - monotonic())
            try:
                async with asyncio.timeout(pause):  # no task per message, unlike wait_for on 3.11
                    message = await pending
            except TimeoutError:
                if pause < wait:
                    raise RequestTimeout(f"the request body took longer than {total:g} s") from None
                raise RequestTimeout(f"no part of the request body arrived for {wait:g} s") from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise PayloadTooLarge(f"request body is over {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    request._body = body  # what `request.body()` would have kept, should anything ask again
    return body


def parse_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidJson("request body is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidJson("request body must be a JSON object")
    return value


def validate(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "body"
            fields.append({"field": loc, "message": err["msg"]})
        raise ValidationFailed("request body does not match the schema", fields=fields) from None


async def body_model(request: Request, model: type[M]) -> tuple[bytes, M]:
    raw = await read_body(request)
    return raw, validate(model, parse_object(raw))


# -- rotation: headers and warnings for a flagged program key ----------------------------------
@overload
def query_int(
    request: Request, name: str, default: int, low: int, high: int, *, blank: bool = ...
) -> int: ...


@overload
def query_int(
    request: Request, name: str, default: None, low: int, high: int, *, blank: bool = ...
) -> int | None: ...


def query_int(
    request: Request, name: str, default: int | None, low: int, high: int, *, blank: bool = False
) -> int | None:
    """The one parser of integer query parameters: in [low, high] (ASCII digits only), `default`
    when absent (or empty, with `blank`: the dashboard's links and forms may send `?name=`);
    ValidationFailed naming it otherwise."""
    raw = request.query_params.get(name)
    if raw is None or (blank and raw == ""):
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise ValidationFailed(
            f"{name} must be an integer from {low} to {high}",
            fields=[{"field": name, "message": f"integer from {low} to {high}"}],
        )
    return int(raw)


# -- rotation: headers and warnings for a flagged program key ----------------------------------
def flagged(request: Request) -> Credential | None:
    cred: Credential | None = recall(request, "credential")
    if cred is not None and cred.rotation_deadline is not None and cred.flagged_at is not None:
        return cred
    return None


def rotation_headers(request: Request, cred: Credential | None = None) -> dict[str, str]:
    cred = cred or flagged(request)
    if cred is None:
        return {}
    assert cred.flagged_at is not None and cred.rotation_deadline is not None
    base = request.app.state.tally.settings.base_url
    return {
        "Deprecation": f"@{int(cred.flagged_at.timestamp())}",
        "Sunset": format_datetime(cred.rotation_deadline.astimezone(UTC), usegmt=True),
        "Link": f'<{base}/docs/errors#api_key_rotation_required>; rel="deprecation"; type="text/html"',
    }


def rotation_warnings(cred: Credential | None) -> list[dict[str, Any]]:
    """The `api_key_rotation_required` warning every answer (success or error) to a flagged key
    carries before its deadline (CONTRACT section 3); none at or after it."""
    if cred is None or cred.rotation_deadline is None or utcnow() >= cred.rotation_deadline:
        return []
    return [
        {
            "code": "api_key_rotation_required",
            "deadline": rfc3339(cred.rotation_deadline),
            "message": "this API key must be regenerated before the deadline; "
            "after it, requests with it are refused",
        }
    ]


class Answer(NamedTuple):
    """A JSON answer as the track lanes send it (api/hotpath.py): status, body and raw headers,
    exactly those Starlette's `Response` would send for them (`response()` is that Response, for
    the full stack), without building one per call."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]

    def response(self) -> Response:
        response = Response(self.body, self.status, media_type="application/json")
        response.raw_headers = self.headers
        return response


_JSON_TYPE = (b"content-type", b"application/json")


def answer(
    request: Request,
    data: Any,
    status: int = 200,
    warnings: list[dict[str, Any]] | None = None,
    extra: dict[str, str] | None = None,
) -> Answer:
    """The success envelope `{"data": ..., "warnings": [...]}` with its headers: a flagged program
    key's rotation headers and warning (CONTRACT section 3), then `extra` headers (CORS)."""
    cred = flagged(request)
    if cred is None and not warnings:
        body = dumps({"data": data})
        headers = []
    else:
        all_warnings = [*rotation_warnings(cred), *(warnings or [])]
        payload: dict[str, Any] = {"data": data}
        if all_warnings:
            payload["warnings"] = all_warnings
        body = dumps(payload)
        headers = [] if cred is None else _raw(rotation_headers(request, cred))
    # Starlette's order: the given headers, content-length, content-type (then any set later)
    if not (status < 200 or status in (204, 304)):
        headers.append((b"content-length", str(len(body)).encode("latin-1")))
    headers.append(_JSON_TYPE)
    if extra:
        headers += _raw(extra)
    return Answer(status, body, headers)


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def ok(
    request: Request,
    data: Any,
    status: int = 200,
    warnings: list[dict[str, Any]] | None = None,
) -> Response:
    return answer(request, data, status, warnings).response()
