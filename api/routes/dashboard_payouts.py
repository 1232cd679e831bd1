"""The dashboard's Payouts tab (workspace owners): what is due per partner, the batches with their
rows, downloads, a form to make a batch and a button to mark one paid. Split from
api/routes/dashboard.py (its pages, sessions and CSRF rules) only for size; the actions are the
JSON API's own (api/routes/payouts.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from api import finance
from api.auth import account_program, state
from api.http import validate
from api.openapi import Param, document
from api.pages import render
from api.routes.dashboard import PROGRAM, _page, owned_program, page, posted, program_url, viewer
from api.routes.reports import format_param
from api.state import read_tables
from ingest import control
from ingest.domain.clock import utcnow
from ingest.domain.errors import (
    BatchPaid,
    InvalidTransition,
    LinePaid,
    NotFound,
    ProgramNotFound,
    SaleNotFound,
    ValidationFailed,
)
from ingest.domain.inputs import CommissionActionIn, PayoutCancelIn, PayoutIn, RowFailedIn
from ingest.storage.contract import Reader
from reports import payfiles, payouts
from reports.money import minimum_text

FILE_FORMATS = ("csv", "xlsx", *payfiles.SERVICES)


def _last_month_end() -> date:
    """The default cut-off: the last day of the previous month (UTC)."""
    return utcnow().date().replace(day=1) - timedelta(days=1)


@dataclass(frozen=True)
class Overview:
    """What the Payouts tab shows: whether anything was reconciled, what is due now, the
    batches (newest first), who made and paid them (account id -> email), and how many lines a
    batch with the default cut-off would take."""

    reconciled: bool
    due: list[dict[str, Any]]
    batches: list[dict[str, Any]]
    people: dict[str, str]
    payable_by_default: int


def _overview(
    db: Reader,
    program_id: str,
    partners: dict[str, Any],
    up_to: date,
    details: Any,
    minimum: payouts.Minimum,
) -> Overview:
    now = utcnow()
    batches = payouts.batches(db, program_id, partners, details)
    actors = [b["created_by"] for b in batches] + [b["paid_by"] for b in batches]
    return Overview(
        reconciled=db.table_exists("rc_commissions"),
        due=payouts.due(db, program_id, now, partners, minimum, details),
        batches=batches,
        people=payouts.people(db, actors),
        payable_by_default=payouts.payable_lines(db, program_id, now, up_to),
    )


def batch_refusal(view: Overview) -> str | None:
    """Why the "Make a payout batch" button is off, or None when a batch would pay something:
    nothing reconciled yet, or no approved line waiting (every line a batch could take is
    counted in `due`, whatever the cut-off)."""
    if not view.reconciled:
        return "Nothing is reconciled yet: commissions appear after the reconciler's first run."
    if not any(r["lines"] for r in view.due):
        return (
            "Nothing is due: no approved commission line is waiting to be paid (a line is approved "
            "once its holding days have passed)."
        )
    return None


@page
async def payouts_page(request: Request) -> Response:
    """Due now per partner and currency, then every batch (newest first)."""
    who = viewer(request)
    program = owned_program(request, who)
    st = state(request)
    partners = {p.code: p for p in st.store.partners(program.program_id)}
    default_up_to = _last_month_end()
    details = st.store.payout_details(program.program_id)
    view = await read_tables(
        st.store,
        _overview,
        program.program_id,
        partners,
        default_up_to,
        details,
        program.settings.payout_minimum,
    )
    for batch in view.batches:  # the currencies PayPal files of each batch come in
        batch["paypal_currencies"] = sorted({r["currency"] for r in payfiles.paid_by(batch, "paypal")})
    return render(
        "payouts.html",
        viewer=who,
        program=control.program_view(st.store, program),
        reconciled=view.reconciled,
        due=view.due,
        batches=view.batches,
        people=view.people,
        reasons=NOT_PAID,
        minimum=minimum_text(program.settings.payout_minimum),
        refusal=batch_refusal(view),
        payable_by_default=view.payable_by_default,
        default_up_to=default_up_to.isoformat(),
        up_to=request.query_params.get("up_to") or default_up_to.isoformat(),
        made=request.query_params.get("made"),
        nothing=request.query_params.get("nothing"),
        paid=request.query_params.get("paid"),
        cancelled=request.query_params.get("cancelled"),
        failed=request.query_params.get("failed"),
    )


@page
async def create_payout(request: Request) -> Response:
    who, form = await posted(request)
    program = owned_program(request, who)
    inp = validate(PayoutIn, {"up_to": form.get("up_to", "")})
    made, batch = await finance.make_batch(state(request), program, inp.up_to, who.account.account_id)
    query = {"made": batch["payout_id"]} if made else {"nothing": inp.up_to.isoformat()}
    return RedirectResponse(program_url(program, f"/payouts?{urlencode(query)}#batches"), 303)


@page
async def mark_paid(request: Request) -> Response:
    who, _ = await posted(request)
    program = owned_program(request, who)
    payout_id = request.path_params["payout_id"]
    await finance.settle(state(request), program, payout_id, who.account.account_id)
    query = urlencode({"paid": payout_id})
    return RedirectResponse(program_url(program, f"/payouts?{query}#payout-{quote(payout_id, safe='')}"), 303)


@page
async def cancel_batch(request: Request) -> Response:
    """Cancel an open batch (CONTRACT 15): its lines are due again; it stays listed."""
    who, form = await posted(request)
    program = owned_program(request, who)
    payout_id = request.path_params["payout_id"]
    inp = validate(PayoutCancelIn, {"reason": form.get("reason", "")})
    await finance.cancel(state(request), program, payout_id, inp.reason, who.account.account_id)
    query = urlencode({"cancelled": payout_id})
    return RedirectResponse(program_url(program, f"/payouts?{query}#payout-{quote(payout_id, safe='')}"), 303)


@page
async def fail_row(request: Request) -> Response:
    """Mark one row of a paid batch failed (its payment bounced): its lines are owed again."""
    who, form = await posted(request)
    program = owned_program(request, who)
    payout_id, code = request.path_params["payout_id"], request.path_params["partner_code"]
    currency = request.path_params["currency"]
    inp = validate(RowFailedIn, {"reason": form.get("reason", "")})
    actor = who.account.account_id
    await finance.fail_row(state(request), program, payout_id, code, currency, inp.reason, actor)
    query = urlencode({"failed": f"{code} {currency.upper()}"})
    return RedirectResponse(program_url(program, f"/payouts?{query}#payout-{quote(payout_id, safe='')}"), 303)


@page
async def partner_page(request: Request) -> Response:
    """A partner's page: payout details, balances per currency and the statement of each (any
    member of the workspace, as the statement's API read)."""
    who = viewer(request)
    program = account_program(request, who.account)
    st = state(request)
    code = request.path_params["code"]
    partner = next((p for p in st.store.partners(program.program_id) if p.code == code), None)
    if partner is None:
        raise NotFound(f"no partner {code} in program {program.program_id}")
    found = (await finance.balances(st, program, [code])).get(code, [])
    statements = [await finance.statement(st, program, code, b["currency"], None, None) for b in found]
    return render(
        "partner.html",
        viewer=who,
        program=control.program_view(st.store, program),
        partner=partner,
        details=st.store.payout_details(program.program_id).get(code),
        balances=found,
        statements=statements,
    )


