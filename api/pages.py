"""Rendering dashboard pages: the template call, the headers every page carries, the HTML error
page, and the display helpers templates use: money (reports/money.py's one formatter), times as
dates with the full timestamp on hover, and codes as human labels with the code on hover."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from starlette.responses import HTMLResponse, Response

from api.auth import Account
from api.session import CSRF_FIELD, Session
from api.templating import templates
from reports.labels import label_html, when_html
from reports.money import money_text

# No script runs on these pages (but our own copy buttons' on the page that has them, see
# SCRIPT_HEADERS); styles come from our own stylesheet; nobody may frame them.
_CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": _CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
# A page with copy buttons loads our one script (api/static/dashboard.js), and nothing else.
SCRIPT_HEADERS = {**PAGE_HEADERS, "Content-Security-Policy": _CSP + "; script-src 'self'"}
STYLESHEET = Path(__file__).parent / "static" / "dashboard.css"
SCRIPT = Path(__file__).parent / "static" / "dashboard.js"


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the session (id and CSRF token) and the account's workspace roles."""

    session_id: str
    session: Session
    account: Account

    def is_owner(self, workspace_id: str) -> bool:
        return self.account.roles.get(workspace_id) == "owner"


money = money_text  # one money formatter for the dashboard and the reports


when = when_html  # dates as dates, the timestamp on hover
label = label_html  # codes as labels, the code on hover


# Tracking-log details that name an amount, in the minor units ingest wrote them with: an
# accepted track sale (`sale <transaction id> <amount> <currency>`) and a processor event
# (`<event type> <event id> <amount> <currency>`, maybe followed by notes in brackets).
_LOG_MONEY = (
    re.compile(r"^(?P<head>sale .+ )(?P<amount>[0-9]{1,13}) (?P<currency>[a-z]{3})(?P<tail>)$"),
    re.compile(
        r"^(?P<head>[a-z_]+(?:\.[a-z_]+)+ \S+ )(?P<amount>[0-9]{1,13}) (?P<currency>[a-z]{3})"
        r"(?P<tail>(?: \([^()]*\))*)$"
    ),
)


def log_detail(detail: str) -> str:
    """A tracking-log detail as people read it: its amount in the currency's units
    (`sale in_1 1250 usd` -> `sale in_1 12.50 USD`); any other detail as it is."""
    for pattern in _LOG_MONEY:
        found = pattern.match(detail)
        if found:
            money_part = money(int(found["amount"]), found["currency"])
            return f"{found['head']}{money_part}{found['tail']}"
    return detail


def render(
    template: str, status: int = 200, viewer: Viewer | None = None, script: bool = False, **context: Any
) -> Response:
    """A dashboard page; `script` loads the copy buttons' script (and lets its CSP allow it)."""
    values: dict[str, Any] = {
        "page_script": script,
        "viewer": viewer,
        "csrf_field": CSRF_FIELD,
        "csrf_token": viewer.session.csrf_token if viewer is not None else None,
        "money": money,
        "when": when,
        "label": label,
        "log_detail": log_detail,
    }
    values.update(context)
    html = templates.get_template(f"dashboard/{template}").render(values)
    return HTMLResponse(html, status, headers=SCRIPT_HEADERS if script else PAGE_HEADERS)


def error_page(status: int, code: str, message: str, viewer: Viewer | None = None) -> Response:
    return render("error.html", status, viewer, status_code=status, code=code, message=message)


@cache
def stylesheet() -> bytes:
    return STYLESHEET.read_bytes()


@cache
def script() -> bytes:
    return SCRIPT.read_bytes()
