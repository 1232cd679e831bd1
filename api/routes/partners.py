"""Partners' side of a program, for its owners (CONTRACT 14): one-time portal sign-in links
(emailed when the server has mail), promotion codes assigned to a partner, and the partner's
payout details. The services are ingest/partners.py's; the portal itself is api/routes/portal.py."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import finance, mail, schemas
from api.auth import account_program, require_account, state
from api.finance import currency_param
from api.http import body_model, ok, read_body
from api.openapi import ACCOUNT_TOKEN, Doc, Param, document
from api.routes.reports import format_param, moment_param, report_response
from api.state import read_tables
from ingest import control, partners
from ingest.domain.errors import (
    Conflict,
    NotFound,
    OwnerRequired,
    PartnerNotFound,
    ProgramNotFound,
    ReconcileRunning,
    ServiceUnavailable,
    ValidationFailed,
)
from ingest.domain.inputs import ManualEntryIn, PartnerPatch, PortalLinkIn, PromoCodeIn
from ingest.domain.records import Partner, Program
from reports import statements

PORTAL_SIGN_IN = "/partner/sign-in/"


def _partner(request: Request, program: Program) -> Partner:
    code = request.path_params["code"]
    found = state(request).store.partner(program.program_id, code)
    if found is None:
        raise PartnerNotFound(f"partner {code} not found in program {program.program_id}")
    return found


def _owned(request: Request) -> tuple[str, Program, Partner]:
    """The acting owner's account id, the program of the path (which it owns) and its partner."""
    account = require_account(request)
    program = account_program(request, account)
    control.require_owner(state(request).store, program.workspace_id, account.account_id)
    return account.account_id, program, _partner(request, program)


def _cannot_send(why: str) -> ValidationFailed:
    return ValidationFailed(
        f"the sign-in link cannot be emailed: {why}", fields=[{"field": "send", "message": why}]
    )


async def portal_link(request: Request) -> Response:
    actor, program, partner = _owned(request)
    raw = await read_body(request)
    inp = PortalLinkIn() if not raw.strip() else (await body_model(request, PortalLinkIn))[1]
    st = state(request)
    server = st.settings.mail
    if inp.send and server is None:
        raise _cannot_send("this server sends no mail (TALLY_SMTP_URL and TALLY_MAIL_FROM are not set)")
    if inp.send and partner.email is None:
        raise _cannot_send(f"partner {partner.code} has no email")
    token, link = await asyncio.to_thread(partners.new_portal_link, st.store, program, partner, actor)
    url = f"{st.settings.base_url}{PORTAL_SIGN_IN}{token}"
    if inp.send and server is not None and partner.email is not None:
        try:  # building the message may fail too: whatever fails, nobody got the link, so void it
            message = mail.portal_link_message(
                st.settings.mail_from, partner.email, partner.name, program.name, url, link.expires_at
            )
            await asyncio.to_thread(mail.send, server, message)
        except BaseException as exc:
            await asyncio.to_thread(partners.use_portal_link, st.store, token)
            if isinstance(exc, mail.MailFailed):
                raise ServiceUnavailable(f"{exc}; no link was sent, try again") from None
            raise
    return ok(request, {"url": url, "expires_at": link.expires_at, "sent": inp.send}, 201)


async def add_promo_code(request: Request) -> Response:
    actor, program, partner = _owned(request)
    _, inp = await body_model(request, PromoCodeIn)
    st = state(request)
    return ok(request, await partners.assign_promo_code(st.writer, program, partner, inp, actor), 201)


async def list_promo_codes(request: Request) -> Response:
    account = require_account(request)
    program = account_program(request, account)
    partner = _partner(request, program)
    st = state(request)
    return ok(request, await read_tables(st.store, partners.promo_codes, program.program_id, partner.code))


