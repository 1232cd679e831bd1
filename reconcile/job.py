"""The reconcile job: read the raw log, reconcile, replace the materialised tables atomically.

`run` is called by the server's single writer thread (scheduled, and on
`POST /api/v1/operator/reconcile`), which owns the DuckDB connection and passes it in. A run is
ONE transaction, so it works on one snapshot of `raw_events`, `programs` and `partners`, and
readers see either the previous run's tables or this run's, never a mix:

1. the programs are packed into chunks of at most `CHUNK_EVENTS` raw rows (a bigger program is a
   chunk of its own). Every reconcile rule is per program, so reconciling chunk by chunk gives
   exactly the result of reconciling the whole log at once (tests/reconcile/test_job.py), while
   Polars only ever holds one chunk. (DuckDB keeps the rows a transaction appends in its buffer
   pool until COMMIT; the database's `memory_limit` bounds that part.)
2. each chunk is read (only the columns the reconciler uses for each kind of row, schema.py
   READ_COLUMNS; `body` only for engineer actions) and reconciled (reconcile/pipeline.py);
3. the results replace `rc_sales`, `rc_commissions`, `rc_refunds`, `rc_double_counts`,
   `rc_evidence` and `rc_unroutable` (unroutable events belong to no program; read once), the
   view `rc_explain` (steps rendered from `rc_evidence`, reconcile/explain.py) is (re)created,
   and a row is appended to `rc_runs`; then COMMIT. On any error: ROLLBACK, previous results stay.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import duckdb
import polars as pl

from reconcile import explain
from reconcile.pipeline import Result, reconcile, unroutable
from reconcile.schema import (
    COMMISSIONS_SCHEMA,
    DOUBLE_COUNTS_SCHEMA,
    ENGINE,
    EVIDENCE_SCHEMA,
    PARTNER_SCHEMA,
    PROGRAM_SCHEMA,
    READ_COLUMNS,
    REFUNDS_SCHEMA,
    SALES_SCHEMA,
    UNROUTABLE_SCHEMA,
    conform,
    prepare_raw,
)

Progress = Callable[[str, int, int], None]

# Materialised table -> (Result attribute, schema).
TABLES: dict[str, tuple[str, dict[str, pl.DataType]]] = {
    "rc_sales": ("sales", SALES_SCHEMA),
    "rc_commissions": ("commissions", COMMISSIONS_SCHEMA),
    "rc_refunds": ("refunds", REFUNDS_SCHEMA),
    "rc_double_counts": ("double_counts", DOUBLE_COUNTS_SCHEMA),
    "rc_evidence": ("evidence", EVIDENCE_SCHEMA),
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
CHUNK_EVENTS = 1_000_000


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


# Each group of rows is read with its own columns (schema.READ_COLUMNS). Engineer actions are the
# only rows whose `body` is read: they are read apart, so the scan of the other rows never
# touches the (large) body column.
_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "stripe": ("kind = 'stripe'", READ_COLUMNS["stripe"]),
    "click": ("kind = 'click'", READ_COLUMNS["click"]),
    "other": (
        f"kind NOT IN ('stripe', 'click', {', '.join(repr(k) for k in ENGINEER_KINDS)})",
        tuple(c for c in READ_COLUMNS["other"] if c != "body"),
    ),
    # Found through `seq`: a scan filtered on `kind` alone decompresses every body; one whose
    # seqs come from a subquery skips the row groups that hold none of them.
    "engineer": (
        f"seq IN (SELECT seq FROM raw_events WHERE kind IN {ENGINEER_KINDS!r})",
        READ_COLUMNS["other"],
    ),
}


def _select(columns: Sequence[str]) -> str:
    return ", ".join(columns)


def raw_chunk(
    con: duckdb.DuckDBPyConnection, programs: Sequence[str] | None = None, before_seq: int | None = None
) -> pl.DataFrame:
    """The rows of `raw_events` (of the given programs, None = all; received before `before_seq`,
    None = all) with only the columns the reconciler reads for each kind of row
    (schema.READ_COLUMNS); the other columns are null."""
    where, params = "", list[object]()
    if programs is not None:
        where += " AND program_id IN (SELECT unnest(?::VARCHAR[]))"
        params.append(list(programs))
    if before_seq is not None:
        where += " AND seq < ?"
        params.append(before_seq)
    parts: list[pl.DataFrame] = [
        con.sql(f"SELECT {_select(columns)} FROM raw_events WHERE {kinds}{where}", params=params or None).pl()
        for kinds, columns in _GROUPS.values()
    ]
    return pl.concat(parts, how="diagonal_relaxed")


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


def control_plane(con: duckdb.DuckDBPyConnection) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Program settings and partners, as the reconciler takes them."""
    programs = _programs(con.execute("SELECT program_id, settings FROM programs").fetchall())
    partners: pl.DataFrame = con.sql("SELECT program_id, code, email FROM partners").pl()
    return programs, partners.select(pl.col(name).cast(dtype) for name, dtype in PARTNER_SCHEMA.items())


