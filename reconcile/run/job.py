"""The reconcile job: read the raw log, reconcile, replace the materialised tables atomically.

`run` is called on the engine's connection (reconcile/run/engine.py `open_engine`; the server
runs it through `reconcile.run.run`, scheduled and on `POST /api/v1/operator/reconcile`, holding
the run lock, api/jobs.py). A run is ONE transaction, so it works on one snapshot of
`raw_events`, `programs` and `partners`, and readers see either the previous run's tables or this
run's, never a mix. A run that can build on the previous one patches the tables instead
(reconcile/run/incremental.py says when and how); a full run goes:

1. the log's column mirror (reconcile/run/mirror.py) takes in the rows it lacks, as Parquet segments;
2. the programs are packed into chunks of at most `CHUNK_EVENTS` raw rows; a bigger program is
   split into parts of about that size by component (the component store, brought up to the
   log's high water first, reconcile/run/components.py), each part read with the program's
   engineer actions (`plan` says in which order they run). Every reconcile rule is per
   program, and within a program per component (what incremental runs rely on too,
   reconcile/run/closure.py), so reconciling step by step gives exactly the result of
   reconciling the whole log at once (tests/reconcile/test_job.py), while Polars holds at most
   two steps' rows (one being reconciled, the results of the previous one being written): a
   run's peak memory follows `CHUNK_EVENTS`, not the log;
3. each chunk is read (only the columns the reconciler uses for each kind of row, schema.py
   READ_COLUMNS; `body` only for engineer actions: from the mirror's segments, plus the newer
   rows from DuckDB) and reconciled (reconcile/pipeline.py); its rows are appended to this run's
   staging tables by a second thread while the next chunk is reconciled;
4. the staging tables replace `rc_sales`, `rc_commissions`, `rc_refunds`, `rc_double_counts`,
   `rc_evidence`, `rc_payouts` and `rc_unroutable` (unroutable events belong to no program; read once), the
   view `rc_explain` (steps rendered from `rc_evidence` and `rc_sales`, reconcile/explain.py) is
   (re)created, the mirror's new segments are registered and a row is appended to `rc_runs`;
   then COMMIT. On any error: ROLLBACK, previous results stay.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

import duckdb
import polars as pl

from ingest.pause import pause, pausing
from ingest.progress import Progress
from ingest.storage.sql import unordered_inserts
from reconcile import explain, terms
from reconcile.pipeline import Result, reconcile
from reconcile.run import components, incremental, rowstore
from reconcile.run import mirror as mirror_module
from reconcile.run.mirror import Mirror
from reconcile.run.rowstore import RowStore
from reconcile.run.source import ENGINEER_KINDS, control_plane, raw_chunk, read_rows, unbooked_closes
from reconcile.schema import (
    COMMISSIONS_SCHEMA,
    DOUBLE_COUNTS_SCHEMA,
    EVIDENCE_SCHEMA,
    PAYOUTS_SCHEMA,
    REFUNDS_SCHEMA,
    SALES_SCHEMA,
    UNIQUE_STRINGS,
)

# Materialised table -> (Result attribute, schema).
TABLES: dict[str, tuple[str, dict[str, pl.DataType]]] = {
    "rc_sales": ("sales", SALES_SCHEMA),
    "rc_commissions": ("commissions", COMMISSIONS_SCHEMA),
    "rc_refunds": ("refunds", REFUNDS_SCHEMA),
    "rc_double_counts": ("double_counts", DOUBLE_COUNTS_SCHEMA),
    "rc_evidence": ("evidence", EVIDENCE_SCHEMA),
    "rc_payouts": ("payouts", PAYOUTS_SCHEMA),
}

# rc_runs, the record of every run, is made by the schema migrations (ingest/storage/migrations.py).

# A run's peak memory follows the size of a step, not the log's: 10M events (largest program 2M)
# with DuckDB's memory at the server's default 512 MB peaked at 3.8 GiB in steps of up to 2.5M
# events, and at about 2.2 GiB in steps of 1M, for about 10 % more time (each step reads its
# programs' rows from the mirror, and a program's parts each read all of its row groups).
CHUNK_EVENTS = 1_000_000


@dataclass(frozen=True)
class RunSummary:
    """What one run did; `sales`, `commissions` and `unroutable` (processor events routed to
    no program, reconcile/unroutable.py) count the rows materialised."""

    run_id: str
    events_read: int
    sales: int
    commissions: int
    duration_ms: int
    high_water_seq: int
    mode: str = "full"
    unroutable: int = 0
    # programs with a period close no booking holds yet (reconcile/periods.py): api/jobs.py books them
    unbooked_closes: tuple[str, ...] = ()


class ReconcileFailed(Exception):
    """Raised by `run` when a run could not be completed; the previous results are kept."""


Cursor = duckdb.DuckDBPyConnection  # the engine's connection (`Store.engine()`) the job runs on


def read(
    con: duckdb.DuckDBPyConnection, program_id: str | None = None, before_seq: int | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The raw log (of one program and/or before a seq, if given; loaded; with the changes of
    the programs' terms made after that seq too), program settings and partners, as one
    consistent snapshot. For previews and books as of a close; the job itself
    never loads the whole log at once."""
    con.execute("BEGIN TRANSACTION")
    try:
        raw = raw_chunk(con, None if program_id is None else [program_id], before_seq)
        if before_seq is not None:
            # The terms over time are the whole log's, whatever prefix is valued (reconcile/terms.py).
            where, params = "kind = ? AND seq >= ?", [terms.KIND, before_seq]
            if program_id is not None:
                where, params = f"{where} AND program_id = ?", [*params, program_id]
            later = read_rows(con, where, params, groups=("engineer",))
            raw = pl.concat([raw, later], how="diagonal_relaxed")
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


