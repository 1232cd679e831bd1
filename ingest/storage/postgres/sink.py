"""Where a PostgreSQL replica publishes the reconciler's tables for every replica (`ResultSink`
of ingest/storage/contract.py): Arrow through the ADBC PostgreSQL driver (binary COPY), in one
transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest.pause import pause
from ingest.storage.contract import Changes, RunRecord
from ingest.storage.postgres.conn import adbc_connection

if TYPE_CHECKING:
    from ingest.storage.postgres.store import PgStore

PUBLISH_WORK_MEM = "256MB"  # for the reconciler's publishing transaction only


class PgResultSink:
    """`ResultSink`: the reconciler's tables published to every replica."""

    dialect = "postgresql"

    def __init__(self, store: PgStore) -> None:
        self._store = store

    def latest_run(self) -> str | None:
        row = self._store._one("SELECT run_id FROM rc_runs ORDER BY run_no DESC LIMIT 1")
        return str(row[0]) if row else None

    def replace(
        self,
        tables: Iterable[tuple[str, pa.RecordBatchReader]],
        views: Mapping[str, str],
        indexes: Mapping[str, Sequence[Sequence[str]]],
        run: RunRecord,
    ) -> None:
        """Every table replaced and the run recorded, in one transaction: a replica killed
        half-way (or a failure) leaves the previous run's tables as they were."""
        suffix = f"__{run['run_id']}"
        names = []
        with adbc_connection(self._store.adbc_info) as con, con.cursor() as cur:
            for name, data in tables:
                cur.adbc_ingest(name + suffix, data, mode="create")
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
            _record(cur, run)
            pause("publish.commit")
            con.commit()

    def patch(self, changes: Changes, run: RunRecord) -> None:
        """Rows deleted by key and inserted, statements run (status refreshes), the run
        recorded: one transaction."""
        with adbc_connection(self._store.adbc_info) as con, con.cursor() as cur:
            # The deletes hash every stale key (10M events, +1 %: about half a million): with the
            # default work_mem each hash spills to disk. One publisher at a time (the run lock).
            cur.execute(f"SET LOCAL work_mem = '{PUBLISH_WORK_MEM}'")
            sent = None  # the keys in `_rc_stale` now: an incremental run deletes the same from every table
            for table, (column, values) in changes.deletes.items():
                if values is not sent:
                    cur.adbc_ingest("_rc_stale", pa.table({"value": values}), mode="replace", temporary=True)
                    cur.execute("ANALYZE _rc_stale")  # the planner's estimate of the key set's size
                    sent = values
                cur.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT value FROM _rc_stale)")
            for table, data in changes.replaces.items():
                cur.execute(f"DELETE FROM {table}")
                cur.adbc_ingest(table, data, mode="append")
            for table, data in changes.inserts.items():
                if data.num_rows:
                    cur.adbc_ingest(table, data, mode="append")
            for name, data in changes.scratch.items():
                cur.adbc_ingest(name, data, mode="replace", temporary=True)
            for sql, params in changes.statements:
                cur.execute(sql, parameters=params)
            _record(cur, run)
            pause("publish.commit")
            con.commit()


def _record(cur: Any, run: RunRecord) -> None:
    names = list(run)
    marks = ", ".join(f"${i + 1}" for i in range(len(names)))
    cur.execute(
        f"INSERT INTO rc_runs ({', '.join(names)}) VALUES ({marks})",
        parameters=tuple(run[n] for n in names),
    )
