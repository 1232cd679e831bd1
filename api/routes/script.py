"""The browser script: `GET /sdk/v1/tally.js`, public, cacheable, readable from any origin."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.http import CORS_HEADERS
from api.openapi import Doc, document

SCRIPT = Path(__file__).resolve().parents[1] / "static" / "tally.js"
MEDIA_TYPE = "application/javascript"


@cache
def _script() -> tuple[bytes, str]:
    """The script's bytes and strong ETag, read once on first use."""
    content = SCRIPT.read_bytes()
    return content, '"' + hashlib.sha256(content).hexdigest()[:32] + '"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    if if_none_match is None:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag in tags


async def tally_js(request: Request) -> Response:
    if request.method == "OPTIONS":
        return Response(status_code=204, headers=CORS_HEADERS)
    content, etag = _script()
    headers = {
        "Cache-Control": "public, max-age=3600",
        "ETag": etag,
        "Access-Control-Allow-Origin": "*",
        "X-Content-Type-Options": "nosniff",
    }
    if _matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(content, headers=headers, media_type=MEDIA_TYPE)


routes = [Route("/sdk/v1/tally.js", tally_js, methods=["GET", "OPTIONS"])]

document(
    {
        tally_js: Doc(
            "The browser script (public, cacheable, any origin)",
            "browser",
            description="Include it with `data-program-id`; it records `?aff=` clicks and reports leads.",
            content={MEDIA_TYPE: {"schema": {"type": "string"}}},
            extra_responses={304: {"description": "Not modified (`If-None-Match` matched the ETag)"}},
        )
    }
)
