"""The shared log as the reconciler's working copy reads it (`LogSource` of
ingest/storage/contract.py): Arrow through the ADBC PostgreSQL driver (binary COPY), a window of
sequence numbers at a time, below the watermark (ingest/storage/postgres/copy.py).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa

from ingest.storage.partitions import Scope
from ingest.storage.postgres.conn import adbc_connection
from ingest.storage.schema import RAW_EVENT_FIELDS

if TYPE_CHECKING:
    from ingest.storage.postgres.store import PgStore

TRACK_KINDS = ("click", "lead", "sale", "refund", "stripe")
PULL_WINDOW = 500_000  # raw rows per query while the working copy catches up
PULL_CONNECTIONS = 2  # windows fetched at once


class PgLogSource:
    """`LogSource`: the shared log, for the reconciler's working copy."""

    def __init__(self, store: PgStore) -> None:
        self._store = store

    def identity(self) -> str:
        row = self._store._one("SELECT value FROM tally_meta WHERE name = 'identity'")
        return str(row[0]) if row else ""

    def watermark(self) -> int:
        return self._store.watermark()

    def control(self) -> tuple[pa.Table, pa.Table]:
        with adbc_connection(self._store.adbc_info) as con, con.cursor() as cur:
            cur.execute("SELECT * FROM programs")
            programs = cur.fetch_arrow_table()
            cur.execute("SELECT * FROM partners")
            partners = cur.fetch_arrow_table()
        return programs, partners

    def count(self, after_seq: int, upto_seq: int, scope: Scope) -> int:
        """How many raw rows of partition `scope` have `after_seq < seq <= upto_seq`."""
        row = self._store._one(
            f"SELECT count(*) FROM raw_events WHERE seq > %s AND seq <= %s AND {scope.rows_sql()}",
            (after_seq, upto_seq),
        )
        return int(row[0]) if row else 0

    def raw(
        self,
        after_seq: int,
        upto_seq: int,
        program_id: str | None = None,
        kinds: Sequence[str] | None = None,
        scope: Scope | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Raw rows with `after_seq < seq <= upto_seq` (of one program, of some kinds, of one
        reconcile partition, if given), in seq order,
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
        if scope is not None:
            where += f" AND {scope.rows_sql()}"
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