def read(
    con: duckdb.DuckDBPyConnection, program_id: str | None = None, before_seq: int | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The raw log (of one program and/or before a seq, if given; loaded), program settings and
    partners, as one consistent snapshot. For previews and books as of a close; the job itself
    never loads the whole log at once."""
    con.execute("BEGIN TRANSACTION")
    try:
        raw = raw_chunk(con, None if program_id is None else [program_id], before_seq)
        programs, partners = control_plane(con)
    finally:
        con.execute("COMMIT")
    return raw, programs, partners


def chunks(counts: Sequence[tuple[str, int]], limit: int | None = None) -> list[list[str]]:
    """Programs packed in order into chunks of at most `limit` (default CHUNK_EVENTS) events;
    one program is never split."""
    most = CHUNK_EVENTS if limit is None else limit
    packed: list[list[str]] = []
    size = 0
    for program_id, events in counts:
        if not packed or size + events > most:
            packed.append([])
            size = 0
        packed[-1].append(program_id)
        size += events
    return packed


def _replace_view(con: duckdb.DuckDBPyConnection, name: str, ddl: str) -> None:
    kind = con.execute(
        "SELECT table_type FROM information_schema.tables WHERE table_schema = 'main' AND table_name = ?",
        [name],
    ).fetchone()
    if kind is not None and kind[0] == "BASE TABLE":
        con.execute(f"DROP TABLE {name}")
    con.execute(ddl)


def _put(con: duckdb.DuckDBPyConnection, table: str, frame: pl.DataFrame, *, replace: bool) -> None:
    view = f"_rc_new_{table}"
    con.register(view, frame.to_arrow())
    try:
        if replace:
            con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM {view}")
        else:
            con.execute(f"INSERT INTO {table} SELECT * FROM {view}")
    finally:
        con.unregister(view)


STAGED = (*TABLES, "rc_unroutable")


def _staging(table: str, run_id: str) -> str:
    return f"{table}__{run_id}"


def _drop_staging(con: duckdb.DuckDBPyConnection, run_id: str | None = None) -> None:
    """Drop the staging tables of `run_id` (None: of any run, left by a crash)."""
    names = con.execute(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = 'main' AND table_type = 'BASE TABLE'"
    ).fetchall()
    for (name,) in names:
        table, _, run = str(name).partition("__")
        if table in STAGED and run.startswith("rcr_") and (run_id is None or run == run_id):
            con.execute(f'DROP TABLE IF EXISTS "{name}"')


def _reconcile_all(
    con: duckdb.DuckDBPyConnection,
    reader: duckdb.DuckDBPyConnection,
    run_id: str,
    now: datetime,
    report: Progress,
) -> tuple[int, int, int, int]:
    """Reconcile chunk by chunk, reading through `reader` (one snapshot) and writing each chunk's
    rows to this run's staging tables (committed as they go, so the database can spill them);
    (events, high water seq, sales, lines)."""
    events, high_water = reader.execute(
        "SELECT count(*), coalesce(max(seq), 0) FROM raw_events"
    ).fetchone() or (
        0,
        0,
    )
    counts = reader.execute(
        "SELECT program_id, count(*) FROM raw_events WHERE program_id IS NOT NULL"
        " GROUP BY program_id ORDER BY program_id"
    ).fetchall()
    programs, partners = control_plane(reader)
    for table, (_, schema) in TABLES.items():
        _put(con, _staging(table, run_id), pl.DataFrame(schema=schema), replace=True)
    packed = chunks(counts)
    sales = lines = 0
    for done, chunk in enumerate(packed):
        report("reconcile", done, len(packed))
        result = reconcile(raw_chunk(reader, chunk), programs, partners, now)
        for table, (attribute, _) in TABLES.items():
            _put(con, _staging(table, run_id), getattr(result, attribute), replace=False)
        sales += result.sales.height
        lines += result.commissions.height
        del result
    report("write", len(packed), len(packed))
    stray = reader.sql(
        f"SELECT {_select(READ_COLUMNS['stripe'])} FROM raw_events WHERE program_id IS NULL"
    ).pl()
    lost = unroutable(prepare_raw(stray)).collect(engine=ENGINE)
    _put(
        con,
        _staging("rc_unroutable", run_id),
        conform(lost.lazy(), UNROUTABLE_SCHEMA).collect(engine=ENGINE),
        replace=True,
    )
    return int(events), int(high_water), sales, lines


def _swap_in(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Inside the final transaction: this run's staging tables become the rc_* tables."""
    for table in STAGED:
        con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(f'ALTER TABLE "{_staging(table, run_id)}" RENAME TO {table}')
    _replace_view(con, "rc_explain", explain.view_ddl("rc_evidence", "rc_explain"))


def _record(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    now: datetime,
    started: float,
    counts: tuple[int, int, int, int],
) -> RunSummary:
    events, high_water, sales, lines = counts
    con.execute(RUNS_DDL)
    summary = RunSummary(
        run_id=run_id,
        events_read=events,
        sales=sales,
        commissions=lines,
        duration_ms=round((time.perf_counter() - started) * 1000),
        high_water_seq=high_water,
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
    return summary


def _transaction(con: duckdb.DuckDBPyConnection, run_id: str, work: Callable[[], RunSummary]) -> RunSummary:
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            summary = work()
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    except duckdb.Error as exc:
        raise ReconcileFailed(f"reconcile run {run_id} failed: {exc}") from exc
    return summary


def write(
    con: duckdb.DuckDBPyConnection,
    result: Result,
    *,
    run_id: str,
    raw: pl.DataFrame,
    now: datetime,
    started: float,
) -> RunSummary:
    """Materialise an already computed `result` (of the log `raw`) the way `run` does, in one
    transaction, recording a run (for tests and tools that reconcile a log they hold)."""

    def work() -> RunSummary:
        for table, (attribute, _) in TABLES.items():
            _put(con, table, getattr(result, attribute), replace=True)
        _put(con, "rc_unroutable", result.unroutable, replace=True)
        _replace_view(con, "rc_explain", explain.view_ddl("rc_evidence", "rc_explain"))
        high_water = raw.get_column("seq").max() if raw.height else 0
        counts = (raw.height, int(high_water or 0), result.sales.height, result.commissions.height)  # type: ignore[arg-type]
        return _record(con, run_id, now, started, counts)

    return _transaction(con, run_id, work)


def run(con: duckdb.DuckDBPyConnection, now: datetime, on_progress: Progress | None = None) -> RunSummary:
    """Reconcile everything in `raw_events` as of `now` and materialise the results.

    Reads go through a cursor holding one read transaction (one snapshot of the log). Each
    chunk's rows are written to this run's staging tables (`rc_sales__<run_id>`, ...); a final
    short transaction swaps them in for the rc_* tables and records the run, so readers see the
    previous run or this one, never a mix. On failure the staging tables are dropped.
    `rc_runs.started_at` is `now`; `finished_at` is `now` plus the measured duration (the job
    reads no clock of its own, only a monotonic timer).
    """
    if now.tzinfo is None:
        raise ValueError("reconcile job needs an aware `now`")
    report: Progress = on_progress or (lambda _stage, _done, _total: None)
    started = time.perf_counter()
    run_id = f"rcr_{uuid.uuid4().hex}"
    report("read", 0, 1)
    try:
        _drop_staging(con)
        reader = con.cursor()
        try:
            reader.execute("BEGIN TRANSACTION")
            counts = _reconcile_all(con, reader, run_id, now, report)
        finally:
            reader.close()

        def swap() -> RunSummary:
            _swap_in(con, run_id)
            return _record(con, run_id, now, started, counts)

        summary = _transaction(con, run_id, swap)
    except BaseException as exc:
        _drop_staging(con, run_id)
        if isinstance(exc, duckdb.Error):
            raise ReconcileFailed(f"reconcile run {run_id} failed: {exc}") from exc
        raise
    report("done", 1, 1)
    return summary
