"""The ingest endpoints' fast lane through the ASGI stack.

Brand servers post sales, leads and refunds, and the processor its webhook deliveries, at high
rates. For these few (method, path) pairs the app calls the endpoint's lane directly, skipping
Starlette's middleware stack (server-error, request-id, failsafe and exception middleware, route
matching over every route, the endpoint wrapper and their wrappers of `send`), and sends the
lane's `Answer` (status, body, raw headers) as two ASGI messages without building a `Response`.
The full stack runs the same lane through its route (`Answer.response()`). What a client sees is
identical: the same lane code, the same error map (`api.errors`), the same `X-Request-Id` rule,
the same access line and metrics (tests/api/test_hotpath.py compares both lanes). Everything else
takes the full stack.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.errors import error_response, server_error
from api.http import Answer, assign_request_id
from ingest.domain.errors import TallyError

if TYPE_CHECKING:
    from api.observability import Observer

Lane = Callable[[Request], Awaitable[Answer]]


class TallyApp(Starlette):
    """Starlette, with `hot[(method, path)]` answered ahead of the middleware stack."""

    def __init__(
        self, hot: Mapping[tuple[str, str], Lane], observer: Observer | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.hot = hot
        self.observer = observer  # the fast lane's access line and request metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.hot.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        if lane is None:
            await super().__call__(scope, receive, send)
            return
        started = perf_counter()
        scope["app"] = self
        request_id = assign_request_id(scope)
        request = Request(scope, receive)
        observer = self.observer
        answer: Answer | Response
        try:
            answer = await lane(request)
        except TallyError as exc:
            answer = error_response(request, exc)
        except ClientDisconnect:  # the client left mid-body: nobody to answer (as api.failsafe)
            if observer is not None:
                observer.request(scope["method"], scope["path"], 499, started, request_id)
            return
        except Exception as exc:  # the same answer, and log record, the full stack gives
            answer = await server_error(request, exc)
        stamp = (b"x-request-id", request_id.encode("latin-1"))
        status = answer.status if type(answer) is Answer else answer.status_code  # type: ignore[union-attr]
        try:
            if type(answer) is Answer:
                answer.headers.append(stamp)
                await send({"type": "http.response.start", "status": status, "headers": answer.headers})
                await send({"type": "http.response.body", "body": answer.body})
            else:
                assert isinstance(answer, Response)
                answer.raw_headers.append(stamp)
                await answer(scope, receive, send)
        finally:  # the same access line and metrics as api.observability.ObserveMiddleware
            if observer is not None:
                observer.request(scope["method"], scope["path"], status, started, request_id)