# Why a batch cannot pay a partner, as the page says it (reports/payfiles.py `not_paid`).
NOT_PAID = {
    "currency_not_supported": (
        "their payout details name another currency, or one their service cannot pay: nothing is converted"
    ),
    "below_minimum": "below the payout minimum: carried to the next batch",
    "negative_balance": "owes a negative balance (a refund after payment): netted by the next batch",
    "no_payout_details": "no payout details: pay by hand, or send them a portal link to fill them in",
    "nothing_due": "nothing due: the lines net to zero",
}


@page
async def export(request: Request) -> Response:
    who = viewer(request)
    program = owned_program(request, who)
    fmt = format_param(request, FILE_FORMATS)
    currency = finance.currency_param(request)
    return await finance.export(state(request), program, request.path_params["payout_id"], fmt, currency)


@page
async def act_on_commission(request: Request) -> Response:
    """A finance action (hold, release, void) from a sale's explain page; back to it, saying so."""
    who, form = await posted(request)
    program = owned_program(request, who)
    transaction_id = request.path_params["transaction_id"]
    action = form.get("action", "")
    if action not in finance.ACTIONS:
        message = "must be hold, release or void"
        raise ValidationFailed(f"action {message}", fields=[{"field": "action", "message": message}])
    inp = validate(CommissionActionIn, {"reason": form.get("reason", "")})
    await finance.act_on_commission(
        state(request), program, transaction_id, action, inp.reason, who.account.account_id
    )
    query = urlencode({"done": action})
    return RedirectResponse(
        program_url(program, f"/sales/{quote(transaction_id, safe='')}?{query}#lines"), 303
    )


