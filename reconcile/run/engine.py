"""The reconciler's working copy of a shared log: how a PostgreSQL replica reconciles.

The reconcile job (reconcile/job.py) runs on DuckDB: its chunked reads, its column mirror and its
incremental runs are DuckDB's. On the embedded backend the database is that engine. A replica of
a shared database keeps a DuckDB file of its own instead (`LocalEngine`, in `TALLY_ENGINE_DIR`,
by default a temporary directory of the process): a copy of the log's rows, derived and
disposable, which every session first brings up to the source's watermark (`LogSource`: the rows
after the last one copied, a window of sequence numbers at a time, as Arrow; the control plane
whole). The job then runs on the copy exactly as on an embedded database, and its final
transaction publishes the run (`Publisher`, through the `ResultSink`) before it commits. When
the published tables are those of the run this one built on (no other replica reconciled
meanwhile), only changes are sent: an incremental run's (rows deleted by key and inserted,
statuses refreshed), or what a full run's tables differ in from the ones they replace, compared
in the copy (`_changes`: the rows of each changed key); otherwise, or when a full run changed
more than `CHANGES_SHARE` of the rows, the published tables are replaced whole. A publish that
fails rolls the local run back too, so copy and published tables never disagree on which run is
current.

A working copy of another database (or of one restored to an earlier point) is thrown away and
rebuilt from the start.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from ingest.storage import lockfile, migrations, private
from ingest.storage.contract import Changes, LogSource, ResultSink, RunRecord
from ingest.storage.schema import CONTROL_PLANE_DDL, raw_events_ddl
from reconcile import explain, terms
from reconcile.run import closure, incremental, job

log = logging.getLogger("tally.reconcile")

# The published tables' indexes: what the reads filter on (reports/reads.py, reports/load.py, the
# dashboard: always one program, then a month, a time range or one sale). Each costs a full
# publish about a second per million rows; an incremental publish deletes its few stale keys
# with one scan of each table instead of keeping three more.
PUBLISHED_INDEXES: dict[str, tuple[tuple[str, ...], ...]] = {
    "rc_sales": (("program_id", "occurred_at"), ("program_id", "transaction_id")),
    "rc_commissions": (("program_id", "period"),),
    "rc_refunds": (("program_id", "period"),),
    "rc_double_counts": (("program_id", "occurred_at"),),
    "rc_evidence": (("program_id", "sale_id"),),
}
STATE_DDL = "CREATE TABLE IF NOT EXISTS engine_state (identity VARCHAR NOT NULL, pulled_seq BIGINT NOT NULL)"
ARROW_BATCH_ROWS = 262_144
# A full run whose rows differ from the published ones by more than this share of them
# replaces the published tables instead of sending its changes (which are held in memory,
# where a replace streams: 10 % of a 10M-event log's result rows is about a million rows).
CHANGES_SHARE = 0.1


class IncompleteCopy(Exception):
    """Raised by `LocalEngine.pull` when the log source gave fewer rows than its watermark says
    exist below it."""


class EngineInUse(Exception):
    """Another process works in the same engine directory (each replica needs its own)."""


def _arrow(frame: pl.DataFrame) -> pa.Table:
    return frame.to_arrow(compat_level=pl.CompatLevel.oldest())


def _latest(con: duckdb.DuckDBPyConnection) -> RunRecord | None:
    result = con.execute("SELECT * FROM rc_runs ORDER BY rowid DESC LIMIT 1")
    names = [d[0] for d in result.description or []]
    rows = result.fetchall()
    return dict(zip(names, rows[0], strict=True)) if rows else None


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str]]:
    return [
        (str(name), str(kind))
        for name, kind in con.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'main' AND table_name = ? ORDER BY ordinal_position",
            [table],
        ).fetchall()
    ]


def _digests(table: str, key: str | None) -> str:
    """Per key (or for the whole table): its rows' count and the sum of their row hashes."""
    rows = f"count(*) AS n, sum(hash(_row)::HUGEINT) AS h FROM {table} AS _row"
    return f"SELECT NULL AS value, {rows}" if key is None else f"SELECT {key} AS value, {rows} GROUP BY ALL"


