"""Reads of the materialised reconcile tables for one program: sales, explain, commissions.

Each function takes a DuckDB cursor (a snapshot) and returns plain rows for the JSON API, the
dashboard and the CLI. Before the first reconcile run the tables do not exist: reads are empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

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


def table_exists(cur: duckdb.DuckDBPyConnection, name: str) -> bool:
    row = cur.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
    ).fetchone()
    return bool(row and row[0])


def _dicts(cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    result = cur.execute(sql, params)
    names = [d[0] for d in result.description or []]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


@dataclass(frozen=True)
class SaleFilter:
    transaction_id: str | None = None
    start: datetime | None = None  # inclusive
    end: datetime | None = None  # exclusive
    attributed: bool | None = None
    limit: int = 100
    offset: int = 0


def sales(cur: duckdb.DuckDBPyConnection, program_id: str, flt: SaleFilter) -> list[dict[str, Any]]:
    if not table_exists(cur, "rc_sales"):
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
    return _dicts(cur, sql, [*params, flt.limit, flt.offset])


def explain(cur: duckdb.DuckDBPyConnection, program_id: str, transaction_id: str) -> dict[str, Any] | None:
    found = sales(cur, program_id, SaleFilter(transaction_id=transaction_id, limit=1))
    if not found:
        return None
    sale = found[0]
    steps = []
    if table_exists(cur, "rc_explain"):
        steps = _dicts(
            cur,
            "SELECT step, rule, looked_up, found, result FROM rc_explain"
            " WHERE program_id = ? AND sale_id = ? ORDER BY step",
            [program_id, sale["sale_id"]],
        )
    if sale["partner_code"] is not None:
        answer = f"attributed to {sale['partner_code']} by rule {sale['attribution_rule']}"
    else:
        answer = f"not attributed: {sale['unattributed_reason']}"
    return {"sale": sale, "steps": steps, "answer": answer}


def commissions(cur: duckdb.DuckDBPyConnection, program_id: str, period: str | None) -> list[dict[str, Any]]:
    if not table_exists(cur, "rc_commissions"):
        return []
    where = ["program_id = ?"]
    params: list[Any] = [program_id]
    if period is not None:
        where.append("period = ?")
        params.append(period)
    return _dicts(
        cur,
        "SELECT transaction_id, sale_id, partner_code, amount, amount + reversed AS gross,"
        " reversed, platform_fee, currency, status, period,"
        " sale_period, kind, self_referral, available_at"
        f" FROM rc_commissions WHERE {' AND '.join(where)} ORDER BY period, occurred_at, sale_id, kind",
        params,
    )
