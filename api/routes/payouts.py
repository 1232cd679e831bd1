"""Payouts (a workspace owner, CONTRACT section 7): make a batch of every approved, unpaid line up
to a date, list and export batches, mark one paid. Batches and payments are engineer actions
appended to the raw log (ingest/actions.py); which lines a batch takes is the reconciler's
decision from the log (reconcile/payouts.py); netting and carrying are reports/payouts.py's."""

from __future__ import annotations

import asyncio
from datetime import date
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.auth import account_program, require_account, state
from api.http import body_model, ok
from api.openapi import ACCOUNT_TOKEN, Doc, Param, document
from api.routes.reports import format_param, report_response
from api.state import State, read_tables
from ingest import actions, control
from ingest.domain.errors import (
    InvalidTransition,
    LinePaid,
    NotFound,
    OwnerRequired,
    ProgramNotFound,
    ReconcileRunning,
    SaleNotFound,
    ValidationFailed,
)
from ingest.domain.inputs import CommissionActionIn, PayoutIn
from ingest.domain.records import Partner, PayoutDetails, Program
from ingest.storage.contract import Reader
from reports import payfiles, payouts


def _owner(request: Request) -> tuple[Program, str]:
    """The program and the owner's account id (members get 403 owner_required)."""
    account = require_account(request)
    program = account_program(request, account)
    control.require_owner(state(request).store, program.workspace_id, account.account_id)
    return program, account.account_id


def _partners(st: State, program_id: str) -> dict[str, Partner]:
    return {p.code: p for p in st.store.partners(program_id)}


def _details(st: State, program_id: str) -> dict[str, PayoutDetails]:
    return st.store.payout_details(program_id)


def _new_batch(st: State, program: Program, up_to: date, actor: str) -> dict[str, Any] | None:
    """The batch row to append, when a batch made now would take at least one line."""
    row = actions.payout_batch_row(program, up_to, actor)
    with st.store.reader() as db:
        payable = payouts.payable_lines(db, program.program_id, row["received_at"], up_to)
    return row if payable else None


async def make_batch(st: State, program: Program, up_to: date, actor: str) -> tuple[bool, dict[str, Any]]:
    """(made, batch): a new batch of every line payable now up to `up_to`; when there is none,
    (False, the newest batch with this cut-off or an empty one). Shared with the dashboard."""
    row = await asyncio.to_thread(st.reconciler.act, lambda: _new_batch(st, program, up_to, actor))
    partners, details = _partners(st, program.program_id), _details(st, program.program_id)
    if row is None:
        existing = await read_tables(
            st.store, payouts.latest_with_cutoff, program.program_id, up_to, partners, details
        )
        return False, existing or payouts.empty(up_to, program.settings.payout_minimum)
    made = await read_tables(st.store, payouts.batch, program.program_id, row["event_id"], partners, details)
    if made is None:
        raise RuntimeError(
            f"payout batch {row['event_id']} was appended and reconciled but is not in rc_payouts"
        )
    return True, made


def _payment(st: State, program: Program, payout_id: str, actor: str) -> dict[str, Any] | None:
    """The row marking the batch paid; None when it already is; NotFound for no such batch."""
    with st.store.reader() as db:
        found = payouts.batch(db, program.program_id, payout_id, {})
    if found is None:
        raise NotFound(f"no payout batch {payout_id} in program {program.program_id}")
    if found["status"] == "paid":
        return None
    return actions.payout_paid_row(program, payout_id, actor)


async def _found(st: State, program: Program, payout_id: str) -> dict[str, Any]:
    pid = program.program_id
    found = await read_tables(st.store, payouts.batch, pid, payout_id, _partners(st, pid), _details(st, pid))
    if found is None:
        raise NotFound(f"no payout batch {payout_id} in program {program.program_id}")
    return found


async def settle(st: State, program: Program, payout_id: str, actor: str) -> dict[str, Any]:
    """Mark a batch paid (once: again changes nothing); NotFound for no such batch."""
    await asyncio.to_thread(st.reconciler.act, lambda: _payment(st, program, payout_id, actor))
    return await _found(st, program, payout_id)


def _not_paid_header(found: dict[str, Any]) -> str:
    """Who the batch cannot pay, as `code:currency:reason` items (codes are [A-Za-z0-9_.-])."""
    return ",".join(f"{r['partner_code']}:{r['currency']}:{r['reason']}" for r in found["not_paid"])