def _changes(con: duckdb.DuckDBPyConnection) -> Changes | None:
    """What a full run changed in the tables it replaced (`job.previous`, in its transaction),
    as the published tables take it: in a table keyed as incremental runs key it, the keys whose
    rows differ are deleted and the run's rows of those keys inserted; any other table that
    differs is replaced whole. None when the outgoing tables are missing or of other columns,
    or when more than `CHANGES_SHARE` of the rows changed (replacing everything is then cheaper).

    Rows are compared by key through their count and the sum of their 64-bit row hashes
    (DuckDB's `hash` of the whole row, nulls included, column order counting): a key whose
    rows changed keeps both by chance about once in 2^64. An exact comparison (EXCEPT ALL of
    whole rows both ways) took 9 s at 1M events, more than publishing every table (4 s); this
    takes 0.6 s there, 7 to 9 s at 10M. The tables' sizes are counted first, so that a run
    over the budget stops at the table that crosses it, its changes never fetched."""
    tables = [*((t, a) for t, (a, _) in job.TABLES.items()), ("rc_unroutable", "")]
    rows = 0
    for table, _ in tables:
        columns = _columns(con, table)
        if not columns or columns != _columns(con, job.previous(table)):
            return None
        ((count,),) = con.execute(f"SELECT count(*) FROM {table}").fetchall()
        rows += int(count)
    # Nothing is fetched beyond the budget: a run that changed most rows costs the comparison
    # and counts, never its changes in memory.
    budget, sent = CHANGES_SHARE * rows, 0
    changes = Changes()
    for table, attribute in tables:
        key = incremental.KEYS.get(attribute)
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _rc_changed AS SELECT coalesce(new.value, old.value) AS value"
            f" FROM ({_digests(table, key)}) AS new FULL JOIN ({_digests(job.previous(table), key)}) AS old"
            " ON new.value IS NOT DISTINCT FROM old.value"
            " WHERE new.n IS DISTINCT FROM old.n OR new.h IS DISTINCT FROM old.h"
        )
        changed = (
            f"FROM {table}" if key is None else f"FROM {table} WHERE {key} IN (SELECT value FROM _rc_changed)"
        )
        ((keys, nulls, size),) = con.execute(
            f"SELECT count(*), count(*) - count(value), (SELECT count(*) {changed}) FROM _rc_changed"
        ).fetchall()
        sent += int(size) if keys else 0
        if sent > budget or (key is not None and nulls):  # too much, or a key not deletable by value
            con.execute("DROP TABLE _rc_changed")
            return None
        if keys and key is None:
            changes.replaces[table] = con.sql(changed).to_arrow_table()
        elif keys and key is not None:
            stale = con.sql("SELECT value FROM _rc_changed").to_arrow_table().column("value")
            changes.deletes[table] = (key, stale.combine_chunks().cast(pa.string()))
            changes.inserts[table] = con.sql(changed).to_arrow_table()
        con.execute("DROP TABLE _rc_changed")
    return changes


class Publisher:
    """`reconcile.job.Publish` to a `ResultSink`."""

    def __init__(self, sink: ResultSink, previous: RunRecord | None) -> None:
        self._sink = sink
        self._previous = str(previous["run_id"]) if previous else None
        # when the published statuses were last brought up to (the previous run's `now`)
        self._previous_now: datetime | None = previous["started_at"] if previous else None
        self.mode: str | None = None  # what the last publish did: "replace" | "changes" | "patch"

    def full(self, con: duckdb.DuckDBPyConnection) -> None:
        """Publish a full run: only the rows that differ from the tables it replaced
        (`changes`), when those are the published ones and not much changed; otherwise every
        published table replaced with this run's (read from the engine inside the run's
        transaction)."""
        run = _latest(con)
        assert run is not None
        if self._previous is not None and self._sink.latest_run() == self._previous:
            changes = _changes(con)
            if changes is not None:
                self._sink.patch(changes, run)
                self.mode = "changes"
                return
        # One table's rows at a time: each reader is opened once the sink has taken the previous.
        tables = (
            (name, con.sql(f"SELECT * FROM {name}").to_arrow_reader(ARROW_BATCH_ROWS)) for name in job.STAGED
        )
        views = {"rc_explain": explain.query("rc_evidence", "rc_sales")}
        self._sink.replace(tables, views, PUBLISHED_INDEXES, run)
        self.mode = "replace"

    def patch(self, con: duckdb.DuckDBPyConnection, patch: incremental.Patch) -> None:
        """Send the incremental run's changes, when the published tables are those it built on."""
        if self._sink.latest_run() != self._previous:
            log.info("published tables are not of run %s; publishing this run whole", self._previous)
            self.full(con)
            return
        run = _latest(con)
        assert run is not None
        changes = Changes()
        if patch.result is not None:
            stale = patch.stale.get_column("value").to_arrow().cast(pa.string())
            for table, (attribute, _) in patch.tables.items():
                if attribute not in incremental.KEYS:  # left alone by incremental runs (payouts)
                    continue
                changes.deletes[table] = (incremental.KEYS[attribute], stale)
                changes.inserts[table] = _arrow(getattr(patch.result, attribute))
        if patch.unroutable is not None:
            changes.replaces["rc_unroutable"] = _arrow(patch.unroutable)
        changes.scratch["_rc_holding"] = _arrow(patch.holding)
        forward = self._previous_now is not None and patch.now >= self._previous_now
        for statement in closure.refresh_sql("$1", self._sink.dialect, forward=forward):
            changes.statements.append((statement, (patch.now,)))
        self._sink.patch(changes, run)
        self.mode = "patch"


@dataclass
class Session:
    """`ingest.store.Engine` of a working copy: the job runs on `cursor` and publishes through
    `publish`."""

    cursor: duckdb.DuckDBPyConnection
    publish: Publisher


