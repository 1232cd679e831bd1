"""The API reference: `GET /openapi.json` (the OpenAPI 3.1 document, built by `api/openapi.py`
from the app's route table) and `GET /docs`, which renders it with Swagger UI. The page works
offline: Swagger UI's files come from the `swagger-ui-py` package and are served by the app
under `/docs/assets/`, next to a small script of ours that starts it (no inline script, so the
page keeps a strict Content-Security-Policy)."""

from __future__ import annotations

from functools import cache
from importlib import metadata, util
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from api.auth import state
from api.http import json_response
from api.openapi import HTML, JSON, Doc, Param, build, document
from ingest.domain.errors import NotFound


def _package_dir(name: str) -> Path:
    """Where an installed package lives, found without importing it (swagger_ui's own code,
    handlers for other frameworks, is not needed: only its copy of Swagger UI's files)."""
    spec = util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {name} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


SWAGGER_UI = _package_dir("swagger_ui") / "static"  # the swagger-ui-py package's copy
START = Path(__file__).resolve().parents[1] / "static" / "docs.js"
ASSETS: dict[str, tuple[Path, str]] = {
    "swagger-ui.css": (SWAGGER_UI / "swagger-ui.css", "text/css"),
    "swagger-ui-bundle.js": (SWAGGER_UI / "swagger-ui-bundle.js", "application/javascript"),
    "favicon-32x32.png": (SWAGGER_UI / "favicon-32x32.png", "image/png"),
    "docs.js": (START, "application/javascript"),
}
DOCS_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tally API reference</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" type="image/png" href="/docs/assets/favicon-32x32.png">
</head>
<body>
<noscript>The reference needs JavaScript; the document is at
<a href="/openapi.json">/openapi.json</a>.</noscript>
<div id="swagger-ui" data-url="/openapi.json"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/assets/docs.js"></script>
</body>
</html>
"""


def version() -> str:
    try:
        return metadata.version("tally")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def spec(request: Request) -> dict[str, Any]:
    """The app's document, built once per app."""
    app = request.app
    found: dict[str, Any] | None = getattr(app.state, "openapi", None)
    if found is None:
        found = build(app.routes, state(request).settings.base_url, version())
        app.state.openapi = found
    return found


async def openapi_json(request: Request) -> Response:
    return json_response(spec(request), headers={"Cache-Control": "no-cache"})


async def docs_page(request: Request) -> Response:
    headers = {
        "Cache-Control": "no-cache",
        "Content-Security-Policy": DOCS_CSP,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
    }
    return HTMLResponse(PAGE, headers=headers)


@cache
def _asset(name: str) -> bytes:
    return ASSETS[name][0].read_bytes()


async def docs_asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS:
        raise NotFound(f"no such asset: {name}")
    headers = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
    return Response(_asset(name), media_type=ASSETS[name][1], headers=headers)


routes = [
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/docs", docs_page, methods=["GET"]),
    Route("/docs/assets/{name}", docs_asset, methods=["GET"]),
]

document(
    {
        openapi_json: Doc(
            "This document (OpenAPI 3.1)",
            "operations",
            content={JSON: {"schema": {"type": "object", "required": ["openapi", "paths"]}}},
        ),
        docs_page: Doc(
            "The API reference page (this document, rendered; works offline)",
            "operations",
            content={HTML: {"schema": {"type": "string"}}},
        ),
        docs_asset: Doc(
            "The reference page's script, stylesheet and icon",
            "operations",
            params=(Param("name", {"type": "string", "enum": sorted(ASSETS)}, where="path"),),
            content={
                "application/javascript": {"schema": {"type": "string"}},
                "text/css": {"schema": {"type": "string"}},
                "image/png": {"schema": {"type": "string", "contentMediaType": "image/png"}},
            },
            errors=(NotFound,),
        ),
    }
)
