"""The dashboard: server-rendered pages for account holders, who log in with their account token.

Handlers are thin: check the session (and, on POST, the CSRF token), call the same services as
the JSON API (`ingest/control.py`, the store's reads, `reports/reads.py`), render a template.
Without a session a page redirects (303) to the login form; errors are HTML pages that carry the
contract's error code (a program of another workspace is a 404, a member's owner action a 403).
The tracking log, sales and explain are in api/routes/dashboard_sales.py, the Payouts tab in
api/routes/dashboard_payouts.py.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from api.auth import Account, account_id_for_token, account_program, state
from api.forms import (
    EVERY,
    FLAT_CURRENCIES,
    PER_CURRENCY,
    SETTINGS_LABELS,
    bps_to_percent,
    partner_data,
    posted_rows,
    problems,
    read_form,
    row_names,
    setting_rows,
    settings_data,
    settings_problems,
)
from api.http import validate
from api.openapi import DASHBOARD_SESSION, HTML, Doc, Param, document
from api.pages import Viewer, error_page, render, script, stylesheet
from api.routes.accounts import CHECKLIST_STEPS
from api.routes.demo import DEMO_SHOP
from api.routes.reports import (
    DOWNLOADS,
    PERIOD,
    finance_report,
    format_param,
    period_param,
    report_response,
)
from api.session import (
    SESSION_COOKIE,
    CsrfRefused,
    LoginRequired,
    check_csrf,
    check_login_csrf,
    clear_login_csrf_cookie,
    clear_session_cookie,
    current_session,
    login_csrf_token,
    sessions,
    set_login_csrf_cookie,
    set_session_cookie,
)
from api.settings import Settings
from api.state import State
from ingest import control
from ingest import partners as partner_services
from ingest.domain.clock import utcnow
from ingest.domain.errors import (
    Conflict,
    ProgramNotFound,
    RateLimited,
    StripeAccountInUse,
    TallyError,
    ValidationFailed,
)
from ingest.domain.inputs import PartnerIn, SettingsPatch
from ingest.domain.records import Partner, Program
from reports import load
from reports.html import REPORT_CSS, finance_body
from reports.money import per_currency_text
from reports.render import FINANCE_FORMATS

Handler = Callable[[Request], Awaitable[Response]]
HOME = "/dashboard"
LOGIN = "/dashboard/login"


def page(handler: Handler) -> Handler:
    """Turn refusals into what a browser needs: a redirect to log in, or an HTML error page."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except LoginRequired:
            return RedirectResponse(LOGIN, 303)
        except CsrfRefused as exc:
            return error_page(403, "csrf_refused", exc.message)
        except TallyError as exc:
            return error_page(exc.status, exc.code, exc.message)

    return wrapped


def viewer(request: Request) -> Viewer:
    session_id, session = current_session(request)
    roles = state(request).store.workspaces_of(session.account_id)
    return Viewer(session_id, session, Account(session.account_id, roles))


async def posted(request: Request) -> tuple[Viewer, dict[str, str]]:
    """The viewer of a dashboard POST and its form, once the CSRF checks pass."""
    who = viewer(request)
    form = await read_form(request)
    check_csrf(request, who.session, form)
    return who, form


def program_url(program: Program, suffix: str = "") -> str:
    return f"{HOME}/programs/{quote(program.program_id, safe='')}{suffix}"


# -- login and logout ----------------------------------------------------------------------------
def login_page(request: Request, status: int = 200, error: str | None = None) -> Response:
    token = login_csrf_token(request)
    response = render("login.html", status, csrf_token=token, error=error)
    set_login_csrf_cookie(request, response, token)
    return response


@page
async def login_form(request: Request) -> Response:
    try:
        current_session(request)
    except LoginRequired:
        return login_page(request)
    return RedirectResponse(HOME, 303)


@page
async def login(request: Request) -> Response:
    form = await read_form(request)
    check_login_csrf(request, form)
    st = state(request)
    st.limiter.check(f"dashboard-login:{request.client.host if request.client else '?'}")
    account_id = account_id_for_token(st.store, form.get("token", "").strip())
    if account_id is None:
        return login_page(request, 401, "That is not a valid account token (acct_...).")
    previous = request.cookies.get(SESSION_COOKIE)
    if previous:
        sessions(request).end(previous)
    session_id, _ = sessions(request).create(account_id)
    response = RedirectResponse(HOME, 303)
    set_session_cookie(request, response, session_id)
    clear_login_csrf_cookie(request, response)
    return response


