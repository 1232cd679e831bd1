"""The finance use cases the JSON API and the dashboard share (CONTRACT 7, 14, 15): payout
batches (make, pay, cancel, a row failed, files), finance actions on a sale's lines, manual
entries, and partners' statements and balances.

Every act is decided on fresh tables under the reconciler's run lock (`Reconciler.act`: a run
over the whole log, then the decision, then the appended row reconciled at once), so two acts
never decide on the same state, whatever replica takes them. Each act is a raw-log row
(ingest/actions.py); what it changes follows from the log (reconcile/payouts.py,
reconcile/bookings.py, reconcile/manual.py); reads are reports/'s.
"""

from __future__ import annotations

import asyncio
import json
from datetime import date
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from api.routes.reports import report_response
from api.state import State, read_tables
from ingest import actions
from ingest.domain.errors import (
    BatchPaid,
    CurrencyNotSupported,
    InvalidTransition,
    LineInBatch,
    LinePaid,
    NotFound,
    SaleNotFound,
    ValidationFailed,
)
from ingest.domain.records import Partner, PayoutDetails, Program
from ingest.storage.contract import Reader
from reports import payfiles, payouts, statements


def partners_of(st: State, program_id: str) -> dict[str, Partner]:
    return {p.code: p for p in st.store.partners(program_id)}


def details_of(st: State, program_id: str) -> dict[str, PayoutDetails]:
    return st.store.payout_details(program_id)


def currency_param(request: Request) -> str | None:
    """The `currency` query parameter (3 letters, lower case), if given."""
    raw = request.query_params.get("currency")
    if raw is None:
        return None
    if not (len(raw) == 3 and raw.isascii() and raw.isalpha()):
        raise ValidationFailed(
            "currency must be a 3-letter ISO code", fields=[{"field": "currency", "message": "3 letters"}]
        )
    return raw.lower()


# -- batches ----------------------------------------------------------------------------------
def _new_batch(st: State, program: Program, up_to: date, actor: str) -> dict[str, Any] | None:
    """The batch row to append, with its snapshot, when a batch made now would pay anyone."""
    pid = program.program_id
    minimum = program.settings.payout_minimum
    with st.store.reader() as db:
        made = payouts.snapshot(
            db, pid, up_to, minimum, partners_of(st, pid), details_of(st, pid), program.name
        )
    return actions.payout_batch_row(program, up_to, actor, made) if made["rows"] else None


async def make_batch(st: State, program: Program, up_to: date, actor: str) -> tuple[bool, dict[str, Any]]:
    """(made, batch): a new batch paying every partner due up to `up_to`; when it would pay no
    one, (False, the newest live batch with this cut-off, or an empty one naming who is not paid
    and why)."""
    row = await asyncio.to_thread(
        st.reconciler.act, lambda: _new_batch(st, program, up_to, actor), program.program_id
    )
    pid = program.program_id
    partners, details = partners_of(st, pid), details_of(st, pid)
    if row is None:
        existing = await read_tables(st.store, payouts.latest_with_cutoff, pid, up_to, partners, details)
        if existing is not None:
            return False, existing
        minimum = program.settings.payout_minimum
        made = await read_tables(st.store, payouts.snapshot, pid, up_to, minimum, partners, details)
        return False, payouts.empty(up_to, minimum, made["not_paid"])
    found = await read_tables(st.store, payouts.batch, pid, row["event_id"], partners, details)
    if found is None:
        raise RuntimeError(
            f"payout batch {row['event_id']} was appended and reconciled but is not in rc_payouts"
        )
    return True, found


def _batch(st: State, program: Program, payout_id: str) -> dict[str, Any]:
    with st.store.reader() as db:
        found = payouts.batch(db, program.program_id, payout_id, {})
    if found is None:
        raise NotFound(f"no payout batch {payout_id} in program {program.program_id}")
    return found


async def batch_view(st: State, program: Program, payout_id: str) -> dict[str, Any]:
    pid = program.program_id
    found = await read_tables(
        st.store, payouts.batch, pid, payout_id, partners_of(st, pid), details_of(st, pid)
    )
    if found is None:
        raise NotFound(f"no payout batch {payout_id} in program {program.program_id}")
    return found


def _payment(st: State, program: Program, payout_id: str, actor: str) -> dict[str, Any] | None:
    """The row marking the batch paid; None when it already is; NotFound for no such batch,
    InvalidTransition for a cancelled one."""
    found = _batch(st, program, payout_id)
    if found["status"] == "paid":
        return None
    if found["status"] == "cancelled":
        raise InvalidTransition(f"payout batch {payout_id} is cancelled: it cannot be paid")
    return actions.payout_paid_row(program, payout_id, actor)


async def settle(st: State, program: Program, payout_id: str, actor: str) -> dict[str, Any]:
    """Mark a batch paid (once: again changes nothing)."""
    await asyncio.to_thread(
        st.reconciler.act, lambda: _payment(st, program, payout_id, actor), program.program_id
    )
    return await batch_view(st, program, payout_id)