class LocalEngine:
    """The working copy (see the module docstring) in `directory`."""

    def __init__(self, directory: str | None, memory_mb: int = 512) -> None:
        self._scratch = directory is None
        private.restrict_umask()  # DuckDB creates the copy's files (and its WAL, again and again)
        self.directory = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="tally-engine-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        private.make_private(self.directory)  # a folder made by hand, or an older release's files
        self.path = self.directory / "reconcile.duckdb"
        self._memory_mb = memory_mb
        self._lock_fd = self._claim()
        self._con: duckdb.DuckDBPyConnection | None = None

    def _claim(self) -> int:
        try:
            return lockfile.hold(self.directory / "engine.lock")
        except lockfile.Held as held:
            raise EngineInUse(
                f"the reconcile working copy in {self.directory} is in use by process {held.holder};"
                " give each replica its own TALLY_ENGINE_DIR"
            ) from None

    def _open(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            con = duckdb.connect(str(self.path), config={"memory_limit": f"{self._memory_mb}MB"})
            con.execute("SET GLOBAL TimeZone = 'UTC'")
            migrations.apply(con)
            con.execute(STATE_DDL)
            self._con = con
        return self._con

    def _wipe(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        for path in (self.path, Path(f"{self.path}.wal")):
            path.unlink(missing_ok=True)
        shutil.rmtree(f"{self.path}.mirror", ignore_errors=True)

    def pull(self, source: LogSource) -> tuple[int, int]:
        """Bring the copy up to the source's watermark; (rows copied, watermark)."""
        identity = source.identity()
        watermark = source.watermark()
        con = self._open()
        state = con.execute("SELECT identity, pulled_seq FROM engine_state").fetchone()
        if state is not None and (state[0] != identity or int(state[1]) > watermark):
            log.warning("the reconcile working copy is of another log (or one ahead of it); rebuilding it")
            self._wipe()
            con = self._open()
            state = None
        pulled = int(state[1]) if state else 0
        # The rows are stored in any order, so DuckDB writes each batch on every thread: a first
        # pull of 1M events 6.6 to 7.1 -> 5.5 to 5.8 s on 2 cores (alternating runs), with the
        # same reconciled tables (docs/scaling.md).
        with job.unordered_inserts(con):
            copied = self._copy(con, source, identity, pulled, watermark)
        return copied, watermark

    @staticmethod
    def _copy(
        con: duckdb.DuckDBPyConnection, source: LogSource, identity: str, pulled: int, watermark: int
    ) -> int:
        """In one transaction: the rows after `pulled` up to `watermark`, the control plane, the
        copy's new state; the number of rows copied."""
        copied = 0
        con.execute("BEGIN TRANSACTION")
        # Sequence numbers are handed out without gaps (ingest/postgres_tx.py): a copy short of
        # rows would reconcile a log with holes, so it is refused (the run fails, results stay).
        try:
            for batch in source.raw(pulled, watermark):
                con.register("_engine_pull", batch)
                try:
                    con.execute("INSERT INTO raw_events BY NAME SELECT * FROM _engine_pull")
                finally:
                    con.unregister("_engine_pull")
                copied += batch.num_rows
            if copied != watermark - pulled:
                raise IncompleteCopy(
                    f"the log gave {copied} rows for seqs {pulled + 1}..{watermark}; the working copy"
                    " keeps what it had and this run stops"
                )
            programs, partners = source.control()
            for name, table in (("programs", programs), ("partners", partners)):
                con.execute(f"DELETE FROM {name}")
                con.register("_engine_control", table)
                try:
                    con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _engine_control")
                finally:
                    con.unregister("_engine_control")
            con.execute("DELETE FROM engine_state")
            con.execute("INSERT INTO engine_state VALUES (?, ?)", [identity, watermark])
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        return copied

    @contextmanager
    def session(self, source: LogSource, sink: ResultSink) -> Iterator[Session]:
        """The copy at the watermark, and a publisher to `sink`, for one run (or preview)."""
        self.pull(source)
        con = self._open()
        previous = _latest(con)
        cur = con.cursor()
        try:
            yield Session(cur, Publisher(sink, previous))
        finally:
            cur.close()

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        os.close(self._lock_fd)
        if self._scratch:
            shutil.rmtree(self.directory, ignore_errors=True)


def read_log(
    source: LogSource, program_id: str | None, before_seq: int | None
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """`job.read` over the source's rows (of one program, before a seq): the books as of a
    period close, on a replica of a shared log (in an in-memory DuckDB)."""
    upto = source.watermark() if before_seq is None else min(before_seq - 1, source.watermark())
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(raw_events_ddl())
        for ddl in CONTROL_PLANE_DDL:
            con.execute(ddl)
        # Before the seq, every row; after it, the changes of terms (job.read wants them too).
        later = source.raw(upto, source.watermark(), program_id, (terms.KIND,)) if before_seq else iter(())
        for batch in itertools.chain(source.raw(0, upto, program_id), later):
            con.register("_log", batch)
            con.execute("INSERT INTO raw_events BY NAME SELECT * FROM _log")
            con.unregister("_log")
        for name, table in zip(("programs", "partners"), source.control(), strict=True):
            con.register("_control", table)
            con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _control")
            con.unregister("_control")
        return job.read(con, program_id=program_id, before_seq=before_seq)


__all__ = ["EngineInUse", "IncompleteCopy", "LocalEngine", "Publisher", "Session", "read_log"]