@page
async def logout(request: Request) -> Response:
    who, _ = await posted(request)
    sessions(request).end(who.session_id)
    response = RedirectResponse(LOGIN, 303)
    clear_session_cookie(request, response)
    return response


# -- programs --------------------------------------------------------------------------------------
@page
async def programs(request: Request) -> Response:
    who = viewer(request)
    store = state(request).store
    rows = [
        {**control.program_view(store, p), "role": who.account.roles[p.workspace_id]}
        for p in store.programs_in(sorted(who.account.workspace_ids))
    ]
    return render("programs.html", viewer=who, programs=rows)


NEW_KEY = "new_api_key:"  # + program id: the key shown once after regenerating


def settings_values(view: dict[str, Any], form: dict[str, str] | None) -> dict[str, Any]:
    """What the settings form shows: the posted strings after a refusal, else the program's
    settings as percent and, for each per-currency setting, its rows (`rows`: setting ->
    [{amount, currency}], api/forms.py `setting_rows`)."""
    if form is not None:
        rows = {name: posted_rows(form, name) for name in PER_CURRENCY}
        return {
            **form,
            "requires_server_side_leads": form.get("requires_server_side_leads") == "on",
            "rows": rows,
        }
    months = view["recurring_months"]
    return {
        "name": view["name"],
        "commission_type": view["commission_type"],
        "commission_percent": bps_to_percent(view["commission_bps"]),
        "recurring_months": "" if months is None else str(months),
        "platform_fee_percent": bps_to_percent(view["platform_fee_bps"]),
        "holding_days": str(view["holding_days"]),
        "requires_server_side_leads": view["requires_server_side_leads"],
        "stripe_account_id": view["stripe_account_id"] or "",
        "website_url": view["website_url"] or "",
        "rows": {name: setting_rows(view[name]) for name in PER_CURRENCY},
    }


def row_currencies(rows: dict[str, list[dict[str, str]]]) -> list[str]:
    """The currencies a row may choose: the usual ones, and any other a row holds (set through
    the API), so that saving the form never drops one."""
    held = {row["currency"] for setting in rows.values() for row in setting}
    extra = sorted(code for code in held if code and code != EVERY and code not in FLAT_CURRENCIES)
    return [*FLAT_CURRENCIES, *extra]


def integration(settings: Settings, program: Program, partners: list[Partner]) -> dict[str, Any]:
    """What the checklist's how-to names: this server's address (`TALLY_BASE_URL`), a partner
    code for the example link, the demo page for this program, and how many webhook signing
    secrets the server has (never what they are)."""
    code = partners[0].code if partners else None
    query = urlencode({"program_id": program.program_id, **({"aff": code} if code else {})})
    return {
        "base_url": settings.base_url,
        "partner_code": code,
        "demo_url": f"{settings.base_url}{DEMO_SHOP}?{query}",
        "webhook_secrets": len(settings.webhook_secrets()),
    }