def _cancel(st: State, program: Program, payout_id: str, reason: str, actor: str) -> dict[str, Any] | None:
    found = _batch(st, program, payout_id)
    if found["status"] == "paid":
        raise BatchPaid(
            f"payout batch {payout_id} is paid: it cannot be cancelled (mark a row failed instead)",
            payout_id=payout_id,
        )
    if found["status"] == "cancelled":
        return None
    return actions.payout_cancel_row(program, payout_id, reason, actor)


async def cancel(st: State, program: Program, payout_id: str, reason: str, actor: str) -> dict[str, Any]:
    """Cancel an open batch (again: no change): its lines are due again; it stays listed."""
    await asyncio.to_thread(
        st.reconciler.act, lambda: _cancel(st, program, payout_id, reason, actor), program.program_id
    )
    return await batch_view(st, program, payout_id)


def _failure(
    st: State, program: Program, payout_id: str, code: str, currency: str, reason: str, actor: str
) -> dict[str, Any] | None:
    found = _batch(st, program, payout_id)
    row = next((r for r in found["rows"] if (r["partner_code"], r["currency"]) == (code, currency)), None)
    if row is None:
        raise NotFound(f"payout batch {payout_id} has no row for partner {code} in {currency}")
    if not found["snapshot"]:
        raise InvalidTransition(
            f"payout batch {payout_id} was made before batches kept what they paid: its rows cannot fail"
        )
    if found["status"] != "paid":
        raise InvalidTransition(
            f"payout batch {payout_id} is {found['status']}: only a paid batch's row can fail"
            " (cancel an open batch instead)"
        )
    if row["outcome"] == "failed":
        return None
    return actions.payout_row_failed_row(program, payout_id, code, currency, reason, actor)


async def fail_row(
    st: State, program: Program, payout_id: str, code: str, currency: str, reason: str, actor: str
) -> dict[str, Any]:
    """Mark one row of a paid batch failed (again: no change): its lines are due again."""
    await asyncio.to_thread(
        st.reconciler.act,
        lambda: _failure(st, program, payout_id, code, currency.lower(), reason, actor),
        program.program_id,
    )
    return await batch_view(st, program, payout_id)


def _not_paid_header(found: dict[str, Any]) -> str:
    """Who the batch cannot pay, as `code:currency:reason` items (codes are [A-Za-z0-9_.-])."""
    return ",".join(f"{r['partner_code']}:{r['currency']}:{r['reason']}" for r in found["not_paid"])


async def export(
    st: State, program: Program, payout_id: str, fmt: str, currency: str | None = None
) -> Response:
    """A batch as a csv or xlsx download, or the file PayPal Payouts or Wise batch payments
    imports (reports/payfiles.py: one row per partner whose payout method, as the batch recorded
    it, is that service; who is left out is in the `X-Tally-Not-Paid` header and `not_paid`)."""
    found = await batch_view(st, program, payout_id)
    if fmt in payfiles.SERVICES:
        try:
            if fmt == "paypal":
                named = found["program_name"] or program.name  # batches before snapshots: the name now
                body, paid_in = payfiles.paypal_csv(found, named, currency)
                name = f"payout-{payout_id}-paypal{'-' + paid_in if paid_in else ''}.csv"
            else:
                body = payfiles.wise_csv(found, currency)
                name = f"payout-{payout_id}-wise{'-' + currency if currency else ''}.csv"
        except payfiles.CurrencyNotPaid as exc:
            raise CurrencyNotSupported(str(exc), currency=exc.currency, service=exc.service) from None
        except payfiles.TooManyRows as exc:
            raise ValidationFailed(str(exc), fields=[{"field": "format", "message": str(exc)}]) from None
        except payfiles.CurrencyNeeded as exc:
            raise ValidationFailed(
                str(exc), fields=[{"field": "currency", "message": f"one of {', '.join(exc.currencies)}"}]
            ) from None
        response = report_response(body, payouts.CSV, name, "csv")
        response.headers["X-Tally-Not-Paid"] = _not_paid_header(found)
        return response
    if fmt == "xlsx":
        return report_response(payouts.to_xlsx(found), payouts.XLSX, f"payout-{payout_id}.xlsx", fmt)
    return report_response(payouts.to_csv(found), payouts.CSV, f"payout-{payout_id}.csv", fmt)


# -- finance actions on a sale's lines ------------------------------------------------------------
_LINE_COLUMNS = (
    "sale_id, transaction_id, partner_code, kind, cause, period, currency, amount, reversed,"
    " platform_fee, refunded, status, status_reason, status_by, payout_id, booked_seq IS NOT NULL AS booked,"
    " available_at, dated_at"
)
ACTIONS = ("hold", "release", "void")


def sale_lines(db: Reader, program_id: str, transaction_id: str) -> list[dict[str, Any]]:
    """A sale's commission lines (every kind), as the last reconcile run left them."""
    if not db.table_exists("rc_commissions"):
        return []
    return db.dicts(
        f"SELECT {_LINE_COLUMNS} FROM rc_commissions WHERE program_id = ? AND transaction_id = ?"
        " ORDER BY dated_at, kind, partner_code, cause",
        [program_id, transaction_id],
    )


