"""The reads of reports, the JSON reads and the dashboard on PostgreSQL (`Reader` of
ingest/storage/contract.py): the published `rc_*` tables, with psycopg on a pooled connection.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import duckdb
import polars as pl
import psycopg
from psycopg.types.numeric import NumericLoader

from ingest.storage.postgres.copy import log_copy
from ingest.storage.postgres.source import PgLogSource
from ingest.storage.sql import Dialect, pyformat

if TYPE_CHECKING:
    from ingest.storage.postgres.store import PgStore


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


class PgReader:
    """`Reader` on a pooled connection."""

    dialect: Dialect = "postgresql"

    def __init__(self, con: psycopg.Connection[Any], store: PgStore) -> None:
        self._con = con
        self._store = store
        self._consistent = False  # inside `consistent()`

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
        if self._consistent:  # inside one already: the same snapshot
            yield
            return
        self._con.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        self._consistent = True
        try:
            yield
        finally:
            self._consistent = False
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

    @contextmanager
    def log_database(
        self, program_id: str | None, before_seq: int | None, later_kinds: Sequence[str] = ()
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        with log_copy(PgLogSource(self._store), program_id, before_seq, later_kinds) as con:
            yield con
