"""Payouts (a workspace owner, CONTRACT sections 7 and 15): make a batch of what is due up to a
date, list and export batches, mark one paid, cancel an open one, mark a paid row failed; hold,
release or void a sale's lines. The use cases are api/finance.py's; each act is a raw-log row
(ingest/actions.py); which lines a batch holds is the reconciler's (reconcile/payouts.py); what a
batch pays is its snapshot (reports/payouts.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import finance, schemas
from api.auth import account_program, require_account, state
from api.finance import currency_param
from api.http import body_model, ok
from api.openapi import ACCOUNT_TOKEN, Doc, Param, document
from api.routes.reports import format_param
from api.state import read_tables
from ingest import control
from ingest.domain.errors import (
    BatchPaid,
    CurrencyNotSupported,
    InvalidTransition,
    LineInBatch,
    LinePaid,
    NotFound,
    OwnerRequired,
    ProgramNotFound,
    ReconcileRunning,
    SaleNotFound,
    ValidationFailed,
)
from ingest.domain.inputs import CommissionActionIn, PayoutCancelIn, PayoutIn, RowFailedIn
from ingest.domain.records import Program
from reports import payouts


def _owner(request: Request) -> tuple[Program, str]:
    """The program and the owner's account id (members get 403 owner_required)."""
    account = require_account(request)
    program = account_program(request, account)
    control.require_owner(state(request).store, program.workspace_id, account.account_id)
    return program, account.account_id


async def create_payout(request: Request) -> Response:
    program, actor = _owner(request)
    _, inp = await body_model(request, PayoutIn)
    made, batch = await finance.make_batch(state(request), program, inp.up_to, actor)
    return ok(request, batch, 201 if made else 200)


async def list_payouts(request: Request) -> Response:
    program, _ = _owner(request)
    st = state(request)
    pid = program.program_id
    found = await read_tables(
        st.store, payouts.batches, pid, finance.partners_of(st, pid), finance.details_of(st, pid)
    )
    return ok(request, found)


async def get_payout(request: Request) -> Response:
    program, _ = _owner(request)
    fmt = format_param(request, payouts.FORMATS)
    currency = currency_param(request)
    st = state(request)
    payout_id = request.path_params["payout_id"]
    if fmt != "json":
        return await finance.export(st, program, payout_id, fmt, currency)
    return ok(request, await finance.batch_view(st, program, payout_id))


async def mark_paid(request: Request) -> Response:
    program, actor = _owner(request)
    return ok(request, await finance.settle(state(request), program, request.path_params["payout_id"], actor))


async def cancel_payout(request: Request) -> Response:
    program, actor = _owner(request)
    _, inp = await body_model(request, PayoutCancelIn)
    payout_id = request.path_params["payout_id"]
    return ok(request, await finance.cancel(state(request), program, payout_id, inp.reason, actor))


async def row_failed(request: Request) -> Response:
    program, actor = _owner(request)
    _, inp = await body_model(request, RowFailedIn)
    params = request.path_params
    found = await finance.fail_row(
        state(request),
        program,
        params["payout_id"],
        params["partner_code"],
        params["currency"],
        inp.reason,
        actor,
    )
    return ok(request, found)


async def _act_on_commission(request: Request, action: str) -> Response:
    program, actor = _owner(request)
    _, inp = await body_model(request, CommissionActionIn)
    transaction_id = request.path_params["transaction_id"]
    lines = await finance.act_on_commission(
        state(request), program, transaction_id, action, inp.reason, actor
    )
    return ok(request, {"transaction_id": transaction_id, "lines": lines})


async def hold_commission(request: Request) -> Response:
    return await _act_on_commission(request, "hold")


async def release_commission(request: Request) -> Response:
    return await _act_on_commission(request, "release")


async def void_commission(request: Request) -> Response:
    return await _act_on_commission(request, "void")