def partner_view(
    partner: Partner, details: Any, balances: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A partner as the owner's reads show it: with its payout details (null when unset) and its
    balances per currency (reports/statements.py)."""
    return {**control.partner_view(partner), **partners.payout_view(details), "balances": balances or []}


def _member_partner(request: Request) -> tuple[Program, Partner]:
    """The program of the path (the account is a member of its workspace) and its partner."""
    program = account_program(request, require_account(request))
    return program, _partner(request, program)


async def get_partner(request: Request) -> Response:
    program, partner = _member_partner(request)
    st = state(request)
    found = await finance.balances(st, program, [partner.code])
    details = st.store.payout_details(program.program_id).get(partner.code)
    return ok(request, partner_view(partner, details, found.get(partner.code)))


async def partner_statement(request: Request) -> Response:
    program, partner = _member_partner(request)
    fmt = format_param(request, statements.FORMATS)
    st = state(request)
    currency = currency_param(request)
    if currency is None:
        held = [
            b["currency"] for b in (await finance.balances(st, program, [partner.code])).get(partner.code, [])
        ]
        if len(held) > 1:
            message = f"partner {partner.code} has money in {', '.join(held)}: name one"
            raise ValidationFailed(
                message, fields=[{"field": "currency", "message": f"one of {', '.join(held)}"}]
            )
        currency = held[0] if held else None
    start, end = moment_param(request, "from", end=False), moment_param(request, "to", end=True)
    found: dict[str, Any]
    if currency is None:
        found = {
            "partner_code": partner.code,
            "currency": None,
            "from": start,
            "to": end,
            "opening_balance": 0,
            "entries": [],
            "closing_balance": 0,
        }
    else:
        found = await finance.statement(st, program, partner.code, currency, start, end)
    if fmt == "csv":
        name = f"statement-{program.program_id}-{partner.code}-{currency or 'none'}.csv"
        return report_response(statements.to_csv(found), statements.CSV, name, fmt)
    return ok(request, found)


async def add_adjustment(request: Request) -> Response:
    actor, program, partner = _owned(request)
    _, inp = await body_model(request, ManualEntryIn)
    st = state(request)
    made = await finance.add_manual_entry(st, program, partner, inp.amount, inp.currency, inp.reason, actor)
    return ok(request, made, 201)


async def patch_partner(request: Request) -> Response:
    actor, program, partner = _owned(request)
    _, inp = await body_model(request, PartnerPatch)
    st = state(request)
    details = await asyncio.to_thread(partners.patch_payout_details, st.store, program, partner, inp, actor)
    found = await finance.balances(st, program, [partner.code])
    return ok(request, partner_view(partner, details, found.get(partner.code)))


_PARTNER = "/api/v1/programs/{program_id}/partners/{code}"
routes = [
    Route(_PARTNER, get_partner, methods=["GET"]),
    Route(_PARTNER, patch_partner, methods=["PATCH"]),
    Route(f"{_PARTNER}/statement", partner_statement, methods=["GET"]),
    Route(f"{_PARTNER}/adjustments", add_adjustment, methods=["POST"]),
    Route(f"{_PARTNER}/portal-link", portal_link, methods=["POST"]),
    Route(f"{_PARTNER}/promo-codes", add_promo_code, methods=["POST"]),
    Route(f"{_PARTNER}/promo-codes", list_promo_codes, methods=["GET"]),
]

_OWNER = "An owner of the program's workspace."
_CODE = Param("code", {"type": "string", "minLength": 1}, where="path", example="alice")
_PROMO = {
    "program_id": "prog_3k9a",
    "partner_code": "alice",
    "code": "ALICE10",
    "promotion_code_id": "promo_1Q2w3E",
    "created_at": "2026-11-21T10:00:00Z",
}
PARTNER_OUT_EXAMPLE = {
    "partner_id": "ptn_4c1d",
    "program_id": "prog_3k9a",
    "code": "alice",
    "name": "Alice",
    "email": "alice@partner.test",
    "created_at": "2026-11-21T10:00:00Z",
    "payout_method": "paypal",
    "payout_email": "alice@paypal.test",
    "payout_name": "Alice Example",
    "payout_currency": "usd",
    "balances": [{"currency": "usd", "approved_unpaid": 4200, "pending": 1500, "held": 0}],
}
_STATEMENT = {
    "partner_code": "alice",
    "currency": "usd",
    "from": None,
    "to": None,
    "opening_balance": 0,
    "entries": [
        {
            "booked_at": "2026-02-01T00:00:05Z",
            "kind": "commission",
            "amount": 3000,
            "transaction_id": "in_1Qa",
            "payout_id": None,
            "reason": None,
            "balance": 3000,
        },
        {
            "booked_at": "2026-03-02T10:00:00Z",
            "kind": "payout",
            "amount": -3000,
            "transaction_id": None,
            "payout_id": "po_5e1f",
            "reason": "payout 1 paid",
            "balance": 0,
        },
    ],
    "closing_balance": 0,
}
_MEMBER = "Any member of the program's workspace."
document(
    {
        portal_link: Doc(
            "A one-time sign-in link to the partner's portal (valid 7 days), emailed with `send`",
            "partners",
            description=_OWNER + " The link opens the partner's portal (`/partner/`) once. With "
            '`{"send": true}` it is also emailed to the partner, through `TALLY_SMTP_URL` from '
            "`TALLY_MAIL_FROM`; without those settings, or for a partner without an email, "
            "`send` is refused (422 `validation_error` naming `send`) and no link is made. A mail "
            "server that does not take the message: 503 `service_unavailable`, the link voided.",
            auth=(ACCOUNT_TOKEN,),
            params=(_CODE,),
            body=PortalLinkIn,
            example={"send": False},
            status=201,
            data=schemas.PortalLink,
            result={
                "url": "https://tally.example/partner/sign-in/ptl_0123456789abcdefghijABCDEFGHIJ012345",
                "expires_at": "2026-11-28T10:00:00Z",
                "sent": False,
            },
            errors=(ProgramNotFound, NotFound, OwnerRequired, PartnerNotFound, ServiceUnavailable),
            writes=True,
        ),
        add_promo_code: Doc(
            "Assign a promotion code to a partner",
            "partners",
            description=_OWNER + " `code`: what customers type (a track sale's `promo_code` matches "
            "it, without case); `promotion_code_id`: the processor's `promo_...` id (a checkout's "
            "`discounts[].promotion_code` matches it). Such a sale is the partner's by rule "
            "`promo_code`, after the click id and before email. Appended to the raw log; a code or "
            "id a partner of the program has already: 409 `conflict`.",
            auth=(ACCOUNT_TOKEN,),
            params=(_CODE,),
            body=PromoCodeIn,
            example={"code": "ALICE10", "promotion_code_id": "promo_1Q2w3E"},
            status=201,
            data=schemas.PromoCode,
            result=_PROMO,
            errors=(ProgramNotFound, NotFound, OwnerRequired, PartnerNotFound, Conflict),
            writes=True,
        ),
        list_promo_codes: Doc(
            "A partner's promotion codes",
            "partners",
            description="Any member of the program's workspace.",
            auth=(ACCOUNT_TOKEN,),
            params=(_CODE,),
            data=list[schemas.PromoCode],
            result=[_PROMO],
            errors=(ProgramNotFound, PartnerNotFound),
        ),
        patch_partner: Doc(
            "Set a partner's payout details (PayPal or Wise)",
            "partners",
            description=_OWNER + " Only the fields sent change; together they must name the method "
            "(`paypal` | `wise`), the account's email, the account holder's name and the currency "
            "(the partner may set the same in the portal). The payout files use them.",
            auth=(ACCOUNT_TOKEN,),
            params=(_CODE,),
            body=PartnerPatch,
            example={
                "payout_method": "paypal",
                "payout_email": "alice@paypal.test",
                "payout_name": "Alice Example",
                "payout_currency": "usd",
            },
            data=schemas.PartnerOut,
            result=PARTNER_OUT_EXAMPLE,
            errors=(ProgramNotFound, NotFound, OwnerRequired, PartnerNotFound),
            writes=True,
        ),
        get_partner: Doc(
            "A partner, with payout details and balances per currency",
            "partners",
            description=_MEMBER + " `balances`: per currency, `approved_unpaid` (what the next batch "
            "would pay before the minimum: the closing balance of the partner's statement), "
            "`pending` (not yet booked as approved) and `held`, in minor units.",
            auth=(ACCOUNT_TOKEN,),
            params=(_CODE,),
            data=schemas.PartnerOut,
            result=PARTNER_OUT_EXAMPLE,
            errors=(ProgramNotFound, PartnerNotFound),
        ),
        partner_statement: Doc(
            "A partner's statement: every entry of what is owed to them, with the running balance",
            "partners",
            description=_MEMBER + " Entries oldest first (their log order): `commission`, "
            "`adjustment`, `clawback`, `manual` (booked approved money, positive when owed to the "
            "partner), `payout` (negative: what a paid batch sent) and `payout_failed`, each with the "
            "balance after it. `currency` is needed when the partner has money in several; "
            "`from`/`to` (a date or an RFC 3339 time) bound the entries, the opening balance being "
            "everything before. The closing balance equals what the next batch would pay before "
            "the minimum. `format=csv`: an opening row, the entries, a closing row.",
            auth=(ACCOUNT_TOKEN,),
            params=(
                _CODE,
                Param("currency", {"type": "string", "pattern": "^[A-Za-z]{3}$"}, "the account's currency"),
                Param("from", {"type": "string"}, "YYYY-MM-DD (whole day) or an RFC 3339 time"),
                Param("to", {"type": "string"}, "YYYY-MM-DD (whole day) or an RFC 3339 time"),
                Param("format", {"type": "string", "enum": list(statements.FORMATS), "default": "json"}),
            ),
            data=schemas.Statement,
            result=_STATEMENT,
            content={"text/csv": {"schema": {"type": "string"}}},
            errors=(ProgramNotFound, PartnerNotFound, ValidationFailed),
        ),
        add_adjustment: Doc(
            "Book a manual entry for a partner (a bonus, a correction): approved at once",
            "partners",
            description=_OWNER + " `amount` in minor units of `currency`, not zero (negative: a "
            "correction against the partner); `reason` says why. Appended to the raw log with who "
            "and why: a `manual` line, approved at once, in reports, statements and batches like any "
            "approved line; 201 with it.",
            auth=(ACCOUNT_TOKEN,),
            params=(_CODE,),
            body=ManualEntryIn,
            example={"amount": 2500, "currency": "usd", "reason": "launch bonus"},
            status=201,
            data=schemas.ManualEntry,
            result={
                "entry_id": "man_3f2a",
                "sale_id": "man_3f2a",
                "transaction_id": "man_3f2a",
                "partner_code": "alice",
                "kind": "manual",
                "currency": "usd",
                "amount": 2500,
                "status": "approved",
                "status_reason": "launch bonus",
                "status_by": "acc_1a",
                "created_at": "2026-03-01T09:00:00Z",
                "created_by": "acc_1a",
            },
            errors=(
                ProgramNotFound,
                NotFound,
                OwnerRequired,
                PartnerNotFound,
                ValidationFailed,
                ReconcileRunning,
            ),
            writes=True,
        ),
    }
)