async def export(
    st: State, program: Program, payout_id: str, fmt: str, currency: str | None = None
) -> Response:
    """A batch as a csv or xlsx download, or the file PayPal Payouts or Wise batch payments
    imports (reports/payfiles.py: one row per partner whose payout method is that service; who is
    left out is in the `X-Tally-Not-Paid` header and the batch's `not_paid`)."""
    found = await _found(st, program, payout_id)
    if fmt in payfiles.SERVICES:
        details = _details(st, program.program_id)
        if fmt == "paypal":
            try:
                body, paid_in = payfiles.paypal_csv(found, details, program.name, currency)
            except payfiles.TooManyRows as exc:
                raise ValidationFailed(str(exc), fields=[{"field": "format", "message": str(exc)}]) from None
            except payfiles.CurrencyNeeded as exc:
                raise ValidationFailed(
                    str(exc), fields=[{"field": "currency", "message": f"one of {', '.join(exc.currencies)}"}]
                ) from None
            name = f"payout-{payout_id}-paypal{'-' + paid_in if paid_in else ''}.csv"
        else:
            body, name = payfiles.wise_csv(found, details), f"payout-{payout_id}-wise.csv"
        response = report_response(body, payouts.CSV, name, "csv")
        response.headers["X-Tally-Not-Paid"] = _not_paid_header(found)
        return response
    if fmt == "xlsx":
        return report_response(payouts.to_xlsx(found), payouts.XLSX, f"payout-{payout_id}.xlsx", fmt)
    return report_response(payouts.to_csv(found), payouts.CSV, f"payout-{payout_id}.csv", fmt)


async def create_payout(request: Request) -> Response:
    program, actor = _owner(request)
    _, inp = await body_model(request, PayoutIn)
    made, batch = await make_batch(state(request), program, inp.up_to, actor)
    return ok(request, batch, 201 if made else 200)


async def list_payouts(request: Request) -> Response:
    program, _ = _owner(request)
    st = state(request)
    pid = program.program_id
    found = await read_tables(st.store, payouts.batches, pid, _partners(st, pid), _details(st, pid))
    return ok(request, found)


def currency_param(request: Request) -> str | None:
    raw = request.query_params.get("currency")
    if raw is None:
        return None
    if not (len(raw) == 3 and raw.isascii() and raw.isalpha()):
        raise ValidationFailed(
            "currency must be a 3-letter ISO code", fields=[{"field": "currency", "message": "3 letters"}]
        )
    return raw.lower()


async def get_payout(request: Request) -> Response:
    program, _ = _owner(request)
    fmt = format_param(request, payouts.FORMATS)
    currency = currency_param(request)
    st = state(request)
    payout_id = request.path_params["payout_id"]
    if fmt != "json":
        return await export(st, program, payout_id, fmt, currency)
    return ok(request, await _found(st, program, payout_id))


async def mark_paid(request: Request) -> Response:
    program, actor = _owner(request)
    return ok(request, await settle(state(request), program, request.path_params["payout_id"], actor))


_LINE_COLUMNS = (
    "sale_id, transaction_id, partner_code, kind, cause, period, currency, amount, reversed,"
    " platform_fee, refunded, status, status_reason, status_by, payout_id, booked_seq IS NOT NULL AS booked,"
    " available_at, dated_at"
)


def sale_lines(db: Reader, program_id: str, transaction_id: str) -> list[dict[str, Any]]:
    """A sale's commission lines (every kind), as the last reconcile run left them."""
    if not db.table_exists("rc_commissions"):
        return []
    return db.dicts(
        f"SELECT {_LINE_COLUMNS} FROM rc_commissions WHERE program_id = ? AND transaction_id = ?"
        " ORDER BY dated_at, kind, partner_code, cause",
        [program_id, transaction_id],
    )