# `:path`: a transaction id may hold `/` (sent as %2F, which the server decodes before routing).
_ACTION_PATH = "/api/v1/programs/{program_id}/commissions/{transaction_id:id}"
routes = [
    Route(f"{_ACTION_PATH}/hold", hold_commission, methods=["POST"]),
    Route(f"{_ACTION_PATH}/release", release_commission, methods=["POST"]),
    Route(f"{_ACTION_PATH}/void", void_commission, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/payouts", create_payout, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/payouts", list_payouts, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/payouts/{payout_id}", get_payout, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/payouts/{payout_id}/paid", mark_paid, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/payouts/{payout_id}/cancel", cancel_payout, methods=["POST"]),
    Route(
        "/api/v1/programs/{program_id}/payouts/{payout_id}/rows/{partner_code}/{currency}/failed",
        row_failed,
        methods=["POST"],
    ),
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
    "payout_method": "paypal",
    "payout_email": "alice@paypal.test",
    "payout_name": "Alice Example",
    "payout_currency": "usd",
    "outcome": "open",
    "failure": None,
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
    "cancelled_at": None,
    "cancelled_by": None,
    "cancel_reason": None,
    "program_name": "Brand partners",
    "snapshot": True,
    "rows": [_ROW],
    "totals": [{"currency": "usd", "amount": 14700, "amount_decimal": "147.00", "lines": 10}],
    "lines": 10,
    "not_paid": [
        {
            "partner_code": "carol",
            "partner_name": "Carol",
            "currency": "usd",
            "balance": 3600,
            "lines": 2,
            "reason": "no_payout_details",
        }
    ],
}
_PAYOUT_ID = Param("payout_id", {"type": "string", "minLength": 1}, where="path", example="po_5e1f")
document(
    {
        create_payout: Doc(
            "Make a payout batch: what is due per partner and currency, dated up to a date",
            "payouts",
            description=_OWNER + " 201 with the new batch; 200 with the newest live batch of that "
            "cut-off (or an empty one, `not_paid` saying why) when it would pay no one: a line is "
            "never in two live batches. The batch is a snapshot: its rows and the payees' details "
            "are recorded when it is made, and every output of it is rendered from that record. A "
            "partner below the minimum, without payout details, or in a currency their service "
            "cannot pay gets no row (`not_paid`, with `reason`): their lines stay approved and "
            "unpaid for a later batch.",
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
            errors=(ProgramNotFound, NotFound, OwnerRequired, ValidationFailed, CurrencyNotSupported),
        ),
        cancel_payout: Doc(
            "Cancel an open payout batch: its lines are due again (again: no change)",
            "payouts",
            description=_OWNER + " The batch stays listed with `status` `cancelled`, who and why. A "
            "paid batch cannot be cancelled (409 `batch_paid`): mark a failed row instead.",
            auth=(ACCOUNT_TOKEN,),
            params=(_PAYOUT_ID,),
            body=PayoutCancelIn,
            example={"reason": "made with the wrong cut-off"},
            data=schemas.Payout,
            result={**_BATCH, "status": "cancelled", "cancel_reason": "made with the wrong cut-off"},
            errors=(ProgramNotFound, NotFound, OwnerRequired, BatchPaid, ReconcileRunning, ValidationFailed),
            writes=True,
        ),
        row_failed: Doc(
            "Mark one row of a paid batch failed: its lines are owed again (again: no change)",
            "payouts",
            description=_OWNER + " For a payment that bounced. The row shows `outcome` `failed` with "
            "the reason; the batch's other rows and its files do not change; the row's lines are "
            "approved and unpaid again from the failure on (the partner's statement books it as "
            "`payout_failed`), and a later batch pays them. Only a paid batch's row can fail (409 "
            "`invalid_transition`).",
            auth=(ACCOUNT_TOKEN,),
            params=(
                _PAYOUT_ID,
                Param("partner_code", {"type": "string", "minLength": 1}, where="path", example="alice"),
                Param("currency", {"type": "string", "minLength": 3}, where="path", example="usd"),
            ),
            body=RowFailedIn,
            example={"reason": "PayPal returned the payment: account closed"},
            data=schemas.Payout,
            result={**_BATCH, "status": "paid"},
            errors=(
                ProgramNotFound,
                NotFound,
                OwnerRequired,
                InvalidTransition,
                ReconcileRunning,
                ValidationFailed,
            ),
            writes=True,
        ),
        **{
            handler: Doc(
                summary,
                "payouts",
                description=_OWNER + " The action is appended to the raw log with who and why "
                "(reconcile/bookings.py); 200 with the sale's lines after it. A sale with a line in "
                "an open payout batch cannot be held or voided (409 `line_in_batch`, naming the "
                "batch: cancel it first), nor one with a line in a paid batch (409 `line_paid`: a "
                "refund after payment is a clawback); an action its lines' state does not allow is "
                "409 `invalid_transition`.",
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
                    LineInBatch,
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
            description=_OWNER + " A cancelled batch cannot be paid (409 `invalid_transition`).",
            auth=(ACCOUNT_TOKEN,),
            params=(_PAYOUT_ID,),
            data=schemas.Payout,
            result={**_BATCH, "status": "paid", "paid_at": "2026-02-04T10:00:00Z", "paid_by": "acc_1a"},
            errors=(ProgramNotFound, NotFound, OwnerRequired, InvalidTransition, ReconcileRunning),
            writes=True,
        ),
    }
)
