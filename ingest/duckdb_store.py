"""The embedded backend: one DuckDB file, owned by one process.

Writes happen only on the writer thread through `DuckTx`; raw-log, tracking-log, idempotency and
checklist rows are buffered per transaction and inserted in bulk (Arrow) at commit, which is what
makes group commit cheap. What the log decides on the hot path (duplicates, refund ceilings,
claims, clicks, bindings) is answered by the key index on disk (`ingest/hotkeys.py`), committed
with each batch; the control plane is a small in-memory copy (`ingest/index.py`), kept exact
because this process is the only writer.

Faults: every raw row is checked against the column types before it is buffered (a value DuckDB
cannot hold is refused there, as a 422, never acknowledged). A full disk or an I/O error while
committing is `DatabaseUnavailable` (503, nothing acknowledged) and makes `readiness()` report
the fault until a write or a probe succeeds again. The copier tells the database's refusals of a
batch (which checked rows should never meet) from resource faults: a refused batch is set aside
in `<database>.journal/set-aside/` with a loud error, so the rows behind it keep flowing and
start-up never fails on it; a resource fault keeps every batch for the next attempt.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import orjson
import pyarrow as pa

from ingest import bounds, lockfile, migrations, private
from ingest.errors import DatabaseUnavailable, ValidationFailed
from ingest.hotkeys import FORMAT as KEYS_FORMAT
from ingest.hotkeys import OBSERVED, KeyIndex, Progress, anchor_of
from ingest.index import Index, Undo
from ingest.journal import Journal
from ingest.records import (
    LOG_PAGE_COLUMNS,
    LOG_PAGE_MAX,
    Binding,
    Credential,
    LogLine,
    Partner,
    Program,
    ProgramSettings,
    Role,
    SaleLedger,
    StoredSession,
    credential_values,
)
from ingest.schema import RAW_EVENT_COLUMNS, RAW_EVENT_FIELDS, storable
from ingest.store import KeyRead, Needs, sale_partner

if TYPE_CHECKING:  # Polars loads only after the `tally` command has tuned its allocator
    import polars as pl

    from ingest.backup import BackupSummary
    from ingest.backup import Progress as BackupProgress

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


log = logging.getLogger("tally.store")

RAW_SCHEMA = _schema(RAW_EVENT_COLUMNS)
_KIND, _OUTCOME = RAW_EVENT_FIELDS.index("kind"), RAW_EVENT_FIELDS.index("outcome")
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


# The database's refusals of the data itself; anything else while copying (I/O, a full disk,
# memory) is a resource fault and the batch is kept for the next attempt.
_DATA_FAULTS: tuple[type[BaseException], ...] = (
    duckdb.ConversionException,
    duckdb.ConstraintException,
    duckdb.InvalidInputException,
    duckdb.OutOfRangeException,
    duckdb.TypeMismatchException,
    duckdb.InvalidTypeException,
    pa.ArrowException,
    OverflowError,
    TypeError,
    ValueError,
    UnicodeError,
)


_RESOURCE_FAULTS = (OSError, duckdb.IOException, duckdb.OutOfMemoryException, sqlite3.OperationalError)


def _resource_fault(exc: BaseException) -> bool:
    return not isinstance(exc, _DATA_FAULTS)


def _bulk_insert(
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


def _revive_rows(rows: list[list[Any]], schema: pa.Schema) -> list[tuple[Any, ...]]:
    """Journaled rows back to what was journaled: ISO strings in timestamp columns to datetimes."""
    stamps = [i for i, f in enumerate(schema) if pa.types.is_timestamp(f.type)]
    out = []
    for row in rows:
        for i in stamps:
            if isinstance(row[i], str):
                row[i] = datetime.fromisoformat(row[i])
        out.append(tuple(row))
    return out


def _stored_time(value: Any) -> datetime | None:
    """A stored time in UTC (`datetime.UTC`, whatever zone object DuckDB hands back), within
    today's bounds: one saved before them beyond year 9999 comes back from DuckDB as text and is
    read as the latest time tally accepts."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    log.warning("a stored time %r is beyond year 9999; read as %s", value, bounds.LATEST)
    return bounds.LATEST


def _json_set(raw: str) -> frozenset[str]:
    value = json.loads(raw)
    return frozenset(str(v) for v in value) if isinstance(value, list) else frozenset()


class DatabaseInUse(Exception):
    """Another store (in this process or another) has the database open: the embedded backend
    has exactly one writer, its journal and its key index beside the file."""


def own_files(path: str | Path) -> list[str]:
    """The files and folders the embedded database at `path` keeps beside it (docs/operations.md)."""
    suffixes = ["", ".wal", ".lock", ".journal", ".mirror"]
    suffixes += [".keys", ".keys-wal", ".keys-shm", ".keys-journal"]  # the key index (SQLite)
    return [f"{path}{suffix}" for suffix in suffixes]


def _claim(path: Path) -> int:
    """Lock `<path>.lock` for this store's lifetime, or raise `DatabaseInUse`."""
    try:
        return lockfile.hold(f"{path}.lock")
    except lockfile.Held as held:
        raise DatabaseInUse(
            f"{path} is in use by another tally store (process {held.holder}); the embedded database"
            " has one server at a time (several replicas need the PostgreSQL backend)"
        ) from None