routes = [
    Route(PROGRAM + "/commissions/{transaction_id:id}", act_on_commission, methods=["POST"]),
    Route(PROGRAM + "/payouts", payouts_page, methods=["GET"]),
    Route(PROGRAM + "/payouts", create_payout, methods=["POST"]),
    Route(PROGRAM + "/payouts/{payout_id}/paid", mark_paid, methods=["POST"]),
    Route(PROGRAM + "/payouts/{payout_id}/export", export, methods=["GET"]),
    Route(PROGRAM + "/payouts/{payout_id}/cancel", cancel_batch, methods=["POST"]),
    Route(PROGRAM + "/payouts/{payout_id}/rows/{partner_code}/{currency}/failed", fail_row, methods=["POST"]),
    Route(PROGRAM + "/partners/{code}", partner_page, methods=["GET"]),
]

document(
    {
        payouts_page: _page(
            "Payouts: due per partner, batches, downloads (owner)", errors=(ProgramNotFound,)
        ),
        create_payout: _page(
            "Make a payout batch up to a date (owner)", form=True, errors=(ProgramNotFound, ValidationFailed)
        ),
        mark_paid: _page("Mark a payout batch paid (owner)", form=True, errors=(ProgramNotFound, NotFound)),
        cancel_batch: _page(
            "Cancel an open payout batch (owner)",
            form=True,
            errors=(ProgramNotFound, NotFound, BatchPaid, ValidationFailed),
        ),
        fail_row: _page(
            "Mark one row of a paid payout batch failed (owner)",
            form=True,
            errors=(ProgramNotFound, NotFound, InvalidTransition, ValidationFailed),
        ),
        partner_page: _page(
            "A partner: payout details, balances and statements", errors=(ProgramNotFound, NotFound)
        ),
        act_on_commission: _page(
            "Hold, release or void a sale's commission lines (owner)",
            form=True,
            errors=(ProgramNotFound, SaleNotFound, LinePaid, InvalidTransition, ValidationFailed),
        ),
        export: _page(
            "A payout batch as a file (owner)",
            params=(
                Param("format", {"type": "string", "enum": list(FILE_FORMATS)}),
                Param(
                    "currency", {"type": "string", "pattern": "^[A-Za-z]{3}$"}, "paypal: the file's currency"
                ),
            ),
            content={
                "text/csv": {"schema": {"type": "string"}},
                payouts.XLSX: {"schema": {"type": "string", "contentMediaType": "application/octet-stream"}},
            },
            errors=(ProgramNotFound, NotFound, ValidationFailed),
        ),
    }
)
