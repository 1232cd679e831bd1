"""The write-ahead journal's batches on their way into DuckDB: the embedded backend's durable
group commits, copied in bulk.

The writer appends each group commit's rows to the journal (ingest/storage/duckdb/journal.py,
`O_DSYNC`) as one batch and answers; the copier thread moves journaled batches into the DuckDB
tables, whole and in order, one transaction per copy, recording the last batch copied in
`journal_state` (every 4,000 rows or every second: ingest/writer.py). Start-up copies what the
journal holds beyond it before serving (`recover`). A batch the database refuses for its data
(which checked rows should never meet) is set aside in `<database>.journal/set-aside/` with a
loud error, so the batches behind it keep flowing and start-up never fails on it; a resource
fault (ingest/storage/duckdb/faults.py) keeps every batch for the next attempt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from ingest.domain.errors import DatabaseUnavailable
from ingest.domain.keys import tagged_claim
from ingest.storage.duckdb.faults import not_the_data
from ingest.storage.duckdb.journal import Journal
from ingest.storage.schema import RAW_EVENT_COLUMNS

log = logging.getLogger("tally.store")

_ARROW_TYPES: dict[str, pa.DataType] = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
}


def _schema(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    return pa.schema(
        [pa.field(name, _ARROW_TYPES[typ.split()[0]], "NOT NULL" not in typ) for name, typ in columns]
    )


RAW_SCHEMA = _schema(RAW_EVENT_COLUMNS)
LOG_SCHEMA = _schema(
    (
        ("log_id", "BIGINT NOT NULL"),
        ("program_id", "VARCHAR NOT NULL"),
        ("logged_at", "TIMESTAMPTZ NOT NULL"),
        ("endpoint", "VARCHAR NOT NULL"),
        ("status", "INTEGER NOT NULL"),
        ("outcome", "VARCHAR NOT NULL"),
        ("detail", "VARCHAR NOT NULL"),
        ("request_id", "VARCHAR"),
        ("raw_seq", "BIGINT"),
    )
)
KEY_SCHEMA = _schema(
    (
        ("program_id", "VARCHAR NOT NULL"),
        ("key", "VARCHAR NOT NULL"),
        ("raw_seq", "BIGINT NOT NULL"),
    )
)
CHECK_SCHEMA = _schema(
    (
        ("program_id", "VARCHAR NOT NULL"),
        ("step", "VARCHAR NOT NULL"),
        ("done_at", "TIMESTAMPTZ NOT NULL"),
    )
)


def bulk_insert(
    cur: duckdb.DuckDBPyConnection, table: str, rows: list[tuple[Any, ...]], schema: pa.Schema
) -> None:
    if not rows:
        return
    columns = list(zip(*rows, strict=True))
    batch = pa.table(
        [pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)],
        schema=schema,
    )
    cur.register("_tally_batch", batch)
    try:
        cur.execute(f"INSERT INTO {table} SELECT * FROM _tally_batch")
    except BaseException:
        # The refusal aborted the caller's transaction: unregistering in it raises "Current
        # transaction is aborted" over the refusal (a copy refused for its data would pass for
        # a resource fault and be retried for ever). The caller's ROLLBACK drops the view.
        with contextlib.suppress(duckdb.Error):
            cur.unregister("_tally_batch")
        raise
    cur.unregister("_tally_batch")


def revive_rows(rows: list[list[Any]], schema: pa.Schema) -> list[tuple[Any, ...]]:
    """Journaled rows back to what was journaled: ISO strings in timestamp columns to datetimes,
    and NULL for the columns added to the table after the row was journaled."""
    stamps = [i for i, f in enumerate(schema) if pa.types.is_timestamp(f.type)]
    out = []
    for row in rows:
        # A row journaled by a release before a trailing column was added lacks it: NULL.
        row.extend([None] * (len(schema) - len(row)))
        for i in stamps:
            if isinstance(row[i], str):
                row[i] = datetime.fromisoformat(row[i])
        out.append(tuple(row))
    return out


_SEQ, _KIND = RAW_SCHEMA.names.index("seq"), RAW_SCHEMA.names.index("kind")


def _tag_claims(keys: list[tuple[Any, ...]], raw: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A batch's claims as this release makes them, for a batch journaled by a release before
    claims were tagged with their kind (the database's were tagged by schema migration 10): each
    by the kind of the batch's raw row that made it (ingest/domain/keys.py `tagged_claim`)."""
    kinds = {row[_SEQ]: row[_KIND] for row in raw}
    return [(program, tagged_claim(program, key, kinds.get(seq)), seq) for program, key, seq in keys]