@contextmanager
def _keys_faults() -> Iterator[None]:
    """A key-index write that fails for want of disk (or an I/O error) is the database being
    unavailable, like a journal write that fails: 503, nothing of the batch stored."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise DatabaseUnavailable(
            "tally cannot write to its database right now; nothing of this request was stored"
        ) from exc


@dataclass
class _Batch:
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


class DuckReader:
    """`ingest.store.Reader` on a DuckDB cursor."""

    dialect = "duckdb"

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self._cur = cur

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
        self._cur.execute("BEGIN TRANSACTION")
        try:
            yield
        finally:
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

    def log(
        self, program_id: str | None = None, before_seq: int | None = None
    ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        from reconcile import job  # reconcile reads through ingest; not the other way at import

        return job.read(self._cur, program_id=program_id, before_seq=before_seq)


@dataclass
class DuckEngine:
    """`ingest.store.Engine` of the embedded database: the job runs on the database itself."""

    cursor: duckdb.DuckDBPyConnection
    publish: None = None


class DuckTx:
    """A write transaction on the writer's cursor (see `ingest.store.Tx`)."""

    def __init__(self, store: DuckStore) -> None:
        self._store = store
        self._cur = store._writer_cursor()
        self._in_db_tx = False
        self.undo: Undo = []
        self._raw: list[tuple[Any, ...]] = []
        self._logs: list[tuple[Any, ...]] = []
        self._keys: list[tuple[Any, ...]] = []
        self._checks: list[tuple[Any, ...]] = []
        self._next_seq = store._seq + 1
        self._next_log = store._log_id + 1
        self._kx = store.keys
        self._kx.begin()
        self._last: tuple[int, object] | None = None  # the newest raw row: (seq, received_at)

    @property
    def index(self) -> Index:
        return self._store.index

    def _sql(self) -> duckdb.DuckDBPyConnection:
        """The writer's cursor inside a database transaction, begun on first use: batches of
        track calls never open one (they go to the journal); control-plane changes do."""
        if not self._in_db_tx:
            self._cur.execute("BEGIN TRANSACTION")
            self._in_db_tx = True
        return self._cur

    def mark(self) -> tuple[Any, ...]:
        """Where this transaction stands, for `release` (one operation's writes in a group)."""
        return (
            len(self._raw),
            len(self._logs),
            len(self._keys),
            len(self._checks),
            len(self.undo),
            self._next_seq,
            self._next_log,
            int(self._in_db_tx),
            self._kx.mark(),
            self._last,
        )

    def prefetch(self, needs: Sequence[Needs]) -> None:
        with _keys_faults():
            self._kx.prefetch(needs)

    def outdated(self, needs: Needs) -> bool:
        """Never: the endpoints read keys from the control plane this writer keeps itself."""
        return False

    def release(self, mark: tuple[Any, ...]) -> bool:
        """Drop what was written since `mark`; False when that cannot be done (statements ran
        in the database since), and then only rolling back the whole transaction can."""
        raw, logs, keys, checks, undo, next_seq, next_log, in_db, savepoint, last = mark
        if self._in_db_tx and not in_db:
            return False
        self._kx.release(savepoint)
        self._last = last
        del self._raw[raw:], self._logs[logs:], self._keys[keys:], self._checks[checks:]
        while len(self.undo) > undo:
            self.undo.pop()()
        self._next_seq, self._next_log = next_seq, next_log
        return True

    def append(self, row: Mapping[str, Any]) -> int:
        seq = self._next_seq
        full = dict(row)
        full["seq"] = seq
        full.setdefault("test_mode", False)
        problems = storable(full)
        if problems:
            raise ValidationFailed("the event holds values tally cannot store", fields=problems)
        self._next_seq += 1
        self._raw.append(tuple(map(full.get, RAW_EVENT_FIELDS)))
        with _keys_faults():
            self._kx.observe(full)
        self._last = (seq, full.get("received_at"))
        return seq

    def claim_keys(self, program_id: str, keys: Sequence[str], raw_seq: int) -> list[str]:
        claimed = []
        for key in keys:
            with _keys_faults():
                fresh = self._kx.claim(program_id, key)
            if fresh:
                self._keys.append((program_id, key, raw_seq))
                claimed.append(key)
        return claimed

    def log(
        self,
        program_id: str,
        at: datetime,
        endpoint: str,
        status: int,
        outcome: str,
        detail: str,
        request_id: str | None,
        raw_seq: int | None,
    ) -> None:
        log_id = self._next_log
        self._next_log += 1
        self._logs.append((log_id, program_id, at, endpoint, status, outcome, detail, request_id, raw_seq))

    def check(self, program_id: str, step: str, at: datetime) -> None:
        if self.index.put_checklist(program_id, step, at, self.undo):
            self._checks.append((program_id, step, at))

    def add_account(self, account_id: str, email: str, at: datetime) -> None:
        self._sql().execute("INSERT INTO accounts VALUES (?, ?, ?)", [account_id, email, at])

    def add_workspace(self, workspace_id: str, name: str, at: datetime) -> None:
        self._sql().execute("INSERT INTO workspaces VALUES (?, ?, ?)", [workspace_id, name, at])

    def add_member(self, workspace_id: str, account_id: str, role: Role, at: datetime) -> None:
        self._sql().execute(
            "INSERT INTO memberships VALUES (?, ?, ?, ?)", [workspace_id, account_id, role, at]
        )
        self.index.put_role(workspace_id, account_id, role, self.undo)

    def put_program(self, program: Program) -> None:
        self._sql().execute(
            "INSERT OR REPLACE INTO programs VALUES (?, ?, ?, ?, ?, ?)",
            [
                program.program_id,
                program.workspace_id,
                program.name,
                program.settings.model_dump_json(),
                program.created_at,
                program.updated_at,
            ],
        )
        self.index.put_program(program, self.undo)

    def add_partner(self, partner: Partner) -> None:
        self._sql().execute(
            "INSERT INTO partners VALUES (?, ?, ?, ?, ?, ?)",
            [
                partner.program_id,
                partner.code,
                partner.partner_id,
                partner.name,
                partner.email,
                partner.created_at,
            ],
        )
        self.index.put_partner(partner, self.undo)

    def add_credential(self, cred: Credential) -> None:
        self._sql().execute(
            "INSERT INTO credentials VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", list(credential_values(cred))
        )
        self.index.put_credential(cred, self.undo)

    def revoke_credentials(self, kind: str, subject_id: str, at: datetime) -> None:
        self._sql().execute(
            "UPDATE credentials SET revoked_at = ? WHERE kind = ? AND subject_id = ? AND revoked_at IS NULL",
            [at, kind, subject_id],
        )
        for cred in list(self.index.credentials.values()):
            if cred.kind == kind and cred.subject_id == subject_id:
                self.index.put_credential(replace(cred, revoked_at=at), self.undo)

    def flag_credential(self, token_hash: str, flagged_at: datetime, deadline: datetime) -> None:
        self._sql().execute(
            "UPDATE credentials SET flagged_at = ?, rotation_deadline = ? WHERE token_hash = ?",
            [flagged_at, deadline, token_hash],
        )
        cred = self.index.credentials[token_hash]
        self.index.put_credential(replace(cred, flagged_at=flagged_at, rotation_deadline=deadline), self.undo)

    def claim_sale(
        self, program_id: str, transaction_id: str, raw_seq: int, click_id: str | None, customer_key: str
    ) -> str | None:
        if not self.claim_keys(program_id, [transaction_id], raw_seq):
            return None
        return sale_partner(self, program_id, click_id, customer_key)

    # -- lookups inside the transaction (the key index's writer sees this batch's rows) ------
    def sale(self, program_id: str, keys: Sequence[str]) -> SaleLedger | None:
        return self._kx.sale(program_id, keys)

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        return self._kx.refund_seen(program_id, refund_id)

    def event_seen(self, event_id: str) -> bool:
        return self._kx.event_seen(event_id)

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        return self._kx.click_partner(program_id, click_id)

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        return self._kx.binding(program_id, customer_key)

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        return self._kx.provisional_click(program_id, customer_key)

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        return self._store.programs_for_stripe_account(account)  # the index holds this batch's changes

    def credential_used(self, token_hash: str) -> bool:
        row = self._cur.execute("SELECT 1 FROM credentials WHERE token_hash = ?", [token_hash]).fetchone()
        return row is not None

    def commit(self) -> None:
        """Make the batch durable: its rows in the journal, or, when control-plane changes are
        part of it (or there is no journal), its rows and those changes in one DuckDB commit,
        so a failure stores none of it. Raises `DatabaseUnavailable` on a resource fault."""
        batch = _Batch(self._raw, self._logs, self._keys, self._checks)
        store = self._store
        try:
            if self._in_db_tx or store._journal is None:
                store._commit_with(self._sql(), batch)
                self._in_db_tx = False
            elif not batch.empty:
                store._journal_batch(batch)
        except Exception as exc:
            if not _resource_fault(exc):
                raise
            store._fault("write", exc)
            raise DatabaseUnavailable(
                "tally cannot write to its database right now; nothing of this request was stored"
            ) from exc
        store._fault("write", None)
        store._commit_keys(self._kx, self._last)
        counts = store.ingested
        for row in batch.raw:
            key = (row[_KIND], row[_OUTCOME])
            counts[key] = counts.get(key, 0) + 1
        store._seq = self._next_seq - 1
        store._log_id = self._next_log - 1
        self.undo.clear()

    def rollback(self) -> None:
        self._kx.rollback()
        try:
            if self._in_db_tx:
                self._in_db_tx = False
                # (a failed COMMIT has already rolled the transaction back)
                with contextlib.suppress(duckdb.TransactionException):
                    self._cur.execute("ROLLBACK")
        finally:
            for step in reversed(self.undo):
                step()
            self.undo.clear()


