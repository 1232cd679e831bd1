"""Rendering dashboard pages: the template call, the headers every page carries, the HTML error
page, and the display helpers templates use (money in minor units, times)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from starlette.responses import HTMLResponse, Response

from api.auth import Account
from api.session import CSRF_FIELD, Session
from api.templating import templates
from ingest.clock import rfc3339

# No script runs on these pages; styles come from our own stylesheet; nobody may frame them.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
STYLESHEET = Path(__file__).parent / "static" / "dashboard.css"

# Currencies whose amounts are already whole units (no minor unit), as the processor defines them.
ZERO_DECIMAL = frozenset(
    {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv", "xaf"}
    | {"xof", "xpf"}
)

CHECKLIST_LABELS = {
    "api_key_generated": "API key generated",
    "test_sale_received": "Test sale received",
    "click_received": "Click received",
    "lead_received": "Lead received",
    "sale_received": "Sale received",
    "processor_event_received": "Payment-processor event received",
}


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the session (id and CSRF token) and the account's workspace roles."""

    session_id: str
    session: Session
    account: Account

    def is_owner(self, workspace_id: str) -> bool:
        return self.account.roles.get(workspace_id) == "owner"


def money(amount: int | None, currency: str | None) -> str:
    """`1234, "usd"` -> `12.34 USD`; integer arithmetic only."""
    if amount is None:
        return "—"
    code = (currency or "").lower()
    if code in ZERO_DECIMAL:
        return f"{amount} {code.upper()}"
    sign = "-" if amount < 0 else ""
    units, cents = divmod(abs(amount), 100)
    return f"{sign}{units}.{cents:02d} {code.upper()}"


def when(value: datetime | None) -> str:
    return rfc3339(value) if value is not None else "—"


def render(template: str, status: int = 200, viewer: Viewer | None = None, **context: Any) -> Response:
    values: dict[str, Any] = {
        "viewer": viewer,
        "csrf_field": CSRF_FIELD,
        "csrf_token": viewer.session.csrf_token if viewer is not None else None,
        "money": money,
        "when": when,
        "checklist_labels": CHECKLIST_LABELS,
    }
    values.update(context)
    html = templates.get_template(f"dashboard/{template}").render(values)
    return HTMLResponse(html, status, headers=PAGE_HEADERS)


def error_page(status: int, code: str, message: str, viewer: Viewer | None = None) -> Response:
    return render("error.html", status, viewer, status_code=status, code=code, message=message)


@cache
def stylesheet() -> bytes:
    return STYLESHEET.read_bytes()
