"""The reconcile job: read the raw log, reconcile, replace the materialised tables atomically.

`run` is called by the server's single writer thread (scheduled, and on
`POST /api/v1/operator/reconcile`), which owns the DuckDB connection and passes it in. One run:

1. reads `raw_events` (only the columns the reconciler uses; `body` only for engineer actions),
   `programs` (settings JSON) and `partners`, inside one transaction so they are one snapshot;
2. runs the pure pipeline (reconcile/pipeline.py) as of `now`;
3. in ONE transaction, replaces `rc_sales`, `rc_commissions`, `rc_refunds`, `rc_double_counts`,
   `rc_evidence`, `rc_unroutable`, (re)creates the view `rc_explain` (steps rendered from
   `rc_evidence`, reconcile/explain.py) and appends a row to `rc_runs`. Readers see either the previous
   run or this one, never a mix; on any error the transaction is rolled back and the previous
   results stay.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import duckdb
import polars as pl

from reconcile import explain
from reconcile.pipeline import Result, reconcile
from reconcile.schema import PARTNER_SCHEMA, PROGRAM_SCHEMA, RAW_SCHEMA

Progress = Callable[[str, int, int], None]

# Materialised table -> Result attribute.
TABLES: dict[str, str] = {
    "rc_sales": "sales",
    "rc_commissions": "commissions",
    "rc_refunds": "refunds",
    "rc_double_counts": "double_counts",
    "rc_evidence": "evidence",
    "rc_unroutable": "unroutable",
}

RUNS_DDL = """CREATE TABLE IF NOT EXISTS rc_runs (
    run_id VARCHAR PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ NOT NULL,
    high_water_seq BIGINT NOT NULL,
    events_read BIGINT NOT NULL,
    sales BIGINT NOT NULL,
    commissions BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL)"""

ENGINEER_KINDS = ("backfill", "period_close")
STAGES = ("read", "reconcile", "write")


@dataclass(frozen=True)
class RunSummary:
    """What one run did; `sales` and `commissions` count the rows materialised."""

    run_id: str
    events_read: int
    sales: int
    commissions: int
    duration_ms: int
    high_water_seq: int


class ReconcileFailed(Exception):
    """Raised by `run` when a run could not be completed; the previous results are kept."""


def _raw_query() -> str:
    columns = [
        f"CASE WHEN kind IN {ENGINEER_KINDS!r} THEN body END AS body" if name == "body" else name
        for name in RAW_SCHEMA
    ]
    return f"SELECT {', '.join(columns)} FROM raw_events"


def _programs(rows: list[tuple[Any, ...]]) -> pl.DataFrame:
    records = []
    for program_id, settings in rows:
        try:
            parsed = json.loads(settings) if settings else {}
        except ValueError:
            parsed = {}
        values = parsed if isinstance(parsed, dict) else {}
        records.append(
            {"program_id": program_id, **{k: values.get(k) for k in PROGRAM_SCHEMA if k != "program_id"}}
        )
    return pl.DataFrame(records, schema=PROGRAM_SCHEMA, strict=False)


def read(
    con: duckdb.DuckDBPyConnection, program_id: str | None = None, before_seq: int | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The raw log, program settings and partners, as one consistent snapshot; optionally only one
    program's, and only the log before `before_seq` (the books as of a period close)."""
    where: list[str] = []
    params: list[Any] = []
    if program_id is not None:
        where.append("program_id = ?")
        params.append(program_id)
    if before_seq is not None:
        where.append("seq < ?")
        params.append(before_seq)
    raw_sql = _raw_query() + (f" WHERE {' AND '.join(where)}" if where else "")
    scope = " WHERE program_id = ?" if program_id is not None else ""
    scope_params = [program_id] if program_id is not None else []
    con.execute("BEGIN TRANSACTION")
    try:
        raw = con.sql(raw_sql, params=params).pl()
        programs = con.execute(f"SELECT program_id, settings FROM programs{scope}", scope_params).fetchall()
        partners = con.sql(f"SELECT program_id, code, email FROM partners{scope}", params=scope_params).pl()
    finally:
        con.execute("COMMIT")
    return raw, _programs(programs), partners.cast(PARTNER_SCHEMA)


def _replace_view(con: duckdb.DuckDBPyConnection, name: str, ddl: str) -> None:
    kind = con.execute(
        "SELECT table_type FROM information_schema.tables WHERE table_schema = 'main' AND table_name = ?",
        [name],
    ).fetchone()
    if kind is not None and kind[0] == "BASE TABLE":
        con.execute(f"DROP TABLE {name}")
    con.execute(ddl)


def write(
    con: duckdb.DuckDBPyConnection,
    result: Result,
    *,
    run_id: str,
    raw: pl.DataFrame,
    now: datetime,
    started: float,
) -> RunSummary:
    """Replace every materialised table and record the run, all in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(RUNS_DDL)
        for table, attribute in TABLES.items():
            frame: pl.DataFrame = getattr(result, attribute)
            view = f"_rc_new_{table}"
            con.register(view, frame.to_arrow())
            try:
                con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM {view}")
            finally:
                con.unregister(view)
        _replace_view(con, "rc_explain", explain.view_ddl("rc_evidence", "rc_explain"))
        high_water = raw.get_column("seq").max()
        summary = RunSummary(
            run_id=run_id,
            events_read=raw.height,
            sales=result.sales.height,
            commissions=result.commissions.height,
            duration_ms=round((time.perf_counter() - started) * 1000),
            high_water_seq=int(high_water) if isinstance(high_water, int) else 0,
        )
        con.execute(
            "INSERT INTO rc_runs (run_id, started_at, finished_at, high_water_seq, events_read, sales,"
            " commissions, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                summary.run_id,
                now,
                now + timedelta(milliseconds=summary.duration_ms),
                summary.high_water_seq,
                summary.events_read,
                summary.sales,
                summary.commissions,
                summary.duration_ms,
            ],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return summary


def run(con: duckdb.DuckDBPyConnection, now: datetime, on_progress: Progress | None = None) -> RunSummary:
    """Reconcile everything in `raw_events` as of `now` and materialise the results.

    `rc_runs.started_at` is `now`; `finished_at` is `now` plus the measured duration (the job
    reads no clock of its own, only a monotonic timer).
    """
    if now.tzinfo is None:
        raise ValueError("reconcile job needs an aware `now`")
    report: Progress = on_progress or (lambda _stage, _done, _total: None)
    started = time.perf_counter()
    run_id = f"rcr_{uuid.uuid4().hex}"
    try:
        report("read", 0, len(STAGES))
        raw, programs, partners = read(con)
        report("reconcile", 1, len(STAGES))
        result = reconcile(raw, programs, partners, now)
        report("write", 2, len(STAGES))
        summary = write(con, result, run_id=run_id, raw=raw, now=now, started=started)
    except duckdb.Error as exc:
        raise ReconcileFailed(f"reconcile run {run_id} failed: {exc}") from exc
    report("done", len(STAGES), len(STAGES))
    return summary