def _decide(
    st: State, program: Program, transaction_id: str, action: str, reason: str, actor: str
) -> dict[str, Any]:
    """The action's raw-log row, decided on the fresh tables (reconcile/bookings.py states)."""
    with st.store.reader() as db:
        lines = sale_lines(db, program.program_id, transaction_id)
    if not lines:
        raise SaleNotFound(
            f"no commission lines for transaction {transaction_id} in program {program.program_id}"
        )
    statuses = {str(line["status"]) for line in lines}
    if action in ("hold", "void") and any(line["payout_id"] is not None for line in lines):
        batch = next(line["payout_id"] for line in lines if line["payout_id"] is not None)
        raise LinePaid(
            f"transaction {transaction_id} has a line in payout batch {batch}: it cannot be {action}ed"
            " (a refund after payment is a clawback)"
        )
    if "void" in statuses:
        raise InvalidTransition(f"transaction {transaction_id} is void: no action applies to it")
    if action == "hold" and "held" in statuses:
        raise InvalidTransition(f"transaction {transaction_id} is already held")
    if action == "release" and "held" not in statuses:
        raise InvalidTransition(f"transaction {transaction_id} has no held line to release")
    sale_id = str(lines[0]["sale_id"])
    return actions.commission_action_row(program, sale_id, transaction_id, action, reason, actor)


ACTIONS = ("hold", "release", "void")


async def act_on_commission(
    st: State, program: Program, transaction_id: str, action: str, reason: str, actor: str
) -> list[dict[str, Any]]:
    """Append a finance action decided on fresh tables (under the run lock), reconcile, and
    give the sale's lines after it. Shared with the dashboard."""
    await asyncio.to_thread(
        st.reconciler.act, lambda: _decide(st, program, transaction_id, action, reason, actor)
    )
    return await read_tables(st.store, sale_lines, program.program_id, transaction_id)


async def _act_on_commission(request: Request, action: str) -> Response:
    program, actor = _owner(request)
    _, inp = await body_model(request, CommissionActionIn)
    transaction_id = request.path_params["transaction_id"]
    lines = await act_on_commission(state(request), program, transaction_id, action, inp.reason, actor)
    return ok(request, {"transaction_id": transaction_id, "lines": lines})


async def hold_commission(request: Request) -> Response:
    return await _act_on_commission(request, "hold")


async def release_commission(request: Request) -> Response:
    return await _act_on_commission(request, "release")


async def void_commission(request: Request) -> Response:
    return await _act_on_commission(request, "void")


_ACTION_PATH = "/api/v1/programs/{program_id}/commissions/{transaction_id}"
routes = [
    Route(f"{_ACTION_PATH}/hold", hold_commission, methods=["POST"]),
    Route(f"{_ACTION_PATH}/release", release_commission, methods=["POST"]),
    Route(f"{_ACTION_PATH}/void", void_commission, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/payouts", create_payout, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/payouts", list_payouts, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/payouts/{payout_id}", get_payout, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/payouts/{payout_id}/paid", mark_paid, methods=["POST"]),
]

