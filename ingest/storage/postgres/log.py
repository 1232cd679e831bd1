"""PostgreSQL's seams for the reconciler and for reports: the log source, the result sink and the
reader (ingest/store.py `LogSource`, `ResultSink`, `Reader`).

Bulk reads and writes go through Arrow with the ADBC PostgreSQL driver (binary COPY both ways):
the reconciler pulls the log into its working copy (reconcile/engine.py) a window of sequence
numbers at a time, below the watermark, and publishes its tables back in one transaction.
Reports read the published `rc_*` tables with psycopg on a pooled connection.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import adbc_driver_postgresql.dbapi as adbc
import polars as pl
import psycopg
import pyarrow as pa
from psycopg.types.numeric import NumericLoader

from ingest.storage.contract import Changes, RunRecord
from ingest.storage.schema import RAW_EVENT_FIELDS
from ingest.storage.sql import Dialect, pyformat

if TYPE_CHECKING:
    from ingest.storage.postgres.store import PgStore

TRACK_KINDS = ("click", "lead", "sale", "refund", "stripe")
PULL_WINDOW = 500_000  # raw rows per query while the working copy catches up
PULL_CONNECTIONS = 2  # windows fetched at once
PUBLISH_WORK_MEM = "256MB"  # for the reconciler's publishing transaction only


class _WholeNumeric(NumericLoader):
    """`numeric` as int when whole (sums of bigint columns), else Decimal: reads give the same
    Python values on both backends."""

    def load(self, data: Any) -> Any:
        value = super().load(data)
        if isinstance(value, Decimal) and value == value.to_integral_value():
            return int(value)
        return value


def reader_types(con: psycopg.Connection[Any]) -> None:
    con.adapters.register_loader("numeric", _WholeNumeric)


@contextmanager
def _adbc(store: PgStore) -> Iterator[adbc.Connection]:
    con = adbc.connect(store.adbc_info)
    try:
        yield con
    finally:
        con.close()


class PgReader:
    """`ingest.store.Reader` on a pooled connection."""

    dialect: Dialect = "postgresql"

    def __init__(self, con: psycopg.Connection[Any], store: PgStore) -> None:
        self._con = con
        self._store = store

    def _execute(self, sql: str, params: Sequence[Any]) -> psycopg.Cursor[Any]:
        return self._con.execute(pyformat(sql, params), list(params) or None)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._execute(sql, params).fetchall()

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self.rows(sql, params)
        return rows[0] if rows else None

    def dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self._execute(sql, params)
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def frame(self, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame:
        cur = self._execute(sql, params)
        names = [d.name for d in cur.description or []]
        rows = cur.fetchall()
        if not rows:
            return pl.DataFrame(schema=dict.fromkeys(names, pl.Null))
        return pl.DataFrame(rows, schema=names, orient="row", infer_schema_length=None)

    def table_exists(self, name: str) -> bool:
        row = self.one(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?"
            " AND table_schema = current_schema()",
            [name],
        )
        return bool(row and row[0])

    @contextmanager
    def consistent(self) -> Iterator[None]:
        self._con.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield
        finally:
            self._con.execute(b"ROLLBACK")

    def period_close(self, program_id: str, period: str) -> tuple[int, datetime] | None:
        row = self.one(
            "SELECT seq, received_at FROM raw_events WHERE kind = 'period_close' AND outcome = 'accepted'"
            " AND program_id = ? AND body::jsonb ->> 'period' = ? ORDER BY seq LIMIT 1",
            [program_id, period],
        )
        return (int(row[0]), row[1]) if row else None

    def raw_rows(self, seqs: Sequence[int]) -> list[dict[str, Any]]:
        if not seqs:
            return []
        return self.dicts("SELECT * FROM raw_events WHERE seq = ANY(?) ORDER BY seq", [list(seqs)])

    def latest_run(self) -> tuple[str, datetime] | None:
        if not self.table_exists("rc_runs"):
            return None
        row = self.one("SELECT run_id, finished_at FROM rc_runs ORDER BY run_no DESC LIMIT 1")
        return (str(row[0]), row[1]) if row else None

    def log(
        self, program_id: str | None = None, before_seq: int | None = None
    ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        from reconcile.run.engine import read_log  # reconcile reads through ingest, not the other way

        return read_log(PgLogSource(self._store), program_id, before_seq)


class PgLogSource:
    """`ingest.store.LogSource`: the shared log, for the reconciler's working copy."""

    def __init__(self, store: PgStore) -> None:
        self._store = store

    def identity(self) -> str:
        row = self._store._one("SELECT value FROM tally_meta WHERE name = 'identity'")
        return str(row[0]) if row else ""

    def watermark(self) -> int:
        return self._store.watermark()

    def control(self) -> tuple[pa.Table, pa.Table]:
        with _adbc(self._store) as con, con.cursor() as cur:
            cur.execute("SELECT * FROM programs")
            programs = cur.fetch_arrow_table()
            cur.execute("SELECT * FROM partners")
            partners = cur.fetch_arrow_table()
        return programs, partners

    def raw(
        self, after_seq: int, upto_seq: int, program_id: str | None = None, kinds: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Raw rows with `after_seq < seq <= upto_seq` (of one program, of some kinds, if
        given), in seq order,
        every column but `headers`, `body` only for engineer actions (the reconciler reads no
        other body)."""
        columns = ", ".join(
            "CASE WHEN kind IN ({}) THEN '' ELSE body END AS body".format(
                ", ".join(f"'{k}'" for k in TRACK_KINDS)
            )
            if name == "body"
            else "'' AS headers"
            if name == "headers"
            else name
            for name in RAW_EVENT_FIELDS
        )
        where = "seq > $1 AND seq <= $2" + (" AND program_id = $3" if program_id is not None else "")
        if kinds is not None:  # a closed list of the reconciler's own kind names
            where += " AND kind IN ({})".format(", ".join(f"'{k}'" for k in kinds if k.isidentifier()))
        sql = f"SELECT {columns} FROM raw_events WHERE {where} ORDER BY seq"
        windows = [(at, min(at + PULL_WINDOW, upto_seq)) for at in range(after_seq, upto_seq, PULL_WINDOW)]
        if not windows:
            return
        local = threading.local()

        def fetch(window: tuple[int, int]) -> pa.Table:
            cur = getattr(local, "cur", None)
            if cur is None:
                con = adbc.connect(self._store.adbc_info)
                cur = local.cur = con.cursor()
                opened.append((con, cur))
            params = window if program_id is None else (*window, program_id)
            cur.execute(sql, parameters=params)
            table: pa.Table = cur.fetch_arrow_table()
            return table

        # Windows are fetched ahead on PULL_CONNECTIONS connections (the database's COPY and
        # the driver's decoding of one window overlap the caller's work on the one before),
        # and handed over in seq order.
        opened: list[tuple[adbc.Connection, adbc.Cursor]] = []
        ahead: deque[Future[pa.Table]] = deque()
        with ThreadPoolExecutor(PULL_CONNECTIONS, thread_name_prefix="tally-pull") as pool:
            try:
                for window in windows:  # at most PULL_CONNECTIONS windows in memory ahead of the caller
                    ahead.append(pool.submit(fetch, window))
                    if len(ahead) > PULL_CONNECTIONS:
                        yield from ahead.popleft().result().to_batches()
                while ahead:
                    yield from ahead.popleft().result().to_batches()
            finally:
                for future in ahead:
                    future.cancel()
                pool.shutdown(wait=True)
                for con, cur in opened:
                    cur.close()
                    con.close()


class PgResultSink:
    """`ingest.store.ResultSink`: the reconciler's tables published to every replica."""

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
        with _adbc(self._store) as con, con.cursor() as cur:
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
            con.commit()

    def patch(self, changes: Changes, run: RunRecord) -> None:
        """Rows deleted by key and inserted, statements run (status refreshes), the run
        recorded: one transaction."""
        with _adbc(self._store) as con, con.cursor() as cur:
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
            con.commit()


def _record(cur: Any, run: RunRecord) -> None:
    names = list(run)
    marks = ", ".join(f"${i + 1}" for i in range(len(names)))
    cur.execute(
        f"INSERT INTO rc_runs ({', '.join(names)}) VALUES ({marks})",
        parameters=tuple(run[n] for n in names),
    )
