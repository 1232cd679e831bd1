"""The one mapping from errors to the contract's JSON error envelope."""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.http import CORS_HEADERS, json_response, rotation_headers
from ingest.errors import MethodNotAllowed, NotFound, RateLimited, TallyError

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
    headers = rotation_headers(request)
    if getattr(request.state, "cors", False):
        headers.update(CORS_HEADERS)
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(error.extra.get("retry_after", 1))
    return json_response(error_body(request, error), error.status, headers)


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
        return JSONResponse(error_body(request, error), exc.status_code)
    return error_response(request, error)


async def server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(request, TallyError("internal error; the request id identifies it in the logs"))


EXCEPTION_HANDLERS: dict[Any, Any] = {
    TallyError: tally_error,
    HTTPException: http_error,
    Exception: server_error,
}
