"""The reads of reports, the JSON reads and the dashboard on the embedded database (`Reader` of
ingest/storage/contract.py), on a DuckDB cursor of their own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:  # Polars loads only after the `tally` command has tuned its allocator
    import polars as pl


class DuckReader:
    """`Reader` on a DuckDB cursor."""

    dialect = "duckdb"

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self._cur = cur
        self._consistent = False  # inside `consistent()`

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._cur.execute(sql, list(params)).fetchall()

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        # fetchall: DuckDB refuses the cursor's next statement while a result is half-read
        rows = self._cur.execute(sql, list(params)).fetchall()
        return rows[0] if rows else None

    def dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        result = self._cur.execute(sql, list(params))
        names = [d[0] for d in result.description or []]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]

    def frame(self, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame:
        frame: pl.DataFrame = self._cur.sql(sql, params=list(params)).pl()
        return frame

    def table_exists(self, name: str) -> bool:
        sql = "SELECT count(*) FROM information_schema.tables WHERE table_name = ?"
        row = self.one(sql, [name])
        return bool(row and row[0])

    @contextmanager
    def consistent(self) -> Iterator[None]:
        if self._consistent:  # inside one already: the same snapshot
            yield
            return
        self._cur.execute("BEGIN TRANSACTION")
        self._consistent = True
        try:
            yield
        finally:
            self._consistent = False
            self._cur.execute("ROLLBACK")

    def period_close(self, program_id: str, period: str) -> tuple[int, datetime] | None:
        row = self.one(
            "SELECT seq, received_at FROM raw_events WHERE kind = 'period_close' AND outcome = 'accepted'"
            " AND program_id = ? AND json_extract_string(body, '$.period') = ? ORDER BY seq LIMIT 1",
            [program_id, period],
        )
        return (int(row[0]), row[1]) if row else None

    def raw_rows(self, seqs: Sequence[int]) -> list[dict[str, Any]]:
        if not seqs:
            return []
        return self.dicts(
            "SELECT * FROM raw_events WHERE list_contains(?::BIGINT[], seq) ORDER BY seq", [list(seqs)]
        )

    def latest_run(self) -> tuple[str, datetime] | None:
        if not self.table_exists("rc_runs"):
            return None
        row = self.one("SELECT run_id, finished_at FROM rc_runs ORDER BY rowid DESC LIMIT 1")
        return (str(row[0]), row[1]) if row else None

    @contextmanager
    def log_database(
        self, program_id: str | None, before_seq: int | None, later_kinds: Sequence[str] = ()
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """This reader's own cursor: the database holds the whole log."""
        yield self._cur