@dataclass(frozen=True)
class Unit:
    """What one step of a full run reconciles: the rows of `programs`, or, when a program
    alone is larger than a chunk, part `part` of `parts` of it (the components of the program's
    rows whose id hashes to `part`, with the program's engineer actions)."""

    programs: tuple[str, ...]
    part: int = 0
    parts: int = 1
    events: int = 0


def plan(counts: Sequence[tuple[str, int]], limit: int | None = None) -> list[Unit]:
    """The steps of a full run, largest first: every program of more than `limit` (default
    CHUNK_EVENTS) events split into enough parts of about `limit` (by component: the result is
    the union of the components' results, the engineer actions apart, reconcile/run/closure.py),
    the others packed into chunks (`chunks`). Each step's writes overlap the next step's
    reconcile; nothing overlaps the last step's writes, so the last should be small. (Splitting
    the smallest programs off as a first and a last chunk of their own gained nothing measurable
    at 10M events and cost 1M-event runs a third more time: three chunks instead of one, and
    small inserts that go through the WAL.)"""
    most = CHUNK_EVENTS if limit is None else limit
    small = [(program, events) for program, events in counts if events <= most]
    units = [
        Unit((program,), part, parts, -(-events // parts))
        for program, events in counts
        if events > most
        for parts in [-(-events // most)]
        for part in range(parts)
    ]
    sizes = dict(small)
    units += [Unit(tuple(chunk), events=sum(sizes[p] for p in chunk)) for chunk in chunks(small, most)]
    return sorted(units, key=lambda unit: -unit.events)


def _replace_view(con: duckdb.DuckDBPyConnection, name: str, ddl: str) -> None:
    kind = con.execute(
        "SELECT table_type FROM information_schema.tables WHERE table_schema = 'main' AND table_name = ?",
        [name],
    ).fetchone()
    if kind is not None and kind[0] == "BASE TABLE":
        con.execute(f"DROP TABLE {name}")
    con.execute(ddl)


def _column(name: str, sql_type: str) -> str:
    stored = f'"{name}" {sql_type}'
    return f"{stored} USING COMPRESSION uncompressed" if name in UNIQUE_STRINGS else stored


def _put(con: duckdb.DuckDBPyConnection, table: str, frame: pl.DataFrame, *, replace: bool) -> None:
    """Insert `frame` into `table` (`replace`: (re)created first, with the frame's columns).

    Columns of ids that are (nearly) unique per row (schema.UNIQUE_STRINGS) are stored
    uncompressed: DuckDB's default string compression (dictionary + FSST) saves them only half
    their size and costs 40 % of the CPU the inserts of a run take (one 2M-event chunk's rows:
    4.2 -> 2.5 CPU-s; the tables then take about 2.1x the disk)."""
    view = f"_rc_new_{table}"
    # Strings as Arrow string views: Polars hands its buffers over without a copy.
    con.register(view, frame.to_arrow(compat_level=pl.CompatLevel.newest()))
    try:
        if replace:
            shape = con.sql(f"SELECT * FROM {view}")
            columns = ", ".join(_column(n, str(t)) for n, t in zip(shape.columns, shape.types, strict=True))
            con.execute(f"CREATE OR REPLACE TABLE {table} ({columns})")
        con.execute(f"INSERT INTO {table} SELECT * FROM {view}")
    finally:
        con.unregister(view)


STAGED = (*TABLES, "rc_unroutable")
# What a run that failed or was killed leaves behind: its staging tables and a rebuilt store's.
DROPPED = frozenset((*STAGED, *components.STAGED))


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
        if table in DROPPED and run.startswith("rcr_") and (run_id is None or run == run_id):
            con.execute(f'DROP TABLE IF EXISTS "{name}"')


def _reconcile_all(
    con: duckdb.DuckDBPyConnection,
    reader: duckdb.DuckDBPyConnection,
    run_id: str,
    now: datetime,
    report: Progress,
    control: tuple[pl.DataFrame, pl.DataFrame],
    mirror: Mirror,
    store_update: components.Update,
) -> tuple[int, int, int, int]:
    """Reconcile chunk by chunk, reading through `reader` (one snapshot; the log's rows through
    `mirror`, which first takes in the rows it lacks) and writing each chunk's
    rows to this run's staging tables (committed as they go, so the database can spill them);
    (events, high water seq, sales, lines).

    Chunk k's inserts run in a second thread while chunk k+1 is read and reconciled (both
    release the GIL): 10M events, about 10 % less wall time for 0.4 GiB more peak RSS. Reading
    chunk k+1 ahead as well (a third thread) gained nothing measurable and took the peak to
    5.9 GiB."""
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
    mirror.extend(reader, int(high_water), report)
    programs, partners = control
    for table, (_, schema) in TABLES.items():
        _put(con, _staging(table, run_id), pl.DataFrame(schema=schema), replace=True)
    units = plan(counts)
    sales = lines = 0
    split: tuple[str, pl.DataFrame | None] = ("", None)

    def store(result: Result) -> None:
        for table, (attribute, _) in TABLES.items():
            _put(con, _staging(table, run_id), getattr(result, attribute), replace=False)

    with unordered_inserts(con), ThreadPoolExecutor(1, thread_name_prefix="rc-store") as pool:
        stored: Future[None] | None = None
        for done, unit in enumerate(units):
            report("reconcile", done, len(units))
            keep = None
            if unit.parts > 1:
                if split[0] != unit.programs[0]:
                    split = ("", None)  # the previous program's parts are done: free them first
                    split = (unit.programs[0], _parts(reader, mirror, store_update, unit))
                assigned = split[1]
                if assigned is None:
                    if unit.part:
                        continue  # part 0 reconciled the program whole
                else:
                    keep = assigned.filter(pl.col("part") == unit.part).get_column("seq")
                    if unit.part and keep.is_empty():
                        continue  # no component hashed here (part 0 always runs: the batches)
            result = reconcile(
                mirror.chunk(reader, unit.programs, keep), programs, partners, now, batch_lines=not unit.part
            )
            if unit.part:
                # a program's batches come from its engineer actions alone, which every part reads
                result = replace(result, payouts=result.payouts.clear())
            if stored is not None:
                stored.result()
            stored = pool.submit(store, result)
            if done == 0 and pausing("reconcile.chunk"):  # the crash tests: its rows written first
                stored.result()
                pause("reconcile.chunk")
            sales += result.sales.height
            lines += result.commissions.height
            del result
        report("write", len(units), len(units))
        lost = mirror.unroutable(reader, programs)
        if stored is not None:
            stored.result()
    _put(con, _staging("rc_unroutable", run_id), lost, replace=True)
    return int(events), int(high_water), sales, lines


def _parts(
    reader: duckdb.DuckDBPyConnection, mirror: Mirror, store: components.Update, unit: Unit
) -> pl.DataFrame | None:
    """(seq, part) of every row of the program of `unit` but its engineer actions: the part its
    component (in the component store as `store` brings it up to the run's high water) hashes
    to. None when a row has no component (the store does not cover it): the program is then
    reconciled whole."""
    rows = mirror.kinds(reader, unit.programs[0]).filter(~pl.col("kind").is_in(ENGINEER_KINDS))
    comps = store.comps(reader, rows.get_column("seq"))
    if comps.height != rows.height:
        return None
    return comps.select("seq", part=components.part(unit.parts))


def previous(table: str) -> str:
    """Where a full run keeps the outgoing `table` while it publishes (`Publish.full`)."""
    return f"{table}__previous"


def _swap_in(con: duckdb.DuckDBPyConnection, run_id: str, *, keep_previous: bool = False) -> None:
    """Inside the final transaction: this run's staging tables become the rc_* tables. The
    outgoing tables are dropped, or with `keep_previous` renamed (`previous`) for the publisher
    to compare against, and dropped by `_drop_previous` before the commit."""
    for table in STAGED:
        con.execute(f"DROP TABLE IF EXISTS {previous(table)}")
        if keep_previous:
            con.execute(f"ALTER TABLE IF EXISTS {table} RENAME TO {previous(table)}")
        else:
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(f'ALTER TABLE "{_staging(table, run_id)}" RENAME TO {table}')
    _replace_view(con, "rc_explain", explain.view_ddl())


def _drop_previous(con: duckdb.DuckDBPyConnection) -> None:
    for table in STAGED:
        con.execute(f"DROP TABLE IF EXISTS {previous(table)}")


def _record(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    now: datetime,
    started: float,
    counts: tuple[int, int, int, int],
    mode: str = "full",
    fingerprint: str | None = None,
) -> RunSummary:
    events, high_water, sales, lines = counts
    row = con.execute("SELECT count(*) FROM rc_unroutable").fetchone()
    summary = RunSummary(
        run_id=run_id,
        events_read=events,
        sales=sales,
        commissions=lines,
        duration_ms=round((time.perf_counter() - started) * 1000),
        high_water_seq=high_water,
        mode=mode,
        unroutable=int(row[0]) if row else 0,
    )
    con.execute(
        "INSERT INTO rc_runs (run_id, started_at, finished_at, high_water_seq, events_read, sales,"
        " commissions, duration_ms, mode, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            summary.run_id,
            now,
            now + timedelta(milliseconds=summary.duration_ms),
            summary.high_water_seq,
            summary.events_read,
            summary.sales,
            summary.commissions,
            summary.duration_ms,
            mode,
            fingerprint,
        ],
    )
    return summary


def _transaction(con: duckdb.DuckDBPyConnection, run_id: str, work: Callable[[], RunSummary]) -> RunSummary:
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            summary = work()
            pause("reconcile.commit")
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
        _replace_view(con, "rc_explain", explain.view_ddl())
        high_water = raw.get_column("seq").max() if raw.height else 0
        counts = (raw.height, int(high_water or 0), result.sales.height, result.commissions.height)  # type: ignore[arg-type]
        return _record(con, run_id, now, started, counts)

    return _transaction(con, run_id, work)


class Publish(Protocol):
    """Where a run's results go besides the engine's own tables (reconcile/run/engine.py): called
    inside the run's final transaction, after its tables and record are in place, so that a
    failure to publish rolls the run back. During `full` the tables the run replaces are still
    there, renamed (`previous`), so that only what changed need be sent."""

    def full(self, con: duckdb.DuckDBPyConnection) -> None: ...

    def patch(self, con: duckdb.DuckDBPyConnection, patch: incremental.Patch) -> None: ...


def run(
    con: duckdb.DuckDBPyConnection,
    now: datetime,
    on_progress: Progress | None = None,
    *,
    full: bool = False,
    publish: Publish | None = None,
) -> RunSummary:
    """Reconcile everything in `raw_events` as of `now` and materialise the results.

    Reads go through a cursor holding one read transaction (one snapshot of the log). When the
    previous run can be built on (reconcile/run/incremental.py says when), only what the rows added
    since then can change is recomputed and patched into the rc_* tables in one transaction.
    Otherwise (a full run) each chunk's rows are written to this run's staging tables
    (`rc_sales__<run_id>`, ...) and a final short transaction swaps them in for the rc_* tables.
    `full` forces a full run. A full run reads the log through its column mirror
    (reconcile/run/mirror.py), extending it first, and registers the segments it wrote in its final
    transaction. Either way the run is recorded in `rc_runs` in that same transaction, so
    readers see the previous run or this one, never a mix. On failure nothing changes (staging tables are
    dropped). `rc_runs.started_at` is `now`; `finished_at` is `now` plus the measured duration
    (the job reads no clock of its own, only a monotonic timer).
    """
    if now.tzinfo is None:
        raise ValueError("reconcile job needs an aware `now`")
    report: Progress = on_progress or (lambda _stage, _done, _total: None)
    started = time.perf_counter()
    run_id = f"rcr_{uuid.uuid4().hex}"
    report("read", 0, 1)
    mirror = Mirror(None)
    rows: RowStore | None = None
    staged = components.Staged(con.cursor(), run_id)
    try:
        _drop_staging(con)
        reader = con.cursor()
        try:
            reader.execute("BEGIN TRANSACTION")
            control = control_plane(reader)
            unbooked = unbooked_closes(reader)
            fingerprint = incremental.fingerprint(*control)
            # The component store follows the log on every run (reconcile/run/components.py),
            # brought up to the snapshot's high water first: a full run splits a program larger
            # than a chunk by component.
            rebuilt = components.covered(reader) is None
            if rebuilt:
                report("components", 0, 1)
            high_water = components.high_water(reader)
            store = components.catch_up(reader, high_water, staged)
            # The row store too (reconcile/run/rowstore.py): incremental runs read their
            # closure's rows there.
            rows = rowstore.brought_up(reader, high_water, report)
            patch = (
                None
                if full or rebuilt
                else incremental.prepare(
                    reader, control, fingerprint, now, report, TABLES, store, rows, limit=CHUNK_EVENTS
                )
            )
            mirror = Mirror.open(reader, verify=patch is None)  # a full run reads its segments
            if patch is None:
                counts = _reconcile_all(con, reader, run_id, now, report, control, mirror, store)
            else:
                # Whole segments only: the mirror keeps up with the log between full runs.
                mirror.extend(reader, patch.high_water, report, least=mirror_module.SEGMENT_ROWS)
        finally:
            reader.close()

        def swap() -> RunSummary:
            _swap_in(con, run_id, keep_previous=publish is not None)
            mirror.register(con)
            store.apply(con)
            if rows is not None:
                rows.apply(con)
            summary = _record(con, run_id, now, started, counts, "full", fingerprint)
            if publish is not None:
                report("publish", 0, 1)
                publish.full(con)
                _drop_previous(con)
            return summary

        def apply() -> RunSummary:
            assert patch is not None
            mirror.register(con)
            store.apply(con)
            if rows is not None:
                rows.apply(con)
            summary = _record(con, run_id, now, started, patch.apply(con), "incremental", fingerprint)
            if publish is not None:
                report("publish", 0, 1)
                publish.patch(con, patch)
            return summary

        summary = replace(
            _transaction(con, run_id, swap if patch is None else apply), unbooked_closes=unbooked
        )
    except BaseException as exc:
        _drop_staging(con, run_id)
        mirror.discard()
        if isinstance(exc, duckdb.Error):
            raise ReconcileFailed(f"reconcile run {run_id} failed: {exc}") from exc
        raise
    finally:
        staged.writer.close()
        if rows is not None:
            rows.close()
    mirror.prune()
    report("done", 1, 1)
    return summary