@dataclass
class Batch:
    """One group commit's rows, as the journal holds them and the copier inserts them."""

    raw: list[tuple[Any, ...]]
    logs: list[tuple[Any, ...]]
    keys: list[tuple[Any, ...]]
    checks: list[tuple[Any, ...]]
    number: int = 0  # its journal batch number (0: never journaled)

    @property
    def empty(self) -> bool:
        return not (self.raw or self.logs or self.keys or self.checks)

    @property
    def rows(self) -> int:
        return len(self.raw) + len(self.logs) + len(self.keys) + len(self.checks)


class Copier:
    """The batches journaled and not yet in DuckDB (`pending`), and the copies that move them.
    Any thread may flush; only the writer journals. `fault(where, exc)` hears what failed (None:
    it works again); `checkpoint` runs after each copy (the key index's WAL)."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        journal: Journal | None,
        fault: Callable[[str, BaseException | None], None],
        checkpoint: Callable[[], None],
    ) -> None:
        self._con = con
        self.journal = journal
        self._fault = fault
        self._checkpoint = checkpoint
        self.pending: list[Batch] = []
        self._pending_rows = 0
        self._pending_since = 0.0
        self.lock = threading.Lock()  # pending batches and the journal's current segment
        self.copy_lock = threading.Lock()  # one copy into DuckDB at a time
        self._cur: duckdb.DuckDBPyConnection | None = None
        self.set_aside = 0  # journal batches the database refused, kept in set-aside/
        row = con.execute("SELECT last_batch FROM journal_state").fetchone()
        self.batch_no = int(row[0]) if row else 0

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._cur is None:
            self._cur = self._con.cursor()
        return self._cur

    def recover(self) -> None:
        assert self.journal is not None
        done = self.batch_no
        for record in self.journal.records():
            number = int(record["batch"])
            self.batch_no = max(self.batch_no, number)
            if number > done:
                try:
                    parts = [
                        revive_rows(record[part], schema)
                        for part, schema in (
                            ("raw", RAW_SCHEMA),
                            ("logs", LOG_SCHEMA),
                            ("keys", KEY_SCHEMA),
                            ("checks", CHECK_SCHEMA),
                        )
                    ]
                except (KeyError, TypeError, ValueError) as exc:
                    self._write_aside(number, record, exc)
                    continue
                raw, logs, keys, checks = parts
                if not record.get("tagged"):  # journaled before claims were tagged with their kind
                    keys = _tag_claims(keys, raw)
                self.pending.append(Batch(raw, logs, keys, checks, number))
        before = self.set_aside
        self.flush()
        if self.set_aside > before:
            log.error(
                "tally: start-up set aside %d journal batch(es) the database refused, in %s",
                self.set_aside - before,
                self.set_aside_dir(),
            )

    def journal_batch(self, batch: Batch) -> None:
        assert self.journal is not None
        with self.lock:
            number = self.batch_no + 1
            self.journal.append(
                {
                    "batch": number,
                    "raw": batch.raw,
                    "logs": batch.logs,
                    "keys": batch.keys,
                    "checks": batch.checks,
                    "tagged": True,  # its claims are tagged with their kind (`_tag_claims`)
                }
            )
            self.batch_no = batch.number = number
            if not self.pending:
                self._pending_since = time.monotonic()
            self.pending.append(batch)
            self._pending_rows += batch.rows

    def _copy_pending(self, cur: duckdb.DuckDBPyConnection, batches: list[Batch]) -> None:
        """Insert `batches` inside the caller's open transaction."""
        for table, part, schema in (
            ("raw_events", "raw", RAW_SCHEMA),
            ("tracking_log", "logs", LOG_SCHEMA),
            ("idempotency_keys", "keys", KEY_SCHEMA),
            ("checklist", "checks", CHECK_SCHEMA),
        ):
            rows = [row for batch in batches for row in getattr(batch, part)]
            bulk_insert(cur, table, rows, schema)

    def commit_with(self, cur: duckdb.DuckDBPyConnection, batch: Batch) -> None:
        """Commit the writer's open transaction with `batch`'s rows in it, after every journaled
        batch not yet copied (so rows still reach the tables in sequence order)."""
        with self.copy_lock:
            with self.lock:
                batches = [*self.pending, batch]
            self._copy_pending(cur, batches)
            if len(batches) > 1:
                cur.execute("UPDATE journal_state SET last_batch = ?", [batches[-2].number])
            cur.execute("COMMIT")
            self._fault("copy", None)
            with self.lock:  # only this (the writer) thread adds to `_pending`
                del self.pending[: len(batches) - 1]
                self._pending_rows = sum(b.rows for b in self.pending)

    def flush(self) -> None:
        """Copy every journaled batch into DuckDB, then drop the journal segments that held them.
        Safe from any thread; the writer keeps journaling new batches meanwhile. A batch the
        database refuses is set aside (see the module docstring); a resource fault raises
        `DatabaseUnavailable` and keeps every batch for the next attempt."""
        with self.copy_lock:
            if self.journal is not None and self.pending:
                try:  # the next segment, made while the writer can still append
                    self.journal.prepare()
                except OSError as exc:  # the rotation below makes it, or says why it cannot
                    log.warning("cannot make the next journal segment ahead: %s", exc)
            with self.lock:
                batches, self.pending = self.pending, []
                self._pending_rows = 0
                try:
                    closed = self.journal.rotate() if self.journal is not None else []
                except OSError as exc:
                    self.pending[:0] = batches
                    self._pending_rows += sum(b.rows for b in batches)
                    self._fault("copy", exc)
                    raise DatabaseUnavailable(f"cannot rotate the journal: {exc}") from exc
            try:
                if batches:
                    self._copy_batches(batches)
            except Exception as exc:
                with self.lock:  # keep them for the next attempt, oldest first
                    self.pending[:0] = batches
                    self._pending_rows += sum(b.rows for b in batches)
                self._fault("copy", exc)
                raise DatabaseUnavailable(f"copying the journal into the database failed: {exc}") from exc
            self._fault("copy", None)
            try:
                self._checkpoint()
            except sqlite3.Error as exc:  # the WAL keeps the pages; the next flush tries again
                log.warning("checkpointing the key index failed: %s", exc)
            if self.journal is not None:
                self.journal.remove(closed)

    def _copy_batches(self, batches: list[Batch]) -> None:
        """Copy `batches` in one transaction; when the database refuses their data, copy them
        one by one and set aside each it refuses alone. Resource faults propagate."""
        cur = self._cursor()
        try:
            self._copy_in_transaction(cur, batches)
            return
        except Exception as exc:
            if not_the_data(exc):
                raise
            log.warning("copying %d journal batches failed (%s); copying them one by one", len(batches), exc)
        for batch in batches:
            try:
                self._copy_in_transaction(cur, [batch])
            except Exception as exc:
                if not_the_data(exc):
                    raise
                self._set_aside(cur, batch, exc)

    def _copy_in_transaction(self, cur: duckdb.DuckDBPyConnection, batches: list[Batch]) -> None:
        cur.execute("BEGIN TRANSACTION")
        try:
            self._copy_pending(cur, batches)
            cur.execute("UPDATE journal_state SET last_batch = ?", [batches[-1].number])
            cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT rolled back
                cur.execute("ROLLBACK")
            raise

    def set_aside_dir(self) -> Path:
        assert self.journal is not None
        return self.journal.directory / "set-aside"

    def _set_aside(self, cur: duckdb.DuckDBPyConnection, batch: Batch, exc: Exception) -> None:
        """Keep a batch the database refuses in its own file and move the copied-up-to mark past
        it, so the batches behind it flow on."""
        parts = {"raw": batch.raw, "logs": batch.logs, "keys": batch.keys, "checks": batch.checks}
        self._write_aside(batch.number, parts, exc)
        cur.execute("UPDATE journal_state SET last_batch = ?", [batch.number])

    def _write_aside(self, number: int, record: Mapping[str, Any], exc: Exception) -> None:
        """Write one journal batch to `set-aside/` (durably), count it and say so loudly."""
        folder = self.set_aside_dir()
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{number:012d}.json"
        kept = {**record, "batch": number, "error": f"{type(exc).__name__}: {exc}"}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, orjson.dumps(kept, default=str))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.set_aside += 1
        log.error("journal batch %d was refused by the database and set aside in %s: %s", number, path, exc)

    def journal_backlog(self) -> tuple[int, int, float]:
        """Rows and batches journaled but not yet in DuckDB, and the oldest one's wait in seconds."""
        with self.lock:
            if not self.pending:
                return 0, 0, 0.0
            return self._pending_rows, len(self.pending), time.monotonic() - self._pending_since

    def backlog(self) -> tuple[int, float]:
        """Rows journaled but not yet in DuckDB, and for how many seconds the oldest has waited."""
        with self.lock:
            if not self.pending:
                return 0, 0.0
            return self._pending_rows, time.monotonic() - self._pending_since
