"""bench/webhooks_out's receiver: answers every POST 204 and counts them (`GET /count`: requests,
and distinct (endpoint, webhook-id) pairs), run by uvicorn as a process of its own, as a brand's
server would be."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

_received = {"count": 0, "ids": 0}
_seen: set[str] = set()


async def take(request: Request) -> Response:
    await request.body()
    _received["count"] += 1
    delivery = f"{request.url.path} {request.headers.get('webhook-id', '')}"  # one event to one endpoint
    if delivery not in _seen:
        _seen.add(delivery)
        _received["ids"] += 1
    return Response(status_code=204)


async def count(request: Request) -> Response:
    return JSONResponse(_received)


app = Starlette(routes=[Route("/hooks/{n}", take, methods=["POST"]), Route("/count", count, methods=["GET"])])
