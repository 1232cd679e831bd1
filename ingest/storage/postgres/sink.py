"""Where a PostgreSQL replica publishes the reconciler's tables for every replica (`ResultSink`
of ingest/storage/contract.py): Arrow through the ADBC PostgreSQL driver (binary COPY), in one
transaction.

A replica reconciling one partition of the programs (ingest/storage/partitions.py) publishes
those programs' rows only: a whole publish builds each table anew from its rows and the other
partitions' rows as published, a patch deletes and inserts rows of its programs alone, and
`rc_unroutable` is partition 0's. Publishes take turns (a transaction-level advisory lock,
`PUBLISH_LOCK`): each reads what the one before it committed, so that two partitions publishing
at once never write back each other's older rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest.pause import pause
from ingest.storage.contract import Changes, RunRecord
from ingest.storage.partitions import Scope
from ingest.storage.postgres.conn import adbc_connection

if TYPE_CHECKING:
    from ingest.storage.postgres.store import PgStore

PUBLISH_WORK_MEM = "256MB"  # for the reconciler's publishing transaction only
PUBLISH_LOCK = 0x7461_6C6C_7970_7562  # pg_advisory_xact_lock key: one publishing transaction at a time
UNROUTABLE = "rc_unroutable"  # the one published table of no program: partition 0's


class PgResultSink:
    """`ResultSink`: the reconciler's tables (of the programs of `scope`, or all) published to
    every replica."""

    dialect = "postgresql"

    def __init__(self, store: PgStore, scope: Scope | None = None) -> None:
        self._store = store
        self.scope = scope

    def latest_run(self) -> str | None:
        row = self._store._one("SELECT run_id FROM rc_runs ORDER BY run_no DESC LIMIT 1")
        return str(row[0]) if row else None

    def builds_on(self, run_id: str | None) -> bool:
        if run_id is None:
            return False
        if self.scope is None:
            return self.latest_run() == run_id
        # Every run published since wrote other programs only: another partition of as many.
        row = self._store._one(
            "SELECT (SELECT run_no FROM rc_runs WHERE run_id = %s),"
            " (SELECT count(*) FROM rc_runs WHERE run_no > (SELECT run_no FROM rc_runs WHERE run_id = %s)"
            "  AND (parts IS DISTINCT FROM %s OR part = %s))",
            (run_id, run_id, self.scope.parts, self.scope.part),
        )
        return row is not None and row[0] is not None and row[1] == 0

    def _mine(self, table: str) -> str:
        """The condition on `table`'s published rows that they are this sink's to write."""
        if self.scope is None or table == UNROUTABLE:
            return "TRUE"
        return self.scope.programs_sql()

    def _writes(self, table: str) -> bool:
        return self.scope is None or table != UNROUTABLE or self.scope.part == 0

    def _kept(self, table: str, data: pa.Table) -> pa.Table:
        return data if self.scope is None or table == UNROUTABLE else self.scope.keep(data)

    def _reader(self, table: str, data: pa.RecordBatchReader) -> pa.RecordBatchReader:
        if self.scope is None or table == UNROUTABLE:
            return data
        scope = self.scope
        return pa.RecordBatchReader.from_batches(data.schema, (scope.keep(batch) for batch in data))

    def _record(self, cur: Any, run: RunRecord) -> None:
        if self.scope is not None:
            run = {**run, "part": self.scope.part, "parts": self.scope.parts}
        _record(cur, run)

    def replace(
        self,
        tables: Iterable[tuple[str, pa.RecordBatchReader]],
        views: Mapping[str, str],
        indexes: Mapping[str, Sequence[Sequence[str]]],
        run: RunRecord,
    ) -> None:
        """Every table replaced and the run recorded, in one transaction: a replica killed
        half-way (or a failure) leaves the previous run's tables as they were. A partition's
        tables are made of its rows and the other partitions' rows as published (the columns
        both have: a release that adds one leaves it empty in other partitions' rows until
        their next run)."""
        suffix = f"__{run['run_id']}"
        names = []
        with adbc_connection(self._store.adbc_info) as con, con.cursor() as cur:
            cur.execute(f"SELECT pg_advisory_xact_lock({PUBLISH_LOCK})")
            for name, data in tables:
                if not self._writes(name):
                    continue
                cur.adbc_ingest(name + suffix, self._reader(name, data), mode="create")
                if self.scope is not None and name != UNROUTABLE:
                    self._keep_others(cur, name, name + suffix)
                for number, columns in enumerate(indexes.get(name, ())):
                    cur.execute(
                        f'CREATE INDEX "{name}_{number}{suffix}" ON "{name}{suffix}" ({", ".join(columns)})'
                    )
                names.append(name)
            for view in views:
                cur.execute(f"DROP VIEW IF EXISTS {view}")
            for name in names:
                cur.execute(f"DROP TABLE IF EXISTS {name}")
                cur.execute(f'ALTER TABLE "{name}{suffix}" RENAME TO {name}')
            for view, select in views.items():
                cur.execute(f"CREATE VIEW {view} AS {select}")
            self._record(cur, run)
            pause("publish.commit")
            con.commit()

    def _keep_others(self, cur: Any, table: str, into: str) -> None:
        """Copy the rows of `table` (published) that are not this partition's into `into`."""
        cur.execute("SELECT to_regclass($1) IS NOT NULL", parameters=(table,))
        if not cur.fetchone()[0]:
            return
        names = "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        published = {str(name) for (name,) in _fetch(cur, f"{names} AND table_name = $1", (table,))}
        order = f"{names} AND table_name = $1 ORDER BY ordinal_position"
        common = [f'"{name}"' for (name,) in _fetch(cur, order, (into,)) if str(name) in published]
        listed = ", ".join(common)
        cur.execute(
            f"INSERT INTO {into} ({listed}) SELECT {listed} FROM {table} WHERE NOT ({self._mine(table)})"
        )

    def patch(self, changes: Changes, run: RunRecord) -> None:
        """Rows deleted by key and inserted, statements run (status refreshes), the run
        recorded: one transaction."""
        with adbc_connection(self._store.adbc_info) as con, con.cursor() as cur:
            cur.execute(f"SELECT pg_advisory_xact_lock({PUBLISH_LOCK})")
            # The deletes hash every stale key (10M events, +1 %: about half a million): with the
            # default work_mem each hash spills to disk. One publisher at a time (the run lock).
            cur.execute(f"SET LOCAL work_mem = '{PUBLISH_WORK_MEM}'")
            sent = None  # the keys in `_rc_stale` now: an incremental run deletes the same from every table
            for table, (column, values) in changes.deletes.items():
                if not self._writes(table):
                    continue
                if values is not sent:
                    cur.adbc_ingest("_rc_stale", pa.table({"value": values}), mode="replace", temporary=True)
                    cur.execute("ANALYZE _rc_stale")  # the planner's estimate of the key set's size
                    sent = values
                stale = f"{column} IN (SELECT value FROM _rc_stale)"
                cur.execute(f"DELETE FROM {table} WHERE {stale} AND {self._mine(table)}")
            for table, data in changes.replaces.items():
                if not self._writes(table):
                    continue
                cur.execute(f"DELETE FROM {table} WHERE {self._mine(table)}")
                cur.adbc_ingest(table, self._kept(table, data), mode="append")
            for table, data in changes.inserts.items():
                kept = self._kept(table, data)
                if kept.num_rows and self._writes(table):
                    cur.adbc_ingest(table, kept, mode="append")
            for name, data in changes.scratch.items():
                cur.adbc_ingest(name, data, mode="replace", temporary=True)
            for sql, params in changes.statements:
                cur.execute(sql, parameters=params)
            self._record(cur, run)
            pause("publish.commit")
            con.commit()


def _fetch(cur: Any, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    cur.execute(sql, parameters=params)
    rows: list[tuple[Any, ...]] = cur.fetchall()
    return rows


def _record(cur: Any, run: RunRecord) -> None:
    names = list(run)
    marks = ", ".join(f"${i + 1}" for i in range(len(names)))
    cur.execute(
        f"INSERT INTO rc_runs ({', '.join(names)}) VALUES ({marks})",
        parameters=tuple(run[n] for n in names),
    )
