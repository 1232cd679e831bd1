"""The partners' portal (CONTRACT 14): pages under `/partner/` for a partner signed in with a
one-time link (api/portal.py): their programs, each program's referral link, link builder,
promo codes and month-by-month numbers with a chart, their commission lines, their payouts (with
CSV downloads) and their payout details (a form, CSRF-checked).

Handlers are thin, as the dashboard's: the signed-in partner (`portal.current`), their place in
the program of the path (`membership`: 404 for any other program), then reads for that partner
only (reports/portal.py) or the services (ingest/partners.py). Pages are phone-first in the
dashboard's look (its stylesheet and copy-button script).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from api import portal
from api.auth import state
from api.forms import problems, read_form
from api.http import validate
from api.openapi import HTML, PARTNER_SESSION, Doc, Param, document
from api.pages import PAGE_HEADERS, SCRIPT_HEADERS, label, money, when
from api.routes.reports import report_response
from api.session import CSRF_FIELD, CsrfRefused, LoginRequired
from api.state import State, read_tables
from api.templating import templates
from ingest import partners
from ingest.domain.errors import NotFound, TallyError, ValidationFailed
from ingest.domain.inputs import PayoutDetailsIn
from ingest.domain.tokens import token_hash
from ingest.storage.contract import Reader
from reports import charts, payouts, statements
from reports import portal as numbers
from reports.money import minimum_text

Handler = Callable[[Request], Awaitable[Response]]
HOME = portal.PORTAL_PATH
PROGRAM = "/partner/programs/{program_id}"
PAGE_MAX = 2048  # the link builder's page address


def render(
    template: str,
    status: int = 200,
    viewer: portal.PartnerViewer | None = None,
    script: bool = False,
    **context: Any,
) -> Response:
    """A portal page (the dashboard's headers; `script` loads its copy buttons)."""
    values: dict[str, Any] = {
        "page_script": script,
        "viewer": viewer,
        "csrf_field": CSRF_FIELD,
        "csrf_token": viewer.csrf_token if viewer is not None else None,
        "money": money,
        "when": when,
        "label": label,
        **context,
    }
    html = templates.get_template(f"portal/{template}").render(values)
    return HTMLResponse(html, status, headers=SCRIPT_HEADERS if script else PAGE_HEADERS)


def error_page(status: int, code: str, message: str, viewer: portal.PartnerViewer | None = None) -> Response:
    return render("error.html", status, viewer, status_code=status, code=code, message=message)


def page(handler: Handler) -> Handler:
    """Refusals as a browser needs them: no session, to the portal's front page (which says how
    to sign in); anything else an HTML error page with the contract's code."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except LoginRequired:
            return RedirectResponse(HOME, 303)
        except CsrfRefused as exc:
            return error_page(403, "csrf_refused", exc.message)
        except TallyError as exc:
            return error_page(exc.status, exc.code, exc.message)

    return wrapped


async def viewer(request: Request) -> portal.PartnerViewer:
    return await asyncio.to_thread(portal.current, request, state(request).store)


async def place(request: Request) -> tuple[portal.PartnerViewer, portal.Membership]:
    """The signed-in partner and their place in the program of the path (404 otherwise)."""
    who = await viewer(request)
    return who, who.membership(request.path_params["program_id"])


def base_of(member: portal.Membership) -> str:
    return f"{HOME}/programs/{quote(member.program.program_id, safe='')}"


def with_aff(address: str, code: str) -> str | None:
    """`address` with `aff=<code>` in its query (replacing one there), or None when it is not an
    http(s) address."""
    parts = urlsplit(address.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or len(address) > PAGE_MAX:
        return None
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "aff"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("aff", code)])))


# -- sign in and out ----------------------------------------------------------------------------
@page
async def home(request: Request) -> Response:
    try:
        who = await viewer(request)
    except LoginRequired:
        return render("signed_out.html")
    return render("home.html", viewer=who)


@page
async def sign_in_page(request: Request) -> Response:
    """The link's page: a button that signs in (a GET never uses the link up)."""
    token = request.path_params["token"]
    csrf = portal.sign_in_csrf_token(request)
    response = render("sign_in.html", token=token, csrf_token=csrf)
    portal.set_sign_in_csrf_cookie(request, response, csrf)
    return response


@page
async def sign_in(request: Request) -> Response:
    form = await read_form(request)
    portal.check_sign_in_csrf(request, form)
    st = state(request)
    st.limiter.check(f"partner-sign-in:{request.client.host if request.client else '?'}")
    link = await asyncio.to_thread(partners.use_portal_link, st.store, form.get("token", ""))
    if link is None:
        return error_page(
            404,
            NotFound.code,
            "this sign-in link was used already or has expired (links work once, for seven days): ask the "
            "brand for a new one",
        )
    previous = request.cookies.get(portal.PORTAL_COOKIE)
    if previous:
        await asyncio.to_thread(st.store.end_partner_session, token_hash(previous))
    session_id, _ = await asyncio.to_thread(portal.open_session, st.store, link)
    target = f"{HOME}/programs/{quote(link.program_id, safe='')}"
    response = RedirectResponse(target, 303)
    portal.set_session_cookie(request, response, session_id)
    portal.clear_sign_in_csrf_cookie(request, response)
    return response


@page
async def sign_out(request: Request) -> Response:
    who = await viewer(request)
    form = await read_form(request)
    portal.check_csrf(request, who, form)
    await asyncio.to_thread(state(request).store.end_partner_session, who.session.session_hash)
    response = RedirectResponse(HOME, 303)
    portal.clear_session_cookie(request, response)
    return response


# -- a program ----------------------------------------------------------------------------------
def _overview(db: Reader, program_id: str, code: str) -> tuple[list[numbers.Month], list[dict[str, Any]]]:
    with db.consistent():
        return numbers.months(db, program_id, code), partners.promo_codes(db, program_id, code)


def _charts(months: list[numbers.Month]) -> tuple[Markup | None, list[tuple[str, Markup]]]:
    """The activity chart (clicks, sign-ups, sales) and one earnings chart per currency."""
    if not months:
        return None, []
    periods = [m.period for m in months]
    activity = charts.activity_chart(
        periods,
        {
            "Clicks": [m.clicks for m in months],
            "Sign-ups": [m.signups for m in months],
            "Sales": [m.sales for m in months],
        },
    )
    currencies = sorted({c for m in months for c in m.commission})
    earnings = [
        (c, Markup(charts.earnings_chart(periods, [m.commission.get(c, 0) for m in months], c)))  # noqa: S704
        for c in currencies
    ]
    return Markup(activity), earnings  # noqa: S704 (our own SVG, made safe by reports/charts.py)


@page
async def program_page(request: Request) -> Response:
    who, member = await place(request)
    program, partner = member.program, member.partner
    st = state(request)
    months, promo_codes = await read_tables(st.store, _overview, program.program_id, partner.code)
    activity, earnings = await asyncio.to_thread(_charts, months)
    site = program.settings.website_url
    page_address = request.query_params.get("page")
    built = with_aff(page_address, partner.code) if page_address else None
    return render(
        "program.html",
        viewer=who,
        script=True,
        program=program,
        partner=partner,
        base=base_of(member),
        referral_link=with_aff(site, partner.code) if site else None,
        page=page_address,
        built_link=built,
        page_error="Enter the address of a page, starting with https:// or http://"
        if page_address and built is None
        else None,
        promo_codes=promo_codes,
        months=months,
        activity_chart=activity,
        earnings_charts=earnings,
    )


@page
async def commissions_page(request: Request) -> Response:
    who, member = await place(request)
    found = await read_tables(
        state(request).store, numbers.lines, member.program.program_id, member.partner.code
    )
    return render(
        "commissions.html",
        viewer=who,
        program=member.program,
        partner=member.partner,
        base=base_of(member),
        lines=found,
    )


@page
async def payouts_page(request: Request) -> Response:
    who, member = await place(request)
    program, partner = member.program, member.partner
    rows = await read_tables(state(request).store, numbers.payout_rows, program.program_id, partner.code)
    if request.query_params.get("format") == "csv":
        return report_response(numbers.payouts_csv(rows), payouts.CSV, f"payouts-{partner.code}.csv", "csv")
    return render(
        "payouts.html",
        viewer=who,
        program=program,
        partner=partner,
        base=base_of(member),
        rows=rows,
        minimum=minimum_text(program.settings.payout_minimum),
    )


@page
async def statement_page(request: Request) -> Response:
    """The partner's statement in each currency they have lines in (CONTRACT 15: the same
    statement the brand's API gives); `format=csv&currency=xxx` downloads one."""
    who, member = await place(request)
    program, partner = member.program, member.partner
    store = state(request).store
    owed = await read_tables(store, statements.balances, program.program_id, [partner.code])
    currencies = [str(b["currency"]) for b in owed.get(partner.code, [])]
    if request.query_params.get("format") == "csv":
        currency = (request.query_params.get("currency") or "").lower()
        if currency not in currencies:
            raise NotFound(f"no statement in {currency or 'that currency'}")
        found = await read_tables(store, statements.statement, program.program_id, partner.code, currency)
        name = f"statement-{partner.code}-{currency}.csv"
        return report_response(statements.to_csv(found), statements.CSV, name, "csv")
    pid = program.program_id
    shown = [await read_tables(store, statements.statement, pid, partner.code, c) for c in currencies]
    return render(
        "statement.html",
        viewer=who,
        program=program,
        partner=partner,
        base=base_of(member),
        statements=shown,
    )


@page
async def payout_lines(request: Request) -> Response:
    """The partner's lines one payout took, as CSV; 404 for a batch that took none of theirs."""
    _, member = await place(request)
    payout_id = request.path_params["payout_id"]
    found = await read_tables(
        state(request).store, numbers.batch_lines, member.program.program_id, member.partner.code, payout_id
    )
    if not found:
        raise NotFound("no such page")
    name = f"payout-{payout_id}-{member.partner.code}.csv"
    return report_response(numbers.lines_csv(found), payouts.CSV, name, "csv")


def _details_form(st: State, member: portal.Membership) -> dict[str, Any]:
    current = st.store.payout_details(member.program.program_id).get(member.partner.code)
    return partners.payout_view(current)


@page
async def details_page(request: Request) -> Response:
    who, member = await place(request)
    st = state(request)
    form = await asyncio.to_thread(_details_form, st, member)
    return render(
        "details.html",
        viewer=who,
        program=member.program,
        partner=member.partner,
        base=base_of(member),
        form=form,
        saved=request.query_params.get("saved") == "1",
    )


@page
async def save_details(request: Request) -> Response:
    who, member = await place(request)
    form = await read_form(request)
    portal.check_csrf(request, who, form)
    fields = {name: form.get(name, "").strip() for name in partners.PAYOUT_FIELDS}
    st = state(request)
    try:
        inp = validate(PayoutDetailsIn, fields)
    except ValidationFailed as exc:
        return render(
            "details.html",
            exc.status,
            viewer=who,
            program=member.program,
            partner=member.partner,
            base=base_of(member),
            form=fields,
            errors=problems(exc),
        )
    await asyncio.to_thread(
        partners.set_payout_details, st.store, member.program.program_id, member.partner.code, inp, "partner"
    )
    return RedirectResponse(f"{base_of(member)}/payout-details?saved=1", 303)


routes = [
    Route(HOME, home, methods=["GET"]),
    Route(f"{portal.SIGN_IN_PATH}/{{token}}", sign_in_page, methods=["GET"]),
    Route(portal.SIGN_IN_PATH, sign_in, methods=["POST"]),
    Route(f"{HOME}/sign-out", sign_out, methods=["POST"]),
    Route(PROGRAM, program_page, methods=["GET"]),
    Route(f"{PROGRAM}/commissions", commissions_page, methods=["GET"]),
    Route(f"{PROGRAM}/payouts", payouts_page, methods=["GET"]),
    Route(f"{PROGRAM}/payouts/{{payout_id}}", payout_lines, methods=["GET"]),
    Route(f"{PROGRAM}/statement", statement_page, methods=["GET"]),
    Route(f"{PROGRAM}/payout-details", details_page, methods=["GET"]),
    Route(f"{PROGRAM}/payout-details", save_details, methods=["POST"]),
]

# -- the API reference's entries (api/openapi.py) -------------------------------------------------
_PAGE = {HTML: {"schema": {"type": "string"}}}
_CSV = {"text/csv": {"schema": {"type": "string"}}}
_TO_FRONT = {303: {"description": "No partner session: to the portal's front page (how to sign in)"}}
_FORM = {
    "type": "object",
    "description": "An urlencoded form carrying the page's CSRF token (`csrf_token`)",
    "properties": {"csrf_token": {"type": "string"}},
}
_PROGRAM_ID = Param("program_id", {"type": "string", "minLength": 1}, where="path", example="prog_3k9a")


def _portal(summary: str, form: bool = False, content: dict[str, Any] | None = None, **kw: Any) -> Doc:
    return Doc(
        summary,
        "portal",
        description="The signed-in partner's own rows only: any other program, partner or batch is 404.",
        auth=(PARTNER_SESSION,),
        content=content or _PAGE,
        body_schema=_FORM if form else None,
        body_media="application/x-www-form-urlencoded",
        extra_responses={**_TO_FRONT, 403: {"description": "`csrf_refused` (an HTML page)"}},
        html_errors=True,
        **kw,
    )


document(
    {
        home: Doc(
            "The partners' portal: the partner's programs, or how to sign in",
            "portal",
            content=_PAGE,
        ),
        sign_in_page: Doc(
            "A sign-in link's page: a button that signs the partner in (the GET uses nothing up)",
            "portal",
            content=_PAGE,
            params=(Param("token", {"type": "string", "minLength": 1}, where="path", example="ptl_..."),),
        ),
        sign_in: Doc(
            "Sign in with a one-time link's token (sets the partner session cookie)",
            "portal",
            content=_PAGE,
            body_schema={
                "type": "object",
                "properties": {"token": {"type": "string"}, "csrf_token": {"type": "string"}},
            },
            body_media="application/x-www-form-urlencoded",
            extra_responses={
                303: {"description": "Signed in: to the link's program"},
                403: {"description": "`csrf_refused` (an HTML page)"},
                404: {
                    "description": "`not_found`: the link was used, expired or never existed (an HTML page)"
                },
            },
            html_errors=True,
        ),
        sign_out: _portal("Sign out", form=True),
        program_page: _portal(
            "A program: referral link, link builder, promo codes, numbers by month with charts",
            params=(_PROGRAM_ID, Param("page", {"type": "string"}, "a page of the brand's site to link to")),
            errors=(NotFound,),
        ),
        commissions_page: _portal(
            "The partner's commission lines, with why held, void, clawback and adjustment lines are so",
            params=(_PROGRAM_ID,),
            errors=(NotFound,),
        ),
        payouts_page: _portal(
            "The partner's payouts (html, or csv with `format=csv`)",
            params=(_PROGRAM_ID, Param("format", {"type": "string", "enum": ["html", "csv"]})),
            content={**_PAGE, **_CSV},
            errors=(NotFound,),
        ),
        statement_page: _portal(
            "The partner's statement per currency (html, or csv of one currency with `format=csv`)",
            params=(
                _PROGRAM_ID,
                Param("format", {"type": "string", "enum": ["html", "csv"]}),
                Param("currency", {"type": "string", "pattern": "^[A-Za-z]{3}$"}, "csv: its currency"),
            ),
            content={**_PAGE, **_CSV},
            errors=(NotFound,),
        ),
        payout_lines: _portal(
            "The partner's lines a payout took, as CSV",
            params=(
                _PROGRAM_ID,
                Param("payout_id", {"type": "string", "minLength": 1}, where="path", example="po_5e1f"),
            ),
            content=_CSV,
            errors=(NotFound,),
        ),
        details_page: _portal("The partner's payout details form", params=(_PROGRAM_ID,), errors=(NotFound,)),
        save_details: _portal(
            "Save the partner's payout details (method, account email, name, currency)",
            form=True,
            params=(_PROGRAM_ID,),
            errors=(NotFound, ValidationFailed),
        ),
    }
)
