"""Pages that never need a credential: the front door (`/`: a browser goes on to the dashboard,
an API client gets where things are), the error reference (the rotation Link target), and the
health (`/healthz`: the process is up) and readiness (`/readyz`: the database takes writes)
probes."""

from __future__ import annotations

import asyncio
import re

from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from api import schemas
from api.auth import state
from api.errorfixes import ERROR_FIXES, WARNING_FIXES
from api.http import ok
from api.openapi import HTML, JSON, Doc, document
from api.templating import templates
from ingest.domain.errors import ALL_ERRORS, DatabaseUnavailable, ServiceUnavailable

WARNING_CODES: dict[str, str] = {
    "api_key_rotation_required": "The program API key is flagged for mandatory rotation. Before the "
    "deadline every response carries this warning and the Deprecation, Sunset and Link headers; at or "
    "after the deadline requests are refused with 401 and this code. Regenerate the key to clear it.",
    "customer_not_attributed": "A sale was recorded for a customer with no settled lead or known click "
    "yet. It is kept and attributed at reconciliation if the data arrives.",
    "sale_not_found": "A refund names a sale tally has not seen yet. It is kept and matched later.",
}


def with_code(text: str) -> Markup:
    """`text`, escaped, with its `backticked` parts as <code>."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))  # noqa: S704 - escaped first


def error_catalogue() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for cls in ALL_ERRORS:
        if cls.code == "internal_error":
            continue
        doc = " ".join((cls.__doc__ or "").split())
        rows.append(
            {"code": cls.code, "status": cls.status, "doc": doc, "fix": with_code(ERROR_FIXES[cls.code])}
        )
    rows.sort(key=lambda r: (int(str(r["status"])), str(r["code"])))
    return rows


def warning_catalogue() -> list[dict[str, object]]:
    """Warning codes; a warning that is also an error code is anchored `warning-<code>`."""
    errors = {cls.code for cls in ALL_ERRORS}
    return [
        {
            "code": code,
            "anchor": f"warning-{code}" if code in errors else code,
            "doc": doc,
            "fix": with_code(WARNING_FIXES[code]),
        }
        for code, doc in WARNING_CODES.items()
    ]


async def errors_page(request: Request) -> Response:
    html = templates.get_template("errors.html").render(
        errors=error_catalogue(), warnings=warning_catalogue(), base_url=state(request).settings.base_url
    )
    return HTMLResponse(html)


def wants_html(request: Request) -> bool:
    """A browser navigating (it asks for html first); API clients send `*/*` or JSON."""
    return "text/html" in request.headers.get("accept", "")


async def home(request: Request) -> Response:
    """A browser is sent on to the dashboard (its sign-in when there is no session); anyone
    else gets the addresses of the dashboard, the API reference and the error codes."""
    if wants_html(request):
        return RedirectResponse("/dashboard", 303)
    base = state(request).settings.base_url
    return ok(
        request,
        {
            "service": "tally",
            "dashboard": f"{base}/dashboard",
            "api_reference": f"{base}/docs",
            "openapi": f"{base}/openapi.json",
            "error_codes": f"{base}/docs/errors",
            "health": f"{base}/healthz",
        },
    )


async def healthz(request: Request) -> Response:
    st = state(request)
    if not st.writer.running:
        return ok(request, {"status": "starting"}, 503)
    return ok(request, {"status": "ok"})


async def readyz(request: Request) -> Response:
    """200 while the database takes writes; 503 `database_unavailable` during a resource fault
    (disk full, I/O errors), turning back to 200 by itself once writes succeed again."""
    st = state(request)
    if not st.writer.running:
        raise ServiceUnavailable("tally is not accepting writes right now")
    problem = await asyncio.to_thread(st.store.readiness)
    if problem is not None:
        raise DatabaseUnavailable(f"the database cannot take writes: {problem}")
    return ok(
        request,
        {
            "status": "ready",
            "journal_set_aside": st.store.set_aside,
            "schema_version": st.store.schema_version,
        },
    )


routes = [
    Route("/", home, methods=["GET"]),
    Route("/docs/errors", errors_page, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
]

document(
    {
        home: Doc(
            "The front door: a browser goes on to the dashboard; an API client gets where things are",
            "operations",
            data=schemas.Home,
            result={
                "service": "tally",
                "dashboard": "https://tally.example/dashboard",
                "api_reference": "https://tally.example/docs",
                "openapi": "https://tally.example/openapi.json",
                "error_codes": "https://tally.example/docs/errors",
                "health": "https://tally.example/healthz",
            },
            extra_responses={
                303: {"description": "A browser (`Accept` names text/html): on to `/dashboard`"}
            },
        ),
        errors_page: Doc(
            "Every error code, documented (the target of each `doc_url`)",
            "operations",
            content={HTML: {"schema": {"type": "string"}}},
        ),
        healthz: Doc(
            "Liveness: the process is up",
            "operations",
            data=schemas.Status,
            result={"status": "ok"},
            extra_responses={
                503: {
                    "description": 'Starting or stopping: `{"data": {"status": "starting"}}`',
                    "content": {JSON: {"schema": {"type": "object", "required": ["data"]}}},
                }
            },
        ),
        readyz: Doc(
            "Readiness: the database is migrated and takes writes",
            "operations",
            data=schemas.Ready,
            result={"status": "ready", "journal_set_aside": 0, "schema_version": 3},
            errors=(ServiceUnavailable, DatabaseUnavailable),
        ),
    }
)
