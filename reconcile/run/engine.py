"""The reconciler's engine for a store, and how a run is published.

The reconcile job (reconcile/run/job.py) runs on DuckDB. `open_engine` asks the store for the
database to run in (`Store.log_database`): the embedded database is that engine itself; a
PostgreSQL replica runs in its working copy of the shared log (ingest/storage/postgres/copy.py),
brought up to the watermark, and the job's final transaction publishes the run (`Publisher`,
through the store's `ResultSink`) before it commits. When the published tables are those of the
run this one built on (no other replica reconciled meanwhile), only changes are sent: an
incremental run's (rows deleted by key and inserted, statuses refreshed), or what a full run's
tables differ in from the ones they replace, compared in the copy (`_changes`: the rows of each
changed key); otherwise, or when a full run changed more than `CHANGES_SHARE` of the rows, the
published tables are replaced whole. A publish that fails rolls the local run back too, so copy
and published tables never disagree on which run is current.

`books` reads the log as of a period close for the reports, on either backend.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import duckdb
import polars as pl
import pyarrow as pa

from ingest.storage.contract import Changes, Reader, ResultSink, RunRecord, Store
from ingest.storage.partitions import Scope
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
ARROW_BATCH_ROWS = 262_144
# A full run whose rows differ from the published ones by more than this share of them
# replaces the published tables instead of sending its changes (which are held in memory,
# where a replace streams: 10 % of a 10M-event log's result rows is about a million rows).
CHANGES_SHARE = 0.1


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
    """`job.Publish` to a `ResultSink`."""

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
        if self._sink.builds_on(self._previous):
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
        if not self._sink.builds_on(self._previous):
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
        refresh = closure.refresh_sql("$1", self._sink.dialect, forward=forward, scope=self._sink.scope)
        for statement in refresh:
            changes.statements.append((statement, (patch.now,)))
        self._sink.patch(changes, run)
        self.mode = "patch"


@dataclass(frozen=True)
class Engine:
    """The reconciler's engine for one run: `cursor`, a DuckDB connection over the log that
    reconcile/run/job.py runs on, and `publish`, where the run's results go besides (None where
    the engine's database is the store's own: the embedded file)."""

    cursor: duckdb.DuckDBPyConnection
    publish: Publisher | None


@contextmanager
def open_engine(store: Store, scope: Scope | None = None) -> Iterator[Engine]:
    """The engine for `store`'s log (or partition `scope` of it), brought up to its watermark,
    for the block (one at a time: callers hold the reconcile lease): the embedded database
    itself, or a shared database's working copy on this machine, publishing to the shared
    database (`Store.log_database`)."""
    with store.log_database(scope) as db:
        yield Engine(db.cursor, None if db.sink is None else Publisher(db.sink, _latest(db.cursor)))


def books(
    db: Reader, program_id: str | None, before_seq: int | None
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """`job.read` of the log as `db` sees it (of one program, before a seq; the changes of terms
    after it too, which `job.read` wants): the books as of a period close."""
    later = (terms.KIND,) if before_seq else ()
    with db.log_database(program_id, before_seq, later) as con:
        return job.read(con, program_id=program_id, before_seq=before_seq)


__all__ = ["Engine", "Publisher", "books", "open_engine"]
