"""Line items for finance: the sales and commission rows of the JSON reads as CSV, and as sheets
of the finance xlsx.

One row per line, in the JSON's order and with its columns and values (money in integer minor
units), then each money column's `_decimal` twin in whole units of the row's currency: the one
CSV format of reports/csvcells.py; other cells as the finance CSV writes them
(reports/render.py); times in RFC 3339.

The finance xlsx of a month carries the same rows as `format=csv` gives for that month (sales
that occurred in it, commission lines of it) on sheets of their own (reports/xlsx.py): `read`
takes them from the same reconcile run as the report's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ingest.storage.contract import Reader
from reports import csvcells, load, reads
from reports.finance import FinanceReport

SALE_MONEY = ("amount", "gross_amount", "tax", "commission", "platform_fee", "refunded")
COMMISSION_MONEY = ("amount", "gross", "reversed", "platform_fee")


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return csvcells.value(value)


def columns_of(columns: Sequence[str], money: Sequence[str]) -> tuple[str, ...]:
    """The CSV's header: the JSON's columns, then the money columns' `_decimal` twins."""
    return (*columns, *csvcells.decimal_columns(money))


def cells_of(row: dict[str, Any], columns: Sequence[str], money: Sequence[str]) -> list[str]:
    """One row's cells under `columns_of(columns, money)`."""
    currency = row.get("currency")
    return [_cell(row.get(name)) for name in columns] + [
        csvcells.decimal(row.get(name), currency) for name in money
    ]


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str], money: Sequence[str]) -> bytes:
    """`rows` (dicts with `columns`, money in minor units beside a `currency`) as CSV bytes."""
    return csvcells.document(columns_of(columns, money), (cells_of(row, columns, money) for row in rows))


# Every sale of a month: LIMIT takes a number, and no month holds this many.
EVERY_ROW = 2**62
ATTEMPTS = 3  # reads of report and line items that a reconcile run may split, before giving up


@dataclass(frozen=True)
class LineItems:
    """The rows the sales and commissions CSVs give for one month, from one reconcile run."""

    sales: list[dict[str, Any]]
    commissions: list[dict[str, Any]]
    run_id: str | None = None


def read(db: Reader, program_id: str, period: str) -> LineItems:
    """The month's sales (by occurred_at) and commission lines (by period), as the JSON reads
    give them, on one state of the tables."""
    start, end = load.month_bounds(period)
    with db.consistent():
        run_id, _ = load.latest_run(db)
        sales = reads.sales(db, program_id, reads.SaleFilter(start=start, end=end, limit=EVERY_ROW))
        commissions = reads.commissions(db, program_id, period)
    return LineItems(sales, commissions, run_id)


def finance_with_lines(
    db: Reader, program_id: str, period: str, program_name: str | None = None
) -> tuple[FinanceReport, LineItems]:
    """The finance report and the month's line items, both from the same reconcile run (read
    again when a run finished between the two reads)."""
    for _ in range(ATTEMPTS):
        report = load.finance(db, program_id, period, program_name=program_name)
        lines = read(db, program_id, period)
        if report.provenance is None or report.provenance.run_id == lines.run_id:
            break
    return report, lines
