"""Reads of the materialised reconcile tables for one program: sales, explain, commissions.

Each function takes a `Reader` (ingest/storage/contract.py: one snapshot) and returns plain rows
for the JSON API, the dashboard and the CLI. Before the first reconcile run the tables do not
exist: reads are empty.

A sale's `commission_status` is its commission line's: `paid` once that line is in a paid payout
batch (the reconciler's `rc_sales.commission_status` stops at `approved`; `_with_paid`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ingest.storage.contract import Reader

SALE_FIELDS = (
    "sale_id",
    "transaction_id",
    "source",
    "amount",
    "gross_amount",
    "tax",
    "currency",
    "is_recurring",
    "test_mode",
    "partner_code",
    "attribution_rule",
    "unattributed_reason",
    "warnings",
    "commission",
    "platform_fee",
    "commission_status",
    "refunded",
    "occurred_at",
    "period",
    "customer_key",
    "subscription_id",
)


@dataclass(frozen=True)
class SaleFilter:
    transaction_id: str | None = None
    start: datetime | None = None  # inclusive
    end: datetime | None = None  # exclusive
    attributed: bool | None = None
    partner_code: str | None = None
    currency: str | None = None  # lower case
    limit: int = 100
    offset: int = 0


def sales(db: Reader, program_id: str, flt: SaleFilter) -> list[dict[str, Any]]:
    if not db.table_exists("rc_sales"):
        return []
    where = ["program_id = ?"]
    params: list[Any] = [program_id]
    if flt.transaction_id is not None:
        where.append("transaction_id = ?")
        params.append(flt.transaction_id)
    if flt.start is not None:
        where.append("occurred_at >= ?")
        params.append(flt.start)
    if flt.end is not None:
        where.append("occurred_at < ?")
        params.append(flt.end)
    if flt.attributed is not None:
        where.append("partner_code IS NOT NULL" if flt.attributed else "partner_code IS NULL")
    if flt.partner_code is not None:
        where.append("partner_code = ?")
        params.append(flt.partner_code)
    if flt.currency is not None:
        where.append("currency = ?")
        params.append(flt.currency)
    sql = (
        f"SELECT {', '.join(SALE_FIELDS)} FROM rc_sales WHERE {' AND '.join(where)}"
        " ORDER BY occurred_at, sale_id LIMIT ? OFFSET ?"
    )
    return _with_paid(db, program_id, db.dicts(sql, [*params, flt.limit, flt.offset]))


# Sale statuses a paid commission line overrides: the line was approved, then paid. A sale fully
# refunded since (`reversed`), held or void keeps saying so.
PAYABLE = ("pending", "approved")
# Up to this many sales of a month are looked up by id; more (a month's CSV) read the month's
# paid lines whole, which is the same scan of the (program_id, period) index.
BY_ID = 500


def _with_paid(db: Reader, program_id: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with `commission_status` `paid` where the sale's `commission` line is in a paid
    payout batch (rc_commissions.status; CONTRACT section 7): the sale's status says what its
    line says. One query per month of the rows, on the index the commission reads use."""
    months: dict[str, set[str]] = {}
    for row in rows:
        if row["commission_status"] in PAYABLE and row["period"] is not None:
            months.setdefault(row["period"], set()).add(row["sale_id"])
    if not months or not db.table_exists("rc_commissions"):
        return rows
    paid: set[str] = set()
    for period, ids in months.items():
        sql = (
            "SELECT sale_id FROM rc_commissions WHERE program_id = ? AND period = ?"
            " AND kind = 'commission' AND status = 'paid'"
        )
        params: list[Any] = [program_id, period]
        if len(ids) <= BY_ID:
            sql += f" AND sale_id IN ({', '.join('?' * len(ids))})"
            params += sorted(ids)
        paid.update(str(found[0]) for found in db.rows(sql, params))
    for row in rows:
        if row["sale_id"] in paid and row["commission_status"] in PAYABLE:
            row["commission_status"] = "paid"
    return rows


