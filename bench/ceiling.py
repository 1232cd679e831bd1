"""The framework ceiling: a minimal Starlette endpoint that only parses the JSON body."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def parse_only(request: Request) -> Response:
    body = json.loads(await request.body())
    return Response(json.dumps({"data": {"received": isinstance(body, dict)}}), media_type="application/json")


app = Starlette(routes=[Route("/api/v1/track/sale", parse_only, methods=["POST"])])
