"""Reads of the materialised reconcile tables for one program: sales, explain, commissions.

Each function takes a `Reader` (ingest/store.py: one snapshot) and returns plain rows for the JSON API, the
dashboard and the CLI. Before the first reconcile run the tables do not exist: reads are empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ingest.store import Reader

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
    sql = (
        f"SELECT {', '.join(SALE_FIELDS)} FROM rc_sales WHERE {' AND '.join(where)}"
        " ORDER BY occurred_at, sale_id LIMIT ? OFFSET ?"
    )
    return db.dicts(sql, [*params, flt.limit, flt.offset])


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
    return {"sale": sale, "steps": steps, "answer": answer}


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
    "payout_id",
    "self_referral",
    "available_at",
    "dated_at",
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
        " sale_period, kind, adjusts, payout_id, self_referral, available_at, dated_at"
        f" FROM rc_commissions WHERE {' AND '.join(where)}"
        " ORDER BY period, dated_at, sale_id, kind, partner_code, cause"
        + ("" if limit is None else " LIMIT ? OFFSET ?"),
        params if limit is None else [*params, limit, offset],
    )