class DuckStore:
    """The embedded DuckDB backend of `ingest.store.Store`."""

    def __init__(
        self,
        path: str | Path,
        key_cache_mb: int = 64,
        on_progress: Progress | None = None,
        memory_mb: int = 512,
    ) -> None:
        """Open (and migrate) the database at `path`; `key_cache_mb` bounds the key index's page
        cache and `memory_mb` DuckDB's memory (its buffer pool keeps the blocks ingest writes
        until it reaches its limit: without one, the server would grow with the log; beyond it,
        reconcile's large operators spill to disk); `on_progress(rows, total)` hears about a
        key-index rebuild or catch-up."""
        if str(path).startswith(("postgresql:", "postgres:")):
            raise ValueError(
                "a PostgreSQL URL is not a DuckDB file (ingest.backend.open_store picks the backend)"
            )
        target = Path(path)
        self.path = str(path)
        self._lock_fd: int | None = None
        if str(path) != ":memory:":
            private.restrict_umask()  # DuckDB and SQLite create files of their own beside it
            target.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _claim(target)
        try:
            self._con = duckdb.connect(str(path), config={"memory_limit": f"{memory_mb}MB"})
        except BaseException:
            self._unclaim()
            raise
        # TIMESTAMPTZ values come back as aware datetimes in UTC, whatever the machine's zone.
        self._con.execute("SET GLOBAL TimeZone = 'UTC'")
        self._local = threading.local()
        self._wcur: duckdb.DuckDBPyConnection | None = None
        try:
            migrations.apply(self._con)
            self.schema_version = migrations.check(self._con)
        except BaseException:
            self._con.close()
            self._unclaim()
            raise
        self.index = Index()
        self._seq = 0
        self._log_id = 0
        self._pending: list[_Batch] = []
        self._pending_rows = 0
        self._pending_since = 0.0
        self._journal: Journal | None = None
        self._lock = threading.Lock()  # pending batches and the journal's current segment
        self._copy_lock = threading.Lock()  # one copy into DuckDB at a time
        self._ccur: duckdb.DuckDBPyConnection | None = None
        self._faults: dict[str, str] = {}  # "write" | "copy" -> what failed, while it lasts
        self.set_aside = 0  # journal batches the database refused, kept in set-aside/
        # Raw rows appended by this process, by (kind, outcome): read by GET /metrics.
        self.ingested: dict[tuple[str, str], int] = {}
        row = self._con.execute("SELECT last_batch FROM journal_state").fetchone()
        self._batch_no = int(row[0]) if row else 0
        self.keys: KeyIndex
        self._keys_stale = False  # a key-index commit failed: catch up before the next write
        try:
            if str(path) != ":memory:":
                self.keys = KeyIndex(Path(f"{path}.keys"), key_cache_mb)
                self._journal = Journal(Path(f"{path}.journal"))
                private.make_private(*own_files(path))  # an older release's, made 0644
                self._recover()
            else:
                self.keys = KeyIndex(None, key_cache_mb)
            self._load()
            self.sync_keys(on_progress)
        except BaseException:
            if "keys" in vars(self):
                self.keys.close()
            self._con.close()
            self._unclaim()
            raise

    def _unclaim(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the lock
            self._lock_fd = None

    # -- the journal: durable group commits, copied into DuckDB in bulk ------------------------
    def _recover(self) -> None:
        assert self._journal is not None
        done = self._batch_no
        for record in self._journal.records():
            number = int(record["batch"])
            self._batch_no = max(self._batch_no, number)
            if number > done:
                try:
                    parts = [
                        _revive_rows(record[part], schema)
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
                self._pending.append(_Batch(raw, logs, keys, checks, number))
        before = self.set_aside
        self.flush()
        if self.set_aside > before:
            log.error(
                "tally: start-up set aside %d journal batch(es) the database refused, in %s",
                self.set_aside - before,
                self._set_aside_dir(),
            )

    def _journal_batch(self, batch: _Batch) -> None:
        assert self._journal is not None
        with self._lock:
            number = self._batch_no + 1
            self._journal.append(
                {
                    "batch": number,
                    "raw": batch.raw,
                    "logs": batch.logs,
                    "keys": batch.keys,
                    "checks": batch.checks,
                }
            )
            self._batch_no = batch.number = number
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(batch)
            self._pending_rows += batch.rows

    def _copy_pending(self, cur: duckdb.DuckDBPyConnection, batches: list[_Batch]) -> None:
        """Insert `batches` inside the caller's open transaction."""
        for table, part, schema in (
            ("raw_events", "raw", RAW_SCHEMA),
            ("tracking_log", "logs", LOG_SCHEMA),
            ("idempotency_keys", "keys", KEY_SCHEMA),
            ("checklist", "checks", CHECK_SCHEMA),
        ):
            rows = [row for batch in batches for row in getattr(batch, part)]
            _bulk_insert(cur, table, rows, schema)

    def _commit_with(self, cur: duckdb.DuckDBPyConnection, batch: _Batch) -> None:
        """Commit the writer's open transaction with `batch`'s rows in it, after every journaled
        batch not yet copied (so rows still reach the tables in sequence order)."""
        with self._copy_lock:
            with self._lock:
                batches = [*self._pending, batch]
            self._copy_pending(cur, batches)
            if len(batches) > 1:
                cur.execute("UPDATE journal_state SET last_batch = ?", [batches[-2].number])
            cur.execute("COMMIT")
            self._fault("copy", None)
            with self._lock:  # only this (the writer) thread adds to `_pending`
                del self._pending[: len(batches) - 1]
                self._pending_rows = sum(b.rows for b in self._pending)

    def flush(self) -> None:
        """Copy every journaled batch into DuckDB, then drop the journal segments that held them.
        Safe from any thread; the writer keeps journaling new batches meanwhile. A batch the
        database refuses is set aside (see the module docstring); a resource fault raises
        `DatabaseUnavailable` and keeps every batch for the next attempt."""
        with self._copy_lock:
            with self._lock:
                batches, self._pending = self._pending, []
                self._pending_rows = 0
                try:
                    closed = self._journal.rotate() if self._journal is not None else []
                except OSError as exc:
                    self._pending[:0] = batches
                    self._pending_rows += sum(b.rows for b in batches)
                    self._fault("copy", exc)
                    raise DatabaseUnavailable(f"cannot rotate the journal: {exc}") from exc
            try:
                if batches:
                    self._copy_batches(batches)
            except Exception as exc:
                with self._lock:  # keep them for the next attempt, oldest first
                    self._pending[:0] = batches
                    self._pending_rows += sum(b.rows for b in batches)
                self._fault("copy", exc)
                raise DatabaseUnavailable(f"copying the journal into the database failed: {exc}") from exc
            self._fault("copy", None)
            try:
                self.keys.checkpoint()
            except sqlite3.Error as exc:  # the WAL keeps the pages; the next flush tries again
                log.warning("checkpointing the key index failed: %s", exc)
            if self._journal is not None:
                self._journal.remove(closed)

    def _copy_batches(self, batches: list[_Batch]) -> None:
        """Copy `batches` in one transaction; when the database refuses their data, copy them
        one by one and set aside each it refuses alone. Resource faults propagate."""
        cur = self._copier_cursor()
        try:
            self._copy_in_transaction(cur, batches)
            return
        except Exception as exc:
            if _resource_fault(exc):
                raise
            log.warning("copying %d journal batches failed (%s); copying them one by one", len(batches), exc)
        for batch in batches:
            try:
                self._copy_in_transaction(cur, [batch])
            except Exception as exc:
                if _resource_fault(exc):
                    raise
                self._set_aside(cur, batch, exc)

    def _copy_in_transaction(self, cur: duckdb.DuckDBPyConnection, batches: list[_Batch]) -> None:
        cur.execute("BEGIN TRANSACTION")
        try:
            self._copy_pending(cur, batches)
            cur.execute("UPDATE journal_state SET last_batch = ?", [batches[-1].number])
            cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT rolled back
                cur.execute("ROLLBACK")
            raise

    def _set_aside_dir(self) -> Path:
        assert self._journal is not None
        return self._journal.directory / "set-aside"

    def _set_aside(self, cur: duckdb.DuckDBPyConnection, batch: _Batch, exc: Exception) -> None:
        """Keep a batch the database refuses in its own file and move the copied-up-to mark past
        it, so the batches behind it flow on."""
        parts = {"raw": batch.raw, "logs": batch.logs, "keys": batch.keys, "checks": batch.checks}
        self._write_aside(batch.number, parts, exc)
        cur.execute("UPDATE journal_state SET last_batch = ?", [batch.number])

    def _write_aside(self, number: int, record: Mapping[str, Any], exc: Exception) -> None:
        """Write one journal batch to `set-aside/` (durably), count it and say so loudly."""
        folder = self._set_aside_dir()
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

    # -- faults and readiness ------------------------------------------------------------------
    @staticmethod
    def resource_fault(exc: BaseException) -> bool:
        """Whether `exc` (or what it wraps) is the database failing rather than its data."""
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, _RESOURCE_FAULTS):
                return True
            if isinstance(cause, duckdb.TransactionException) and "Failed to commit" in str(cause):
                return True
            cause = cause.__cause__
        return False

    def _fault(self, where: str, exc: BaseException | None) -> None:
        if exc is None:
            self._faults.pop(where, None)
        else:
            self._faults[where] = f"{type(exc).__name__}: {exc}"

    def readiness(self) -> str | None:
        """Why the database cannot take writes right now, or None when it can. A write fault
        clears itself once a probe write to the journal's disk succeeds; a copy fault once the
        copier gets through again."""
        if "copy" in self._faults:
            return self._faults["copy"]
        for where in ("write", "keys"):  # the next write catches the key index up itself
            if where in self._faults:
                try:
                    self._probe()
                except OSError as exc:
                    return f"{self._faults.get(where)} (probe: {exc})"
                self._fault(where, None)
        return None

    def _probe(self) -> None:
        if self._journal is None:
            return
        path = self._journal.directory / "probe.tmp"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, bytes(64 * 1024))
            os.fsync(fd)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)

    def watermark(self) -> int:
        """The highest `seq` in DuckDB's raw log: journaled batches are copied whole and in
        order, and this process is the only writer, so nothing below it can still arrive."""
        row = self._reader().execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchone()
        return int(row[0]) if row else 0

    def journal_backlog(self) -> tuple[int, int, float]:
        """Rows and batches journaled but not yet in DuckDB, and the oldest one's wait in seconds."""
        with self._lock:
            if not self._pending:
                return 0, 0, 0.0
            return self._pending_rows, len(self._pending), time.monotonic() - self._pending_since

    def backlog(self) -> tuple[int, float]:
        """Rows journaled but not yet in DuckDB, and for how many seconds the oldest has waited."""
        with self._lock:
            if not self._pending:
                return 0, 0.0
            return self._pending_rows, time.monotonic() - self._pending_since

    # -- dashboard sessions: rows of their own, committed at once (not raw-log rows) -----------
    def save_session(self, session: StoredSession) -> None:
        """Store a new session, and drop the expired ones while at it."""
        cur = self._reader()
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.execute("DELETE FROM dashboard_sessions WHERE expires_at <= ?", [session.created_at])
            cur.execute(
                "INSERT INTO dashboard_sessions VALUES (?, ?, ?, ?, ?)",
                [
                    session.session_hash,
                    session.account_id,
                    session.csrf_token,
                    session.created_at,
                    session.expires_at,
                ],
            )
            cur.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            if isinstance(exc, Exception) and _resource_fault(exc):
                raise DatabaseUnavailable(
                    "tally cannot write to its database right now; log in again later"
                ) from exc
            raise

    def load_session(self, session_hash: str, now: datetime) -> StoredSession | None:
        """The live session with this hash; None when unknown, ended or expired."""
        row = (
            self._reader()
            .execute(
                "SELECT session_hash, account_id, csrf_token, created_at, expires_at"
                " FROM dashboard_sessions WHERE session_hash = ? AND expires_at > ?",
                [session_hash, now],
            )
            .fetchone()
        )
        if row is None:
            return None
        created, expires = _stored_time(row[3]), _stored_time(row[4])
        assert created is not None and expires is not None
        return StoredSession(str(row[0]), str(row[1]), str(row[2]), created, expires)

    def end_session(self, session_hash: str) -> None:
        cur = self._reader()
        cur.execute("DELETE FROM dashboard_sessions WHERE session_hash = ?", [session_hash])
        cur.execute("DELETE FROM shown_once WHERE session_hash = ?", [session_hash])

    def keep_once(
        self, session_hash: str, name: str, sealed: str, now: datetime, expires_at: datetime
    ) -> None:
        cur = self._reader()
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.execute("DELETE FROM shown_once WHERE expires_at <= ?", [now])
            cur.execute(
                "INSERT OR REPLACE INTO shown_once VALUES (?, ?, ?, ?)",
                [session_hash, name, sealed, expires_at],
            )
            cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            raise

    def take_once(self, session_hash: str, name: str, now: datetime) -> str | None:
        rows = (
            self._reader()
            .execute(
                "DELETE FROM shown_once WHERE session_hash = ? AND name = ? RETURNING sealed, expires_at",
                [session_hash, name],
            )
            .fetchall()
        )
        return str(rows[0][0]) if rows and (_stored_time(rows[0][1]) or now) > now else None

    # -- leases: named locks that expire (the reconcile run) -----------------------------------
    def acquire_lease(self, name: str, holder: str, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the lease `name` for `holder` until `now + ttl`; False while another
        holder's lease has not expired and that holder may be alive. A holder named by its
        process (`lockfile.identity()`, as the reconciler names itself) that no longer runs left
        its lease by dying (killed mid-run, the server restarted): that lease is free at once."""
        cur = self._reader()
        cur.execute("BEGIN TRANSACTION")
        try:
            row = cur.execute(
                "SELECT holder, expires_at, acquired_at FROM leases WHERE name = ?", [name]
            ).fetchone()
            held = row is not None and row[0] != holder and (_stored_time(row[1]) or now) > now
            if held and row is not None and not lockfile.dead(str(row[0])):
                cur.execute("ROLLBACK")
                return False
            acquired = row[2] if row is not None and row[0] == holder else now
            cur.execute(
                "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)", [name, holder, acquired, now + ttl]
            )
            cur.execute("COMMIT")
            return True
        except duckdb.TransactionException:  # another writer took it at the same moment
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            return False
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            raise

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up, if `holder` still holds it."""
        self._reader().execute("DELETE FROM leases WHERE name = ? AND holder = ?", [name, holder])

    # -- connections -------------------------------------------------------------------------
    def _reader(self) -> duckdb.DuckDBPyConnection:
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cur = cur
        return cur

    def _writer_cursor(self) -> duckdb.DuckDBPyConnection:
        if self._wcur is None:
            self._wcur = self._con.cursor()
        return self._wcur

    def _copier_cursor(self) -> duckdb.DuckDBPyConnection:
        if self._ccur is None:
            self._ccur = self._con.cursor()
        return self._ccur

    @contextmanager
    def reader(self) -> Iterator[DuckReader]:
        """A `Reader` on a fresh cursor; closed afterwards."""
        with self._cursor() as cur:
            yield DuckReader(cur)

    @contextmanager
    def _cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A fresh cursor for a long read (reconcile, reports, backups); closed afterwards."""
        cur = self._con.cursor()
        try:
            yield cur
        finally:
            cur.close()

    @contextmanager
    def engine(self) -> Iterator[DuckEngine]:
        """The embedded database is the reconciler's engine itself: the job reads the log and
        writes its tables on a fresh cursor, and publishes nothing elsewhere."""
        with self._cursor() as cur:
            yield DuckEngine(cur)

    def check_backup(self, path: str) -> None:
        from ingest.backup import check_target

        check_target(path, self.path)

    def backup(self, path: str, sync: Callable[[], None], progress: BackupProgress) -> BackupSummary:
        """A consistent copy at `path` (ingest/backup.py), made while the server runs."""
        from ingest.backup import check_target, copy_database, set_aside_count

        target = check_target(path, self.path)
        with self._cursor() as cur:
            return copy_database(cur, target, sync, progress, set_aside_count(self.path))

    def begin(self) -> DuckTx:
        if self._keys_stale:
            try:
                self.sync_keys()
            except Exception as exc:
                self._fault("keys", exc)
                raise DatabaseUnavailable(
                    "tally cannot bring its key index up to date right now; nothing of this request was"
                    " stored"
                ) from exc
            self._fault("keys", None)
        return DuckTx(self)

    def close(self) -> None:
        try:
            self.flush()
        except DatabaseUnavailable as exc:  # the journal keeps it; start-up copies it in
            log.error("closing with journaled rows not yet in the database (%s)", exc)
        if self._journal is not None:
            self._journal.close()
        self.keys.close()
        self._con.close()
        self._unclaim()

    # -- start-up: the control plane and where the logs stand ---------------------------------
    def _load(self) -> None:
        con = self._con
        row = con.execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchone()
        self._seq = int(row[0]) if row else 0
        row = con.execute("SELECT coalesce(max(log_id), 0) FROM tracking_log").fetchone()
        self._log_id = int(row[0]) if row else 0
        undo: Undo = []
        idx = self.index
        for r in con.execute(
            "SELECT token_hash, kind, subject_id, masked, scopes, workspace_ids, name, created_at,"
            " flagged_at, rotation_deadline FROM credentials WHERE revoked_at IS NULL"
        ).fetchall():
            idx.put_credential(
                Credential(
                    token_hash=r[0],
                    kind=r[1],
                    subject_id=r[2],
                    masked=r[3],
                    scopes=_json_set(r[4]),
                    workspace_ids=_json_set(r[5]),
                    name=r[6],
                    created_at=r[7],
                    flagged_at=_stored_time(r[8]),
                    rotation_deadline=_stored_time(r[9]),
                ),
                undo,
            )
        for r in con.execute("SELECT * FROM programs").fetchall():
            idx.put_program(
                Program(r[0], r[1], r[2], ProgramSettings.from_stored(r[3], r[0]), r[4], r[5]),
                undo,
            )
        for r in con.execute(
            "SELECT program_id, code, partner_id, name, email, created_at FROM partners"
        ).fetchall():
            idx.put_partner(Partner(r[2], r[0], r[1], r[3], r[4], r[5]), undo)
        for r in con.execute("SELECT workspace_id, account_id, role FROM memberships").fetchall():
            idx.put_role(r[0], r[1], r[2], undo)
        for r in con.execute("SELECT program_id, step, done_at FROM checklist").fetchall():
            idx.put_checklist(r[0], r[1], r[2], undo)

    # -- the key index: caught up with the raw log at start ------------------------------------
    def sync_keys(self, on_progress: Progress | None = None) -> int:
        """Bring the key index level with the raw log: replay the rows after its position, or
        rebuild it from the whole log when it is of another format, ahead of the log or from
        another history. Returns the rows applied."""
        keys = self.keys
        keys.discard()  # what is not in the index file yet is replayed from the log below
        seq, anchor, fmt = keys.position()
        if fmt != KEYS_FORMAT or seq > self._seq or (seq and anchor != self._anchor_at(seq)):
            if fmt is not None:
                log.warning(
                    "the key index %s does not match the raw log (at %d of %d); rebuilding it",
                    keys.path,
                    seq,
                    self._seq,
                )
            if self._seq:
                log.warning("building the key index from the raw log: %d raw rows", self._seq)
            applied = keys.rebuild(self._raw_after(0), self._seq, on_progress)
            self._keys_stale = False
            return applied
        if seq >= self._seq:
            return 0
        total = self._seq - seq
        if total > 100_000:
            log.warning("bringing the key index up to date: %d raw rows to apply", total)
        applied = keys.apply(self._raw_after(seq), total, on_progress)
        self._keys_stale = False
        return applied

    def _anchor_at(self, seq: int) -> str | None:
        row = self._reader().execute("SELECT received_at FROM raw_events WHERE seq = ?", [seq]).fetchone()
        return anchor_of(row[0]) if row else None

    def _raw_after(self, seq: int, window: int = 100_000) -> Iterator[dict[str, Any]]:
        """The raw rows after `seq`, in order: those in DuckDB a window of sequence numbers at a
        time, then those still only in the journal (the copier waits meanwhile, so no batch
        moves from one to the other under the reader)."""
        with self._copy_lock:
            cur = self._con.cursor()
            try:
                row = cur.execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchone()
                copied = int(row[0]) if row else 0
                sql = f"SELECT {', '.join(OBSERVED)} FROM raw_events WHERE seq > ? AND seq <= ? ORDER BY seq"
                at = seq
                while at < copied:
                    for values in cur.execute(sql, [at, min(at + window, copied)]).fetchall():
                        yield dict(zip(OBSERVED, values, strict=True))
                    at += window
                seq = max(seq, copied)
            finally:
                cur.close()
            with self._lock:
                pending = list(self._pending)
            for batch in pending:
                for values in batch.raw:
                    full = dict(zip(RAW_EVENT_FIELDS, values, strict=True))
                    if full["seq"] > seq:
                        yield {name: full.get(name) for name in OBSERVED}

    def _commit_keys(self, keys: KeyIndex, last: tuple[int, object] | None) -> None:
        """Commit the key index's part of a batch that is already durable. Should that fail,
        the batch stands (it is in the log); the index is caught up from the log before the
        next write."""
        try:
            keys.commit(last[0] if last else None, anchor_of(last[1]) if last else "")
        except Exception as exc:
            log.error("the key index could not commit (%s); catching up from the raw log", exc)
            self._keys_stale = True

    # -- reads ---------------------------------------------------------------------------------
    def credential(self, token_hash: str) -> Credential | None:
        return self.index.credentials.get(token_hash)

    def credential_and_program(self, token_hash: str) -> KeyRead | None:
        cred = self.index.credentials.get(token_hash)
        if cred is None:
            return None
        return cred, self.index.programs.get(cred.subject_id) if cred.kind == "program" else None

    def program_credential(self, program_id: str) -> Credential | None:
        for cred in self.index.credentials.values():
            if cred.kind == "program" and cred.subject_id == program_id:
                return cred
        return None

    def program(self, program_id: str) -> Program | None:
        return self.index.programs.get(program_id)

    def programs_in(self, workspace_ids: Sequence[str]) -> list[Program]:
        wanted = set(workspace_ids)
        return sorted(
            (p for p in self.index.programs.values() if p.workspace_id in wanted),
            key=lambda p: (p.created_at, p.program_id),
        )

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        return sorted(
            (p for p in self.index.programs.values() if p.settings.stripe_account_id == account),
            key=lambda p: (p.created_at, p.program_id),
        )

    def role(self, workspace_id: str, account_id: str) -> Role | None:
        return self.index.roles.get((workspace_id, account_id))

    def workspaces_of(self, account_id: str) -> dict[str, Role]:
        return {ws: role for (ws, acct), role in self.index.roles.items() if acct == account_id}

    def workspace_exists(self, workspace_id: str) -> bool:
        return any(ws == workspace_id for ws, _ in self.index.roles)

    def partner(self, program_id: str, code: str) -> Partner | None:
        return self.index.partners.get((program_id, code))

    def partners(self, program_id: str) -> list[Partner]:
        return sorted(
            (p for (pid, _), p in self.index.partners.items() if pid == program_id),
            key=lambda p: p.code,
        )

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        return self.keys.click_partner(program_id, click_id)

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        return self.keys.binding(program_id, customer_key)

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        return self.keys.provisional_click(program_id, customer_key)

    def sale(self, program_id: str, keys: Sequence[str]) -> SaleLedger | None:
        return self.keys.sale(program_id, keys)

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        return self.keys.refund_seen(program_id, refund_id)

    def event_seen(self, event_id: str) -> bool:
        return self.keys.event_seen(event_id)

    def checklist(self, program_id: str) -> dict[str, datetime]:
        return {step: at for (pid, step), at in self.index.checklist.items() if pid == program_id}

    def tracking_log(self, program_id: str, limit: int, before: int | None = None) -> list[LogLine]:
        # Two steps, so that choosing the page reads two narrow columns, never the details of
        # the program's whole log: the page's ids, then its lines (zone maps skip the rest).
        sql = "SELECT log_id FROM tracking_log WHERE program_id = ?"
        params: list[Any] = [program_id]
        if before is not None:
            sql += " AND log_id < ?"
            params.append(before)
        sql += " ORDER BY log_id DESC LIMIT ?"
        params.append(max(1, min(limit, LOG_PAGE_MAX)))
        cur = self._reader()
        ids = [int(r[0]) for r in cur.execute(sql, params).fetchall()]
        if not ids:
            return []
        page = f"SELECT {LOG_PAGE_COLUMNS} FROM tracking_log"
        page += " WHERE program_id = ? AND log_id BETWEEN ? AND ? ORDER BY log_id DESC"
        return [LogLine(*r) for r in cur.execute(page, [program_id, ids[-1], ids[0]]).fetchall()]


def index_keys(path: str | Path, on_progress: Progress | None = None) -> int:
    """Open the database at `path` (no server may hold it), bring its key index up to date and
    close it; returns the raw rows applied (0 when it was current)."""
    applied = 0

    def counting(done: int, total: int) -> None:
        nonlocal applied
        applied = done
        if on_progress:
            on_progress(done, total)

    DuckStore(path, on_progress=counting).close()
    return applied
