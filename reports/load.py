"""Reading the report inputs of one program from the materialised tables (a `Reader`,
ingest/storage/contract.py).

Only the columns the builders use are read, straight into Arrow and Polars. Before the first
reconcile run the tables do not exist: the inputs are empty and so is the report.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import polars as pl

from ingest.domain.clock import utcnow
from ingest.storage.contract import Reader
from reconcile.pipeline import reconcile
from reconcile.run.engine import books
from reports.double_counting import DOUBLE_COUNT_FIELDS, DoubleCountingReport, build_double_counting
from reports.finance import (
    DOUBLE_INPUT,
    LINE_INPUT,
    REFUND_INPUT,
    SALE_INPUT,
    FinanceReport,
    Provenance,
    build_finance,
    from_result,
)


def month_bounds(period: str) -> tuple[datetime, datetime]:
    """`2026-01` -> [2026-01-01T00:00Z, 2026-02-01T00:00Z)."""
    year, month = int(period[:4]), int(period[5:7])
    start = datetime(year, month, 1, tzinfo=UTC)
    if (year, month) == (9999, 12):  # no year 10000: every time tally can hold is before max
        return start, datetime.max.replace(tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _frame(
    db: Reader,
    table: str,
    columns: dict[str, pl.DataType],
    sql: str,
    params: list[Any],
) -> pl.DataFrame:
    if not db.table_exists(table):
        return pl.DataFrame(schema=columns)
    frame = db.frame(sql, params)
    return frame.select(pl.col(name).cast(dtype) for name, dtype in columns.items())


def finance(db: Reader, program_id: str, period: str, program_name: str | None = None) -> FinanceReport:
    """The finance report of `program_id` for `period` (YYYY-MM) from the rc_* tables; for a closed
    month, the books as of its close: the log before the close, reconciled as of the close."""
    generated_at = utcnow()
    closed = period_close(db, program_id, period)
    if closed is not None:
        close_seq, closed_at = closed
        run_id, finished_at = latest_run(db)
        closed_by = next((str(row["actor"]) for row in db.raw_rows([close_seq]) if row.get("actor")), None)
        raw, programs, partners = books(db, program_id, close_seq)
        result = reconcile(raw, programs, partners, closed_at)
        report = from_result(result, program_id, period, program_name)
        provenance = Provenance(generated_at, run_id, finished_at, closed_at, closed_by)
        return replace(report, provenance=provenance)
    with db.consistent():
        run_id, finished_at = latest_run(db)
        sales, lines, refunds, doubles = _finance_inputs(db, program_id, period)
    report = build_finance(
        program_id=program_id,
        period=period,
        program_name=program_name,
        sales=sales,
        commissions=lines,
        refunds=refunds,
        double_counts=doubles,
    )
    return replace(report, provenance=Provenance(generated_at, run_id, finished_at, None))


def latest_run(db: Reader) -> tuple[str | None, datetime | None]:
    """(run id, finished at) of the newest reconcile run, or (None, None) before the first."""
    found = db.latest_run()
    return found if found is not None else (None, None)


def period_close(db: Reader, program_id: str, period: str) -> tuple[int, datetime] | None:
    """(seq, time) of the first close of `period` for the program, or None while it is open."""
    return db.period_close(program_id, period)


def _finance_inputs(
    db: Reader, program_id: str, period: str
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    start, end = month_bounds(period)
    # sales by the month they count in (a table published before `booked_period`: by `period`)
    booked = "booked_period" if _has_column(db, "rc_sales", "booked_period") else "period"
    sales = _frame(
        db,
        "rc_sales",
        SALE_INPUT,
        f"SELECT {', '.join(SALE_INPUT)} FROM rc_sales WHERE program_id = ? AND {booked} = ?",
        [program_id, period],
    )
    lines = _frame(
        db,
        "rc_commissions",
        LINE_INPUT,
        "SELECT currency, partner_code, kind, status, amount, reversed, platform_fee, platform_fee_reversed,"
        " sale_period, CASE WHEN kind <> 'commission' THEN transaction_id END AS transaction_id"
        " FROM rc_commissions WHERE program_id = ? AND period = ?",
        [program_id, period],
    )
    refunds = pl.DataFrame(schema=REFUND_INPUT)
    if db.table_exists("rc_sales"):
        refunds = _frame(
            db,
            "rc_refunds",
            REFUND_INPUT,
            "SELECT r.currency, r.amount, r.applied_amount, r.outcome, s.test_mode FROM rc_refunds r"
            " LEFT JOIN rc_sales s ON s.program_id = r.program_id AND s.sale_id = r.sale_id"
            " WHERE r.program_id = ? AND r.booked_period = ?",
            [program_id, period],
        )
    doubles = _frame(
        db,
        "rc_double_counts",
        DOUBLE_INPUT,
        "SELECT currency, kind, distinct_amount FROM rc_double_counts"
        " WHERE program_id = ? AND occurred_at >= ? AND occurred_at < ?",
        [program_id, start, end],
    )
    return sales, lines, refunds, doubles


def _has_column(db: Reader, table: str, column: str) -> bool:
    row = db.one(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [table, column],
    )
    return bool(row and row[0])


def double_counting(db: Reader, program_id: str, period: str | None = None) -> DoubleCountingReport:
    """Every double count of `program_id` (those whose record occurred in `period`, if given)."""
    where = "program_id = ?"
    params: list[Any] = [program_id]
    if period is not None:
        start, end = month_bounds(period)
        where += " AND occurred_at >= ? AND occurred_at < ?"
        params += [start, end]
    rows = _frame(
        db,
        "rc_double_counts",
        DOUBLE_COUNT_FIELDS,
        f"SELECT {', '.join(DOUBLE_COUNT_FIELDS)} FROM rc_double_counts WHERE {where}",
        params,
    )
    return build_double_counting(rows, program_id=program_id, period=period)
