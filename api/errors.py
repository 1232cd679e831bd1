"""The one mapping from errors to the contract's JSON error envelope."""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.http import CORS_HEADERS, flagged, json_response, request_id, rotation_headers, rotation_warnings
from ingest.domain.errors import (
    DatabaseUnavailable,
    MethodNotAllowed,
    NotFound,
    RateLimited,
    ReconcileRunning,
    RequestTimeout,
    TallyError,
)

log = logging.getLogger("tally.api")


def error_body(request: Request, error: TallyError) -> dict[str, Any]:
    settings = request.app.state.tally.settings
    body: dict[str, Any] = {
        "code": error.code,
        "message": error.message,
        "doc_url": settings.doc_url(error.code),
    }
    body.update(error.extra)
    return {"error": body}


def error_response(request: Request, error: TallyError) -> Response:
    cred = flagged(request)
    headers = rotation_headers(request, cred)
    body = error_body(request, error)
    if warnings := rotation_warnings(cred):
        body["warnings"] = warnings
    if getattr(request.state, "cors", False):
        headers.update(CORS_HEADERS)
    if isinstance(error, RateLimited | ReconcileRunning):
        headers["Retry-After"] = str(error.extra.get("retry_after", 1))
    elif isinstance(error, DatabaseUnavailable):  # nothing was stored: the same call may be sent again
        headers["Retry-After"] = str(DatabaseUnavailable.retry_after)
    elif isinstance(error, RequestTimeout):  # the rest of a stalled body is not worth waiting for
        headers["Connection"] = "close"
    return json_response(body, error.status, headers)


async def tally_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TallyError)
    return error_response(request, exc)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: TallyError
    if exc.status_code == 405:
        error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    elif exc.status_code == 404:
        error = NotFound(f"no such path: {request.url.path}")
    else:
        error = TallyError(str(exc.detail))
        return JSONResponse(error_body(request, error), exc.status_code, headers=exc.headers)
    return error_response(request, error)


async def server_error(request: Request, exc: Exception) -> Response:
    """Log an unexpected exception once (request id, method, path, traceback) and answer the
    500 envelope. Used by the fast lane (`api.hotpath`) and the full stack (`api.failsafe`)."""
    rid = request_id(request)
    method, path = request.scope.get("method", "-"), request.scope.get("path", "-")
    log.error(
        "unhandled error on %s %s (request %s)",
        method,
        path,
        rid,
        exc_info=exc,
        extra={"request_id": rid, "method": method, "path": path},
    )
    return error_response(request, TallyError(f"internal error; request {rid} identifies it in the logs"))


EXCEPTION_HANDLERS: dict[Any, Any] = {
    TallyError: tally_error,
    HTTPException: http_error,
}  # anything else: api.failsafe answers it, keeping the connection
