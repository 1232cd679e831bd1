"""Reads of the reconciler's materialised tables (`rc_sales`, `rc_explain`) for the dashboard.

Before the first reconcile run the tables do not exist: the reads say so (None) instead of
failing, and the pages show an empty state.
"""

from __future__ import annotations

from typing import Any

from ingest.store import Store

SALE_COLUMNS = (
    "sale_id",
    "transaction_id",
    "source",
    "amount",
    "currency",
    "is_recurring",
    "test_mode",
    "partner_code",
    "attribution_rule",
    "unattributed_reason",
    "warnings",
    "commission",
    "platform_fee",
    "refunded",
    "occurred_at",
    "period",
)
EXPLAIN_COLUMNS = ("step", "rule", "looked_up", "found", "result")


def _exists(store: Store, table: str) -> bool:
    rows = store.query("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table])
    return bool(rows and rows[0][0])


def _rows(store: Store, columns: tuple[str, ...], sql: str, params: list[Any]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in store.query(sql, params)]


def sales(
    store: Store, program_id: str, limit: int, offset: int, attributed: bool | None = None
) -> list[dict[str, Any]] | None:
    """A page of the program's sales, newest first; None before the first reconcile run."""
    if not _exists(store, "rc_sales"):
        return None
    where = "program_id = ?"
    if attributed is not None:
        where += " AND partner_code IS NOT NULL" if attributed else " AND partner_code IS NULL"
    sql = (
        f"SELECT {', '.join(SALE_COLUMNS)} FROM rc_sales WHERE {where}"
        " ORDER BY occurred_at DESC, sale_id LIMIT ? OFFSET ?"
    )
    return _rows(store, SALE_COLUMNS, sql, [program_id, limit, offset])


def sale(store: Store, program_id: str, transaction_id: str) -> dict[str, Any] | None:
    """The program's (earliest) sale with this transaction id; None when there is none."""
    if not _exists(store, "rc_sales"):
        return None
    sql = (
        f"SELECT {', '.join(SALE_COLUMNS)} FROM rc_sales WHERE program_id = ? AND transaction_id = ?"
        " ORDER BY occurred_at, sale_id LIMIT 1"
    )
    found = _rows(store, SALE_COLUMNS, sql, [program_id, transaction_id])
    return found[0] if found else None


def explain(store: Store, program_id: str, sale_id: str) -> list[dict[str, Any]]:
    """The attribution ladder for one sale, step by step."""
    if not _exists(store, "rc_explain"):
        return []
    sql = (
        f"SELECT {', '.join(EXPLAIN_COLUMNS)} FROM rc_explain WHERE program_id = ? AND sale_id = ?"
        " ORDER BY step"
    )
    return _rows(store, EXPLAIN_COLUMNS, sql, [program_id, sale_id])
