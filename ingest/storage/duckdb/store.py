"""The embedded backend: one DuckDB file, owned by one process (`Store` of
ingest/storage/contract.py).

Opening it takes these steps, in order (`DuckStore.__init__`): claim the file (`<database>.lock`:
one store per database), connect, migrate, recover (copy what the journal holds beyond the
database), load the control plane's in-memory copy, and bring the key index level with the log.
Its parts, a module each:

- tx.py: the writer's group commits (`DuckTx`);
- copier.py: the write-ahead journal's batches on their way into DuckDB (journal.py: the
  segment files), and the batches the database refuses set aside;
- keys.py: the key index the hot path decides from (SQLite beside the file);
- control.py: the control plane's in-memory copy, exact because this process is the only writer;
- reader.py: reports' and the dashboard's reads; sessions.py: dashboard sessions, values shown
  once and leases; backup.py: a consistent copy while the server runs; faults.py: data faults
  against resource faults.

A full disk or an I/O error while committing is `DatabaseUnavailable` (503, nothing
acknowledged) and makes `readiness()` report the fault until a write or a probe succeeds again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from ingest.domain.errors import DatabaseUnavailable
from ingest.domain.records import (
    LOG_PAGE_COLUMNS,
    LOG_PAGE_MAX,
    Credential,
    LogLine,
    Partner,
    PartnerSession,
    PayoutDetails,
    PortalLink,
    Program,
    Role,
    StoredSession,
)
from ingest.progress import Progress, RowsApplied
from ingest.storage import lockfile, migrations, private
from ingest.storage.contract import BackupSummary, KeyRead, LogDatabase
from ingest.storage.duckdb import faults, portal, sessions
from ingest.storage.duckdb.backup import check_target, copy_database, set_aside_count
from ingest.storage.duckdb.control import ControlCache
from ingest.storage.duckdb.copier import Batch, Copier
from ingest.storage.duckdb.journal import Journal
from ingest.storage.duckdb.keys import FORMAT as KEYS_FORMAT
from ingest.storage.duckdb.keys import OBSERVED, KeyIndex, KeyLookups, anchor_of
from ingest.storage.duckdb.reader import DuckReader
from ingest.storage.duckdb.tx import DuckTx
from ingest.storage.partitions import Scope
from ingest.storage.schema import RAW_EVENT_FIELDS
from ingest.storage.sql import DuckExecutor

log = logging.getLogger("tally.store")


class DatabaseInUse(Exception):
    """Another store (in this process or another) has the database open: the embedded backend
    has exactly one writer, its journal and its key index beside the file."""


def own_files(path: str | Path) -> list[str]:
    """The files and folders the embedded database at `path` keeps beside it (docs/operations.md)."""
    suffixes = ["", ".wal", ".lock", ".journal", ".mirror", ".webhooks"]
    suffixes += [".keys", ".keys-wal", ".keys-shm", ".keys-journal"]  # the key index (SQLite)
    suffixes += [".rows", ".rows-wal", ".rows-shm"]  # the reconciler's row store (SQLite)
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


class DuckStore(KeyLookups):
    """The embedded DuckDB backend of `Store` (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        key_cache_mb: int = 64,
        on_progress: RowsApplied | None = None,
        memory_mb: int = 512,
    ) -> None:
        """Open (and migrate) the database at `path`; `key_cache_mb` bounds the key index's page
        cache and `memory_mb` DuckDB's memory (its buffer pool keeps the blocks ingest writes
        until it reaches its limit: without one, the server would grow with the log; beyond it,
        reconcile's large operators spill to disk); `on_progress(rows, total)` hears about a
        key-index rebuild or catch-up."""
        if str(path).startswith(("postgresql:", "postgres:")):
            raise ValueError(
                "a PostgreSQL URL is not a DuckDB file (ingest.storage.factory.open_store picks the backend)"
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
        self.index = ControlCache()
        self._seq = 0
        self._log_id = 0
        self._journal: Journal | None = None
        self._faults: dict[str, str] = {}  # "write" | "copy" -> what failed, while it lasts
        # Raw rows appended by this process, by (kind, outcome): read by GET /metrics.
        self.ingested: dict[tuple[str, str], int] = {}
        self.keys: KeyIndex
        self._keys_stale = False  # a key-index commit failed: catch up before the next write
        try:
            if str(path) != ":memory:":
                self.keys = KeyIndex(Path(f"{path}.keys"), key_cache_mb)
                self._journal = Journal(Path(f"{path}.journal"))
                private.make_private(*own_files(path))  # an older release's, made 0644
            else:
                self.keys = KeyIndex(None, key_cache_mb)
            self.copier = Copier(self._con, self._journal, self._fault, self.keys.checkpoint)
            if self._journal is not None:
                self.copier.recover()
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

    # -- the journal's batches, copied into DuckDB (copier.py) ----------------------------------
    @property
    def set_aside(self) -> int:
        """Journal batches the database refused since start, kept in set-aside/."""
        return self.copier.set_aside

    def flush(self) -> None:
        """Copy every journaled batch into DuckDB (copier.py `Copier.flush`)."""
        self.copier.flush()

    def _journal_batch(self, batch: Batch) -> None:
        self.copier.journal_batch(batch)

    def journal_backlog(self) -> tuple[int, int, float]:
        return self.copier.journal_backlog()

    def backlog(self) -> tuple[int, float]:
        return self.copier.backlog()

    # -- faults and readiness ------------------------------------------------------------------
    @staticmethod
    def resource_fault(exc: BaseException) -> bool:
        """Whether `exc` (or what it wraps) is the database failing rather than its data."""
        return faults.resource_fault(exc)

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

    # -- dashboard sessions, values shown once, leases (sessions.py) ----------------------------
    def save_session(self, session: StoredSession) -> None:
        sessions.save_session(self._reader(), session)

    def load_session(self, session_hash: str, now: datetime) -> StoredSession | None:
        return sessions.load_session(self._reader(), session_hash, now)

    def end_session(self, session_hash: str) -> None:
        sessions.end_session(self._reader(), session_hash)

    def keep_once(
        self, session_hash: str, name: str, sealed: str, now: datetime, expires_at: datetime
    ) -> None:
        sessions.keep_once(self._reader(), session_hash, name, sealed, now, expires_at)

    def take_once(self, session_hash: str, name: str, now: datetime) -> str | None:
        return sessions.take_once(self._reader(), session_hash, name, now)

    # -- the partners' portal (portal.py) ---------------------------------------------------------
    def add_portal_link(self, link: PortalLink) -> None:
        portal.add_portal_link(self._reader(), link)

    def use_portal_link(self, token_hash: str, now: datetime) -> PortalLink | None:
        return portal.use_portal_link(self._reader(), token_hash, now)

    def save_partner_session(self, session: PartnerSession) -> None:
        portal.save_partner_session(self._reader(), session)

    def load_partner_session(self, session_hash: str, now: datetime) -> PartnerSession | None:
        return portal.load_partner_session(self._reader(), session_hash, now)

    def end_partner_session(self, session_hash: str) -> None:
        portal.end_partner_session(self._reader(), session_hash)

    def payout_details(self, program_id: str) -> dict[str, PayoutDetails]:
        return portal.payout_details(self._reader(), program_id)

    def set_payout_details(self, details: PayoutDetails) -> None:
        portal.set_payout_details(self._reader(), details)

    def acquire_lease(self, name: str, holder: str, now: datetime, ttl: timedelta) -> bool:
        return sessions.acquire_lease(self._reader(), name, holder, now, ttl)

    def release_lease(self, name: str, holder: str) -> None:
        sessions.release_lease(self._reader(), name, holder)

    def attempt_journal(self) -> Path | None:
        return None if self.path == ":memory:" else Path(f"{self.path}.webhooks")

    @contextmanager
    def outbox(self) -> Iterator[DuckExecutor]:
        """The webhook outbox's statements, on this thread's cursor (ingest/webhooks_out/outbox.py)."""
        yield DuckExecutor(self._reader())

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

    partitions = 1  # one process reconciles the embedded file: the whole log at once

    def reconcile_partitions(self) -> int:
        return 1

    @contextmanager
    def log_database(self, scope: Scope | None = None) -> Iterator[LogDatabase]:
        """The embedded database is the reconciler's own: it reads the log and writes its tables
        on a fresh cursor, and publishes nothing elsewhere (never in partitions)."""
        if scope is not None:
            raise ValueError("the embedded database is reconciled whole")
        with self._cursor() as cur:
            yield LogDatabase(cur, None)

    def check_backup(self, path: str) -> None:
        check_target(path, self.path)

    def backup(self, path: str, sync: Callable[[], None], progress: Progress) -> BackupSummary:
        """A consistent copy at `path` (ingest/storage/duckdb/backup.py), made while the server runs."""
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
        self.index.load(con)

    # -- the key index: caught up with the raw log at start ------------------------------------
    def sync_keys(self, on_progress: RowsApplied | None = None) -> int:
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
        copier = self.copier
        with copier.copy_lock:
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
            with copier.lock:
                pending = list(copier.pending)
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

    # Reads that go through a whole table of the control cache iterate a copy of it (`dict.copy`
    # runs in C, so the writer thread cannot change the table while it is taken): iterating the
    # table itself while the writer adds to it raises "dictionary changed size during iteration".
    def program_credential(self, program_id: str) -> Credential | None:
        for cred in self.index.credentials.copy().values():
            if cred.kind == "program" and cred.subject_id == program_id:
                return cred
        return None

    def program(self, program_id: str) -> Program | None:
        return self.index.programs.get(program_id)

    def programs_in(self, workspace_ids: Sequence[str]) -> list[Program]:
        wanted = set(workspace_ids)
        return sorted(
            (p for p in self.index.programs.copy().values() if p.workspace_id in wanted),
            key=lambda p: (p.created_at, p.program_id),
        )

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        return list(self.index.by_account.get(account, ()))

    def role(self, workspace_id: str, account_id: str) -> Role | None:
        return self.index.roles.get((workspace_id, account_id))

    def workspaces_of(self, account_id: str) -> dict[str, Role]:
        return {ws: role for (ws, acct), role in self.index.roles.copy().items() if acct == account_id}

    def workspace_exists(self, workspace_id: str) -> bool:
        return any(ws == workspace_id for ws, _ in self.index.roles.copy())

    def partner(self, program_id: str, code: str) -> Partner | None:
        return self.index.partners.get((program_id, code))

    def partners(self, program_id: str) -> list[Partner]:
        return sorted(
            (p for (pid, _), p in self.index.partners.copy().items() if pid == program_id),
            key=lambda p: p.code,
        )

    def checklist(self, program_id: str) -> dict[str, datetime]:
        return {step: at for (pid, step), at in self.index.checklist.copy().items() if pid == program_id}

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


def index_keys(path: str | Path, on_progress: RowsApplied | None = None) -> int:
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
