"""A tiny brand page for trying tally out: `GET /demo/shop?program_id=prog_...&aff=<partner>`.

It is what a brand's own site does, and nothing more: it includes the browser script
(`/sdk/v1/tally.js` with `data-program-id`), so opening it with `?aff=` records a click and keeps
the click id in the `svc_click_id` cookie, and its sign-up form reports a browser-mode lead with
`tally.signup(userId)`. Its own script (`/demo/shop.js`) only shows what happened. Harmless to
serve anywhere: no credential, no session, only the public tracking endpoints any page may call.
The dashboard's checklist links to it; the README's first-sale walkthrough starts from it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from api.openapi import HTML, Doc, Param, document
from api.templating import templates

DEMO_SHOP = "/demo/shop"
SHOP_SCRIPT = Path(__file__).resolve().parents[1] / "static" / "demo_shop.js"
_PROGRAM_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; "
        "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def shop(request: Request) -> Response:
    """The demo brand page: with a program id, the script tag for it; without one, how to open it."""
    raw = request.query_params.get("program_id", "")
    program_id = raw if _PROGRAM_ID.fullmatch(raw) else None
    html = templates.get_template("demo_shop.html").render(
        program_id=program_id, partner_code=request.query_params.get("aff") or None, path=DEMO_SHOP
    )
    return HTMLResponse(html, headers=HEADERS)


@cache
def _shop_script() -> bytes:
    return SHOP_SCRIPT.read_bytes()


async def shop_js(request: Request) -> Response:
    headers = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
    return Response(_shop_script(), media_type="application/javascript", headers=headers)


routes = [
    Route(DEMO_SHOP, shop, methods=["GET"]),
    Route(DEMO_SHOP + ".js", shop_js, methods=["GET"]),
]

document(
    {
        shop: Doc(
            "A demo brand page carrying the browser script: open it with ?aff= to record a click",
            "browser",
            description="No credential. Renders the script tag for `program_id`; the page's sign-up "
            "form reports a browser-mode lead. What a brand's own page does, to try tally out.",
            params=(
                Param("program_id", {"type": "string"}, "The program the page's script tag names"),
                Param("aff", {"type": "string"}, "A partner code, as a partner's link carries it"),
            ),
            content={HTML: {"schema": {"type": "string"}}},
        ),
        shop_js: Doc(
            "The demo brand page's own script (shows the click and the lead)",
            "browser",
            content={"application/javascript": {"schema": {"type": "string"}}},
        ),
    }
)