def _open_batches(db: Reader, program_id: str) -> set[str]:
    if not db.table_exists("rc_payouts"):
        return set()
    rows = db.rows("SELECT payout_id FROM rc_payouts WHERE program_id = ? AND status = 'open'", [program_id])
    return {str(r[0]) for r in rows}


def _actions_of(db: Reader, program_id: str, transaction_id: str, lines: list[dict[str, Any]]) -> list[str]:
    """The sale's finance actions in log order (hold, release, void). A line of a closed month
    keeps its status whatever is done to it later (reconcile/bookings.py `compensations`), so the
    sale's state is read from the log's actions, not from its lines' statuses alone."""
    if not lines:
        return []
    sale_id = str(lines[0]["sale_id"])
    rows = db.rows(
        "SELECT body FROM raw_events WHERE program_id = ? AND kind = 'commission_action'"
        " AND outcome = 'accepted' AND transaction_id = ? ORDER BY seq",
        [program_id, transaction_id],
    )
    found: list[str] = []
    for (body,) in rows:
        parsed = json.loads(body) if isinstance(body, str) else body
        if isinstance(parsed, dict) and parsed.get("sale_id") == sale_id:
            found.append(str(parsed.get("action")))
    return found


def _acted_state(acts: list[str]) -> set[str]:
    """`held` or `void` when the sale's actions leave it so (as reconcile/bookings.py folds them)."""
    if "void" in acts:
        return {"void"}
    last = [a for a in acts if a in ("hold", "release")]
    return {"held"} if last and last[-1] == "hold" else set()


def _decide(
    st: State, program: Program, transaction_id: str, action: str, reason: str, actor: str
) -> dict[str, Any]:
    """The action's raw-log row, decided on the fresh tables (reconcile/bookings.py states)."""
    with st.store.reader() as db:
        lines = sale_lines(db, program.program_id, transaction_id)
        open_batches = _open_batches(db, program.program_id)
        db_state = _actions_of(db, program.program_id, transaction_id, lines)
    if not lines:
        raise SaleNotFound(
            f"no commission lines for transaction {transaction_id} in program {program.program_id}"
        )
    sale_id = str(lines[0]["sale_id"])
    statuses = {str(line["status"]) for line in lines} | _acted_state(db_state)
    if action in ("hold", "void"):
        batched = [str(line["payout_id"]) for line in lines if line["payout_id"] is not None]
        in_open = [b for b in batched if b in open_batches]
        if in_open:
            raise LineInBatch(
                f"transaction {transaction_id} has a line in open payout batch {in_open[0]}: cancel the"
                f" batch first, then {action} the sale",
                payout_id=in_open[0],
            )
        if batched:
            raise LinePaid(
                f"transaction {transaction_id} has a line in paid payout batch {batched[0]}: it cannot be"
                f" {action}ed (a refund after payment is a clawback)",
                payout_id=batched[0],
            )
    if "void" in statuses:
        raise InvalidTransition(f"transaction {transaction_id} is void: no action applies to it")
    if action == "hold" and "held" in statuses:
        raise InvalidTransition(f"transaction {transaction_id} is already held")
    if action == "release" and "held" not in statuses:
        raise InvalidTransition(f"transaction {transaction_id} has no held line to release")
    return actions.commission_action_row(program, sale_id, transaction_id, action, reason, actor)


async def act_on_commission(
    st: State, program: Program, transaction_id: str, action: str, reason: str, actor: str
) -> list[dict[str, Any]]:
    """Append a finance action decided on fresh tables (under the run lock), reconcile, and
    give the sale's lines after it."""
    await asyncio.to_thread(
        st.reconciler.act,
        lambda: _decide(st, program, transaction_id, action, reason, actor),
        program.program_id,
    )
    return await read_tables(st.store, sale_lines, program.program_id, transaction_id)


# -- manual entries and statements -------------------------------------------------------------------
async def add_manual_entry(
    st: State, program: Program, partner: Partner, amount: int, currency: str, reason: str, actor: str
) -> dict[str, Any]:
    """Book a manual entry for `partner` (approved at once); its line as reconciled."""
    row = actions.manual_entry_row(program, partner.code, amount, currency, reason, actor)
    await asyncio.to_thread(st.reconciler.act, lambda: row, program.program_id)
    found = await read_tables(st.store, sale_lines, program.program_id, row["event_id"])
    if not found:
        raise RuntimeError(f"manual entry {row['event_id']} was appended and reconciled but has no line")
    line = found[0]
    return {
        "entry_id": row["event_id"],
        **{k: line[k] for k in ("sale_id", "transaction_id", "partner_code", "kind", "currency", "amount")},
        **{k: line[k] for k in ("status", "status_reason", "status_by")},
        "created_at": row["received_at"],
        "created_by": actor,
    }


async def statement(
    st: State, program: Program, code: str, currency: str, start: Any, end: Any
) -> dict[str, Any]:
    return await read_tables(st.store, statements.statement, program.program_id, code, currency, start, end)


async def balances(
    st: State, program: Program, codes: list[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    return await read_tables(st.store, statements.balances, program.program_id, codes)
