"""The last answer to an unexpected exception on the full stack.

Starlette's `ServerErrorMiddleware` answers a 500 and then re-raises, and uvicorn closes the
connection of any request whose application raised: every unexpected error cost the client its
keep-alive connection. This middleware sits just inside `RequestIdMiddleware` (so the answer
carries `X-Request-Id`), logs the exception once through `api.errors.server_error` and answers the
contract's 500 envelope; it never re-raises, so the connection stays usable. When the response had
already started there is nothing honest left to send: the exception is logged and uvicorn closes
the connection, the response being incomplete.

It also refuses, before any route sees it, a URL whose path or query holds a NUL (`%00`): no
backend can store or look up such an id (PostgreSQL text cannot hold U+0000), so it is the
contract's `422 validation_error`, never a 500 from a read that would pass it on (issue 48).
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response, server_error
from api.openapi import doc_of
from api.pages import error_page
from api.routes.portal import error_page as portal_page
from ingest.domain.bounds import UNSTORABLE
from ingest.domain.errors import ValidationFailed

log = logging.getLogger("tally.api")


class FailsafeMiddleware:
    """Unexpected exceptions become the 500 envelope (logged with request id and traceback)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            where = "path" if "\x00" in scope["path"] else "query"
            error = ValidationFailed(
                f"the URL's {where} {UNSTORABLE}", fields=[{"field": where, "message": UNSTORABLE}]
            )
            if _html_errors(scope):  # a page answers its refusals as a page, as documented
                await _error_page(scope, error)(scope, receive, send)
            else:
                await error_response(Request(scope, receive), error)(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except ClientDisconnect:  # the client left mid-body: nobody to answer
            log.debug("client disconnected during %s %s", scope["method"], scope["path"])
        except Exception as exc:
            response = await server_error(Request(scope, receive), exc)
            if not started:
                await response(scope, receive, send)


def _html_errors(scope: Scope) -> bool:
    """Whether the route `scope` reaches documents its errors as HTML pages (api/openapi.py)."""
    router = getattr(scope.get("app"), "router", None)
    for route in getattr(router, "routes", []):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            endpoint = getattr(route, "endpoint", None)
            doc = doc_of(endpoint) if endpoint is not None else None
            return doc is not None and doc.html_errors
    return False


def _error_page(scope: Scope, error: ValidationFailed) -> Response:
    """The dashboard's or the portal's error page for `error`."""
    if str(scope["path"]).startswith("/partner"):
        return portal_page(error.status, error.code, error.message)
    return error_page(error.status, error.code, error.message)