_OWNER = "A workspace owner's account token (members get 403 owner_required)."
_ROW = {
    "partner_code": "alice",
    "partner_name": "Alice",
    "partner_email": "alice@partners.test",
    "amount": 14700,
    "amount_decimal": "147.00",
    "currency": "usd",
    "lines": 10,
    "net": 14700,
    "carried_in": 0,
    "carried_forward": 0,
}
_BATCH = {
    "payout_id": "po_5e1f",
    "number": 1,
    "up_to": "2026-01-31",
    "created_at": "2026-02-03T09:00:00Z",
    "created_by": "acc_1a",
    "status": "open",
    "paid_at": None,
    "paid_by": None,
    "payout_minimum": 0,
    "rows": [_ROW],
    "totals": [{"currency": "usd", "amount": 14700, "amount_decimal": "147.00", "lines": 10}],
    "lines": 10,
    "not_paid": [],
}
_PAYOUT_ID = Param("payout_id", {"type": "string", "minLength": 1}, where="path", example="po_5e1f")
document(
    {
        create_payout: Doc(
            "Make a payout batch: every approved, unpaid line dated up to a date, netted per partner",
            "payouts",
            description=_OWNER + " 201 with the new batch; 200 with the newest batch of that cut-off "
            "(or an empty one) when nothing new is payable: a line is never in two batches. A "
            "partner whose lines net below zero is paid nothing and carries the balance to the next "
            "batch.",
            auth=(ACCOUNT_TOKEN,),
            body=PayoutIn,
            example={"up_to": "2026-01-31"},
            status=201,
            data=schemas.Payout,
            result=_BATCH,
            extra_responses={
                200: {
                    "description": "Nothing new was payable: the newest batch with this cut-off, "
                    'or an empty one (`payout_id` null, `status` "empty").',
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["data"],
                                "properties": {"data": {"$ref": "#/components/schemas/Payout"}},
                            }
                        }
                    },
                }
            },
            errors=(ProgramNotFound, NotFound, OwnerRequired, ReconcileRunning),
            writes=True,
        ),
        list_payouts: Doc(
            "Payout batches, newest first, each netted per partner and currency",
            "payouts",
            description=_OWNER,
            auth=(ACCOUNT_TOKEN,),
            data=list[schemas.Payout],
            result=[_BATCH],
            errors=(ProgramNotFound, NotFound, OwnerRequired),
        ),
        get_payout: Doc(
            "One payout batch (json, csv, xlsx, or the PayPal or Wise import file)",
            "payouts",
            description=_OWNER + " One row per partner and currency. csv: the JSON rows' fields (money "
            "in minor units, `amount_decimal` in whole units), then `net_decimal`, `carried_in_decimal`, "
            "`carried_forward_decimal`; UTF-8 with a BOM (the format of every CSV). xlsx: the same "
            "columns, whole-unit money formatted in each row's currency. paypal: PayPal Payouts' "
            "CSV (no header; email, amount, currency, customer id, note, wallet; one currency per "
            "file: `currency` picks it when the batch pays PayPal partners in several). wise: Wise "
            'batch payments\' "Send by email" template. Both have a row per partner whose payout '
            "method is that service and whom the batch pays; who it cannot pay is in `not_paid` and "
            "in the `X-Tally-Not-Paid` header (`code:currency:reason`, comma-separated).",
            auth=(ACCOUNT_TOKEN,),
            params=(
                _PAYOUT_ID,
                Param("format", {"type": "string", "enum": list(payouts.FORMATS), "default": "json"}),
                Param(
                    "currency",
                    {"type": "string", "pattern": "^[A-Za-z]{3}$"},
                    "paypal only: the currency of the file",
                ),
            ),
            data=schemas.Payout,
            result=_BATCH,
            content={
                "text/csv": {"schema": {"type": "string"}},
                payouts.XLSX: {"schema": {"type": "string", "contentMediaType": "application/octet-stream"}},
            },
            errors=(ProgramNotFound, NotFound, OwnerRequired, ValidationFailed),
        ),
        **{
            handler: Doc(
                summary,
                "payouts",
                description=_OWNER + " The action is appended to the raw log with who and why "
                "(reconcile/bookings.py); 200 with the sale's lines after it. A sale with a line in "
                "a payout batch cannot be held or voided (409 `line_paid`: a refund after payment is "
                "a clawback); an action its lines' state does not allow is 409 `invalid_transition`.",
                auth=(ACCOUNT_TOKEN,),
                params=(
                    Param(
                        "transaction_id", {"type": "string", "minLength": 1}, where="path", example="tx_1001"
                    ),
                ),
                body=CommissionActionIn,
                data=schemas.SaleLines,
                example={"reason": "dispute opened by the customer"},
                result={"transaction_id": "tx_1001", "lines": [{"kind": "commission", "status": status}]},
                errors=(
                    ProgramNotFound,
                    OwnerRequired,
                    SaleNotFound,
                    LinePaid,
                    InvalidTransition,
                    ValidationFailed,
                ),
                writes=True,
            )
            for handler, summary, status in (
                (
                    hold_commission,
                    "Hold a sale's unpaid commission lines (never approved or batched while held)",
                    "held",
                ),
                (
                    release_commission,
                    "Release a held sale: its lines become pending, then approved",
                    "pending",
                ),
                (
                    void_commission,
                    "Void a sale's unpaid commission lines: never payable, fee void too",
                    "void",
                ),
            )
        },
        mark_paid: Doc(
            "Mark a payout batch paid: its lines become `paid` (again: no change)",
            "payouts",
            description=_OWNER,
            auth=(ACCOUNT_TOKEN,),
            params=(_PAYOUT_ID,),
            data=schemas.Payout,
            result={**_BATCH, "status": "paid", "paid_at": "2026-02-04T10:00:00Z", "paid_by": "acc_1a"},
            errors=(ProgramNotFound, NotFound, OwnerRequired, ReconcileRunning),
            writes=True,
        ),
    }
)