def program_page(
    request: Request,
    who: Viewer,
    program: Program,
    status: int = 200,
    settings_form: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    st = state(request)
    store = st.store
    done = store.checklist(program.program_id)
    view = control.program_view(store, program)
    partners = store.partners(program.program_id)
    details = store.payout_details(program.program_id)
    form_values = settings_values(view, settings_form)
    return render(
        "program.html",
        status,
        who,
        script=True,  # the checklist's copy buttons
        integration=integration(st.settings, program, partners),
        program=view,
        settings=form_values,
        settings_labels=SETTINGS_LABELS,
        flat_currencies=row_currencies(form_values["rows"]),
        every_currency=EVERY,
        row_names=row_names,
        per_currency_text=per_currency_text,
        bps_to_percent=bps_to_percent,
        is_owner=who.is_owner(program.workspace_id),
        checklist=[(key, done.get(key)) for key in CHECKLIST_STEPS],
        key_generated="api_key_generated" in done,
        partners=[
            {**control.partner_view(p), **partner_services.payout_view(details.get(p.code))} for p in partners
        ],
        **extra,
    )


def owned_program(request: Request, who: Viewer) -> Program:
    program = account_program(request, who.account)
    control.require_owner(state(request).store, program.workspace_id, who.account.account_id)
    return program


@page
async def program_settings(request: Request) -> Response:
    who = viewer(request)
    program = account_program(request, who.account)
    saved = request.query_params.get("saved") == "1"
    new_key = sessions(request).take_once(who.session_id, NEW_KEY + program.program_id)
    key_was_shown = new_key is None and request.query_params.get("key") == "new"
    return program_page(request, who, program, saved=saved, new_key=new_key, key_was_shown=key_was_shown)


@page
async def confirm_regenerate(request: Request) -> Response:
    """The confirmation step: what regenerating does, and the button that does it."""
    who = viewer(request)
    program = owned_program(request, who)
    store = state(request).store
    view = control.program_view(store, program)
    generated = "api_key_generated" in store.checklist(program.program_id)
    return render("confirm_key.html", viewer=who, program=view, key_generated=generated)


@page
async def regenerate_key(request: Request) -> Response:
    """Regenerate once confirmed, then redirect (303) to the settings page, which shows the new
    key once: a reload shows the settings page again and never posts a second time."""
    who, form = await posted(request)
    program = owned_program(request, who)
    if form.get("confirm") != "regenerate":  # not from the confirmation page: ask first
        return RedirectResponse(program_url(program, "/api-key"), 303)
    st = state(request)
    issued = await control.regenerate_key(st.store, st.writer, program)
    sessions(request).show_once(who.session_id, NEW_KEY + program.program_id, issued["api_key"])
    return RedirectResponse(program_url(program, "?key=new#api-key"), 303)


@page
async def add_partner(request: Request) -> Response:
    who, form = await posted(request)
    program = owned_program(request, who)
    fields, data = partner_data(form)
    st = state(request)
    try:
        await control.add_partner(st.store, st.writer, program, validate(PartnerIn, data))
    except (ValidationFailed, Conflict) as exc:
        return program_page(
            request, who, program, exc.status, partner_errors=problems(exc), partner_form=fields
        )
    return RedirectResponse(program_url(program, "#partners"), 303)


@page
async def update_settings(request: Request) -> Response:
    who, form = await posted(request)
    program = owned_program(request, who)
    try:
        inp = validate(SettingsPatch, settings_data(form))
        st = state(request)
        await control.update_program(st.store, st.writer, program, inp, who.account.account_id)
    except (ValidationFailed, StripeAccountInUse) as exc:
        return program_page(
            request, who, program, exc.status, settings_form=form, settings_errors=settings_problems(exc)
        )
    return RedirectResponse(program_url(program, "?saved=1#settings"), 303)


# -- finance report ---------------------------------------------------------------------------------
def _report_body(st: State, program: Program, period: str) -> Markup:
    with st.store.reader() as db:
        return finance_body(load.finance(db, program.program_id, period, program_name=program.name))


@page
async def finance(request: Request) -> Response:
    """The finance report of a month (this month by default) with its charts, and its downloads."""
    who = viewer(request)
    program = account_program(request, who.account)
    period = period_param(request) or utcnow().strftime("%Y-%m")
    st = state(request)
    body = await asyncio.to_thread(_report_body, st, program, period)
    view = control.program_view(st.store, program)
    return render("finance.html", viewer=who, program=view, period=period, report=body)


@page
async def finance_export(request: Request) -> Response:
    """The finance report as a file (csv, xlsx, html) for the session's browser."""
    who = viewer(request)
    program = account_program(request, who.account)
    period = period_param(request, required=True)
    assert period is not None
    fmt = format_param(request, tuple(f for f in FINANCE_FORMATS if f != "json"))
    found = await finance_report(state(request), program.program_id, program.name, period, fmt)
    return report_response(*found, fmt)


async def css(request: Request) -> Response:
    headers = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
    return Response(stylesheet(), media_type="text/css", headers=headers)


async def js(request: Request) -> Response:
    headers = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
    return Response(script(), media_type="application/javascript", headers=headers)


async def finance_css(request: Request) -> Response:
    headers = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
    return Response(REPORT_CSS, media_type="text/css", headers=headers)


PROGRAM = "/dashboard/programs/{program_id}"
routes = [
    Route("/dashboard", programs, methods=["GET"]),
    Route("/dashboard/static/dashboard.css", css, methods=["GET"]),
    Route("/dashboard/static/dashboard.js", js, methods=["GET"]),
    Route("/dashboard/static/finance.css", finance_css, methods=["GET"]),
    Route(LOGIN, login_form, methods=["GET"]),
    Route(LOGIN, login, methods=["POST"]),
    Route("/dashboard/logout", logout, methods=["POST"]),
    Route(PROGRAM, program_settings, methods=["GET"]),
    Route(PROGRAM + "/settings", update_settings, methods=["POST"]),
    Route(PROGRAM + "/api-key", confirm_regenerate, methods=["GET"]),
    Route(PROGRAM + "/api-key", regenerate_key, methods=["POST"]),
    Route(PROGRAM + "/partners", add_partner, methods=["POST"]),
    Route(PROGRAM + "/finance", finance, methods=["GET"]),
    Route(PROGRAM + "/finance/export", finance_export, methods=["GET"]),
]

# -- the API reference's entries for these pages (api/openapi.py) ----------------------------------
_PAGE = {HTML: {"schema": {"type": "string"}}}
_TO_LOGIN = {
    303: {"description": "No session (or it ended): to the login form; after a form, on to its page"}
}
_FORM = {
    "type": "object",
    "description": "An urlencoded form carrying the page's CSRF token (`csrf_token`)",
    "properties": {"csrf_token": {"type": "string"}},
}


def _page(summary: str, form: bool = False, content: dict[str, Any] | None = None, **kw: Any) -> Doc:
    extra = {**_TO_LOGIN, 403: {"description": "`csrf_refused` or `owner_required` (an HTML page)"}}
    return Doc(
        summary,
        "dashboard",
        auth=(DASHBOARD_SESSION,),
        content=content or _PAGE,
        body_schema=_FORM if form else None,
        body_media="application/x-www-form-urlencoded",
        extra_responses=extra,
        html_errors=True,
        **kw,
    )


document(
    {
        programs: _page("Programs"),
        css: Doc(
            "The dashboard stylesheet", "dashboard", content={"text/css": {"schema": {"type": "string"}}}
        ),
        js: Doc(
            "The dashboard's script (the copy buttons)",
            "dashboard",
            content={"application/javascript": {"schema": {"type": "string"}}},
        ),
        finance_css: Doc(
            "The finance report stylesheet", "dashboard", content={"text/css": {"schema": {"type": "string"}}}
        ),
        login_form: Doc("The login form", "dashboard", content=_PAGE, extra_responses=_TO_LOGIN),
        login: Doc(
            "Log in with an account token (sets the session cookie)",
            "dashboard",
            content=_PAGE,
            body_schema={
                "type": "object",
                "properties": {"token": {"type": "string"}, "csrf_token": {"type": "string"}},
            },
            body_media="application/x-www-form-urlencoded",
            extra_responses={**_TO_LOGIN, 403: {"description": "`csrf_refused` (an HTML page)"}},
            errors=(RateLimited,),
            html_errors=True,
        ),
        logout: _page("Log out", form=True),
        program_settings: _page("A program: settings, key, partners, checklist", errors=(ProgramNotFound,)),
        update_settings: _page("Save a program's settings", form=True, errors=(ProgramNotFound,)),
        confirm_regenerate: _page(
            "Confirm before the program key is generated or regenerated", errors=(ProgramNotFound,)
        ),
        regenerate_key: _page("Generate or regenerate the program key", form=True, errors=(ProgramNotFound,)),
        add_partner: _page("Add a partner", form=True, errors=(ProgramNotFound,)),
        finance: _page(
            "The finance report of a month",
            params=(Param("period", PERIOD.schema, "YYYY-MM (default: this month)"),),
            errors=(ProgramNotFound, ValidationFailed),
        ),
        finance_export: _page(
            "The finance report as a file",
            params=(
                Param("period", PERIOD.schema, "YYYY-MM", required=True),
                Param("format", {"type": "string", "enum": [f for f in FINANCE_FORMATS if f != "json"]}),
            ),
            content=DOWNLOADS,
            errors=(ProgramNotFound, ValidationFailed),
        ),
    }
)