def sale_currencies(db: Reader, program_id: str) -> list[str]:
    """The currencies a program's reconciled sales are in (a filter's choices)."""
    if not db.table_exists("rc_sales"):
        return []
    found = db.rows(
        "SELECT DISTINCT currency FROM rc_sales WHERE program_id = ? AND currency IS NOT NULL"
        " ORDER BY currency",
        [program_id],
    )
    return [str(row[0]) for row in found]


def explain(db: Reader, program_id: str, transaction_id: str) -> dict[str, Any] | None:
    found = sales(db, program_id, SaleFilter(transaction_id=transaction_id, limit=1))
    if not found:
        return None
    sale = found[0]
    steps = []
    if db.table_exists("rc_explain"):
        steps = db.dicts(
            "SELECT step, rule, looked_up, found, result FROM rc_explain"
            " WHERE program_id = ? AND sale_id = ? ORDER BY step",
            [program_id, sale["sale_id"]],
        )
    if sale["partner_code"] is not None:
        answer = f"attributed to {sale['partner_code']} by rule {sale['attribution_rule']}"
    else:
        answer = f"not attributed: {sale['unattributed_reason']}"
    return {
        "sale": sale,
        "steps": steps,
        "answer": answer,
        "lines": ledger_lines(db, program_id, sale["sale_id"]),
    }


def ledger_lines(db: Reader, program_id: str, sale_id: str) -> list[dict[str, Any]]:
    """A sale's commission lines with their bookings (reconcile/bookings.py): `booked_at` and
    `booking_id` (the log row that booked the line, null while pending), `cause` (the row that
    caused an adjustment or clawback), and `status_reason` / `status_by` (the last finance
    action on the sale: why, and who)."""
    if not db.table_exists("rc_commissions"):
        return []
    lines = db.dicts(
        "SELECT partner_code, kind, cause, adjusts, period, currency, amount, reversed, platform_fee,"
        " refunded, status, status_reason, status_by, payout_id, booked_seq, dated_at FROM rc_commissions"
        " WHERE program_id = ? AND sale_id = ? ORDER BY dated_at, kind, partner_code, cause",
        [program_id, sale_id],
    )
    seqs = sorted({int(line["booked_seq"]) for line in lines if line["booked_seq"] is not None})
    booked = {int(row["seq"]): row for row in db.raw_rows(seqs)} if seqs else {}
    for line in lines:
        row = booked.get(line.pop("booked_seq") or -1)
        line["booking_id"] = None if row is None else row["event_id"]
        line["booked_at"] = None if row is None else row["received_at"]
    return lines


COMMISSION_FIELDS = (
    "transaction_id",
    "sale_id",
    "partner_code",
    "amount",
    "gross",
    "reversed",
    "platform_fee",
    "currency",
    "status",
    "period",
    "sale_period",
    "kind",
    "adjusts",
    "cause",
    "payout_id",
    "self_referral",
    "available_at",
    "dated_at",
    "booked",
    "status_reason",
    "status_by",
)


def commissions(
    db: Reader, program_id: str, period: str | None, limit: int | None = None, offset: int = 0
) -> list[dict[str, Any]]:
    """A program's commission lines (of `period`), `limit` of them from `offset` on (all when
    `limit` is None), in the order of the line's key, so pages never overlap."""
    if not db.table_exists("rc_commissions"):
        return []
    where = ["program_id = ?"]
    params: list[Any] = [program_id]
    if period is not None:
        where.append("period = ?")
        params.append(period)
    return db.dicts(
        "SELECT transaction_id, sale_id, partner_code, amount, amount + reversed AS gross,"
        " reversed, platform_fee, currency, status, period,"
        " sale_period, kind, adjusts, cause, payout_id, self_referral, available_at, dated_at,"
        " booked_seq IS NOT NULL AS booked, status_reason, status_by"
        f" FROM rc_commissions WHERE {' AND '.join(where)}"
        " ORDER BY period, dated_at, sale_id, kind, partner_code, cause"
        + ("" if limit is None else " LIMIT ? OFFSET ?"),
        params if limit is None else [*params, limit, offset],
    )
