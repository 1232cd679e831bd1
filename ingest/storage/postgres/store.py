"""The PostgreSQL backend: several `tally serve` replicas sharing one database.

Everything that decides lives in the database; a replica keeps no copy of the log or of the
control plane, so what one replica commits (a sale, a regenerated key, a revoked credential, a
dashboard session) binds every replica from that moment:

- Lookups (credentials, programs, partners, roles, clicks, bindings, sale ledgers, seen refunds
  and events) are point queries on primary keys and indexes, on each thread's own connection;
  reads of the materialised tables take one from a pool (psycopg-pool). One cache: the track
  endpoints' program keys (`credential_and_program`, at most `credential_cache` of them), so a
  track call does not wait on the database before its group commit. Every group commit reads
  the keys its operations were let in with again (`PgTx.prefetch`); an operation whose key was
  revoked, flagged or changed meanwhile (on any replica) is decided again with the key as it is
  now (`PgTx.outdated`, `KeyChanged`). So a regenerated or revoked key is refused by every
  replica as soon as the regenerate call has returned, cache or not.
- Writes: the writer thread (ingest/writer.py) runs each group commit as one transaction on its
  own connection (`PgTx`, ingest/storage/postgres/tx.py): claims and the reads a decision rests on go
  out at once (ingest/storage/postgres/keys.py: the database's unique keys and row locks decide
  duplicates and refund ceilings across replicas), other writes ride with the next read, and
  the raw-log, tracking-log and claim rows are written at commit with COPY.
- Sequence numbers are handed out at commit, in commit order: the group takes its block of
  `seq` by updating the one `log_head` row just before COMMIT, and that row's lock is held until
  the commit is visible. So a row with a lower `seq` can never become visible after one with a
  higher `seq` was read, and `watermark()` (the head as committed) is exact: the reconciler's
  promise that nothing below it can still appear.
- Faults: a connection that fails, or a database that cannot be reached, is
  `DatabaseUnavailable` (503, nothing acknowledged). While it lasts, lookups and writes fail at
  once instead of waiting (the event loop is never held up by an unreachable database) and a
  probe thread retries every tenth of a second (conn.py `PROBE_SECONDS`); the replica recovers
  by itself when the database returns (`readiness()` says why it is not ready meanwhile).

The reconciler works in a DuckDB working copy of the log on this machine (`WorkingCopy`,
ingest/storage/postgres/copy.py) fed through `PgLogSource` (source.py) and publishes its tables
through `PgResultSink` (sink.py); reports read the published tables through `PgReader`
(reader.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ingest.domain.errors import DatabaseUnavailable
from ingest.domain.records import (
    LOG_PAGE_COLUMNS,
    LOG_PAGE_MAX,
    Binding,
    Credential,
    LogLine,
    Partner,
    Program,
    Role,
    SaleLedger,
    StoredSession,
)
from ingest.progress import Progress
from ingest.storage import migrations
from ingest.storage.contract import BackupSummary, BackupTargetUnusable, KeyRead, LogDatabase
from ingest.storage.partitions import Scope, scopes
from ingest.storage.postgres import keys
from ingest.storage.postgres.conn import (
    CONNECT_TIMEOUT_SECONDS,
    Health,
    conninfo,
    describe,
    first_line,
    resource_fault,
    stale,
)
from ingest.storage.postgres.control import (
    BY_ACCOUNT,
    CREDENTIAL,
    CREDENTIAL_AND_PROGRAM,
    PROGRAM,
    credential_row,
    program_row,
)
from ingest.storage.postgres.copy import WorkingCopy
from ingest.storage.postgres.portal import PortalRows
from ingest.storage.postgres.reader import PgReader, reader_types
from ingest.storage.postgres.sink import PgResultSink
from ingest.storage.postgres.source import PgLogSource
from ingest.storage.postgres.tx import Connection, PgTx
from ingest.storage.sql import Executor, PgExecutor

POOL_MAX = 10  # pooled connections per replica (reads, reports)
POOL_WAIT_SECONDS = 5.0  # longest wait for a pooled connection while the database is up

__all__ = ["PgStore"]


class PgStore(PortalRows):
    """The PostgreSQL backend of `ingest.storage.contract.Store` (see the module docstring)."""

    set_aside = 0  # no journal: nothing is ever set aside

    def __init__(
        self,
        url: str,
        memory_mb: int = 512,
        engine_dir: str | None = None,
        credential_cache: int = 4096,
        partitions: int = 1,
    ) -> None:
        """Connect to the database at `url`, migrate it (one replica at a time) and open the
        pool. `memory_mb` bounds the reconciler's working copy; `engine_dir` is where it lives
        (None: a temporary directory of this process; with `partitions` above 1, one working copy
        a partition, each in a folder of its own in it); `credential_cache` is how many program
        keys the track endpoints keep in memory (0: none)."""
        self.partitions = max(1, partitions)
        self.url = url
        self.name = describe(url)
        self._info = conninfo(url)
        self._request_info = conninfo(url, statement_timeout=True)
        self.adbc_info = self._info  # bulk reads and writes (source.py, sink.py)
        self.memory_mb = memory_mb
        self.engine_dir = engine_dir
        self.ingested: dict[tuple[str, str], int] = {}
        self._local = threading.local()  # each thread's lookup connection
        self._lookups: list[Connection] = []
        self._lookups_lock = threading.Lock()
        self._generation = 0  # bumped when the database comes back: older connections are dropped
        self._writer: Connection | None = None
        self._stale_writer = False  # set when the database came back: the writer reconnects
        self._leases: dict[tuple[str, str], Connection] = {}  # (name, holder) -> the lock's session
        self._leases_lock = threading.Lock()
        self._engines: dict[Scope | None, WorkingCopy] = {}
        # a copy of the whole log too (tools, tests), whatever the partitions
        self._engine_locks: dict[Scope | None, threading.Lock] = {
            s: threading.Lock() for s in {None, *scopes(partitions)}
        }
        self._keys: dict[str, KeyRead] = {}  # token hash -> key, program
        self._keys_size = credential_cache
        self._keys_lock = threading.Lock()
        try:
            with psycopg.connect(self._info, autocommit=True) as con:
                migrations.apply(PgExecutor(con))
                self.schema_version = migrations.check(PgExecutor(con))
                # The last replica started says how the programs are reconciled; the others'
                # runs stop until they are restarted alike (`reconcile_partitions`).
                con.execute(
                    b"INSERT INTO tally_meta VALUES ('reconcile_partitions', %s)"
                    b" ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                    (str(self.partitions),),
                )
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"cannot connect to {self.name}: {first_line(exc)}") from None
        self._health = Health(self._info, self._recovered)
        self._pool = ConnectionPool(
            self._request_info,
            min_size=1,
            max_size=POOL_MAX,
            kwargs={"autocommit": True},
            configure=reader_types,
            open=False,
            name="tally",
        )
        self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS * 2)

    # -- connections and faults ------------------------------------------------------------------
    def _recovered(self) -> None:
        """The database answers again: drop the pooled connections it broke, and have the
        writer and every thread's lookup connection open new ones when next used."""
        self._stale_writer = True
        self._generation += 1
        with contextlib.suppress(Exception):
            self._pool.check()

    def _failed(self, con: Connection | None, exc: BaseException) -> None:
        """After an error on `con`: a broken connection is dropped; a resource fault marks the
        database down until the probe reaches it."""
        if resource_fault(exc):
            self._health.down(exc)
        if con is not None and con is self._writer and (con.closed or con.broken or resource_fault(exc)):
            with contextlib.suppress(Exception):
                con.close()
            self._writer = None

    def _lookup_connection(self) -> Connection:
        """This thread's own connection for point lookups (autocommit): the hot path's lookups
        skip the pool's hand-over (about a third of a lookup's cost), and a thread that owns it
        never waits for one. A connection from before the database went away is replaced."""
        con: Connection | None = getattr(self._local, "con", None)
        if con is not None and (stale(con) or self._local.generation != self._generation):
            with contextlib.suppress(Exception):
                con.close()
            con = None
        if con is None:
            con = psycopg.connect(self._request_info, autocommit=True)
            reader_types(con)
            self._local.con, self._local.generation = con, self._generation
            with self._lookups_lock:
                self._lookups = [c for c in self._lookups if not c.closed] + [con]
        return con

    @contextmanager
    def _conn(self, pooled: bool = False) -> Iterator[Connection]:
        """A connection (autocommit): this thread's own for lookups, or with `pooled` one from
        the pool (reads that hold it for a while); `DatabaseUnavailable` at once while the
        database is down."""
        self._health.check()
        try:
            if pooled:
                con = self._pooled()
                try:
                    yield con
                finally:
                    self._pool.putconn(con)
            else:
                yield self._lookup_connection()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            self._failed(None, exc)
            raise DatabaseUnavailable(
                f"tally cannot reach its database right now: {first_line(exc)}"
            ) from exc
        except psycopg.Error as exc:
            if resource_fault(exc):
                self._failed(None, exc)
                raise DatabaseUnavailable(
                    f"tally cannot reach its database right now: {first_line(exc)}"
                ) from exc
            raise

    def _pooled(self) -> Connection:
        """A healthy connection from the pool: one the server closed while it sat in the pool
        (the database restarted) is closed here, so the pool drops it, and the next is taken at
        once (the pool's own `check` would wait a growing back-off between such attempts)."""
        deadline = time.monotonic() + POOL_WAIT_SECONDS
        for _ in range(POOL_MAX):
            con = self._pool.getconn(timeout=max(0.0, deadline - time.monotonic()))
            if not stale(con):
                return con
            con.close()
            self._pool.putconn(con)
        return self._pool.getconn(timeout=max(0.0, deadline - time.monotonic()))  # opened after those

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._conn() as con:
            return con.execute(sql.encode(), params).fetchall()

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self._rows(sql, params)
        return rows[0] if rows else None

    @staticmethod
    def resource_fault(exc: BaseException) -> bool:
        return resource_fault(exc)

    def readiness(self) -> str | None:
        return self._health.reason

    # -- the write side ----------------------------------------------------------------------------
    def begin(self) -> PgTx:
        self._health.check()
        if self._stale_writer and self._writer is not None:
            self._stale_writer = False
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        if self._writer is not None and stale(self._writer):  # e.g. the database restarted
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        if self._writer is None:
            try:
                # autocommit: each group commit delimits its own transaction in its pipeline
                self._writer = psycopg.connect(self._request_info, autocommit=True)
            except psycopg.Error as exc:
                self._failed(None, exc)
                raise DatabaseUnavailable(
                    f"tally cannot reach its database right now: {first_line(exc)}"
                ) from exc
        return PgTx(self, self._writer)

    def flush(self) -> None:
        """Commits go straight to the database: reads see them at once."""

    def backlog(self) -> tuple[int, float]:
        return 0, 0.0

    def journal_backlog(self) -> tuple[int, int, float]:
        return 0, 0, 0.0

    def watermark(self) -> int:
        row = self._one("SELECT seq FROM log_head WHERE id = 1")
        return int(row[0]) if row else 0

    # -- sessions and leases ---------------------------------------------------------------------
    def save_session(self, session: StoredSession) -> None:
        with self._conn() as con, con.transaction():
            con.execute(b"DELETE FROM dashboard_sessions WHERE expires_at <= %s", (session.created_at,))
            con.execute(
                b"INSERT INTO dashboard_sessions VALUES (%s, %s, %s, %s, %s)",
                (
                    session.session_hash,
                    session.account_id,
                    session.csrf_token,
                    session.created_at,
                    session.expires_at,
                ),
            )

    def load_session(self, session_hash: str, now: datetime) -> StoredSession | None:
        row = self._one(
            "SELECT session_hash, account_id, csrf_token, created_at, expires_at"
            " FROM dashboard_sessions WHERE session_hash = %s AND expires_at > %s",
            (session_hash, now),
        )
        return StoredSession(*row) if row else None

    def end_session(self, session_hash: str) -> None:
        with self._conn() as con, con.transaction():
            con.execute(b"DELETE FROM dashboard_sessions WHERE session_hash = %s", (session_hash,))
            con.execute(b"DELETE FROM shown_once WHERE session_hash = %s", (session_hash,))

    def keep_once(
        self, session_hash: str, name: str, sealed: str, now: datetime, expires_at: datetime
    ) -> None:
        with self._conn() as con, con.transaction():
            con.execute(b"DELETE FROM shown_once WHERE expires_at <= %s", (now,))
            con.execute(
                b"INSERT INTO shown_once VALUES (%s, %s, %s, %s) ON CONFLICT (session_hash, name)"
                b" DO UPDATE SET sealed = EXCLUDED.sealed, expires_at = EXCLUDED.expires_at",
                (session_hash, name, sealed, expires_at),
            )

    def take_once(self, session_hash: str, name: str, now: datetime) -> str | None:
        row = self._one(
            "DELETE FROM shown_once WHERE session_hash = %s AND name = %s RETURNING sealed, expires_at",
            (session_hash, name),
        )
        return str(row[0]) if row and row[1] > now else None

    def acquire_lease(self, name: str, holder: str, now: datetime, ttl: timedelta) -> bool:
        """A PostgreSQL advisory lock, held by a connection of the holder's own: taken when no
        session holds it, kept (renewed) while the holder's connection lives. A replica that
        dies drops its connection, and with it the lock, at once (no waiting for `ttl`; a
        machine that dies, through the server's TCP keepalive, in about 25 s); the `leases` row
        says who holds it, for operators."""
        with self._leases_lock:
            held = self._leases.get((name, holder))
            if held is not None and not held.closed:
                return True
            self._health.check()
            try:
                con = psycopg.connect(self._info, autocommit=True)
            except psycopg.Error as exc:
                self._failed(None, exc)
                raise DatabaseUnavailable(
                    f"tally cannot reach its database right now: {first_line(exc)}"
                ) from exc
            # A holder whose machine dies (no FIN for its socket) is noticed by the server's
            # keepalive probes: its session, and the lock, end within about half a minute.
            con.execute(b"SET tcp_keepalives_idle = 10")
            con.execute(b"SET tcp_keepalives_interval = 5")
            con.execute(b"SET tcp_keepalives_count = 3")
            row = con.execute(
                b"SELECT pg_try_advisory_lock(hashtext('tally:lease:' || %s))", (name,)
            ).fetchone()
            if not (row and row[0]):
                con.close()
                return False
            con.execute(
                b"INSERT INTO leases VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET"
                b" holder = EXCLUDED.holder, acquired_at = EXCLUDED.acquired_at,"
                b" expires_at = EXCLUDED.expires_at",
                (name, holder, now, now + ttl),
            )
            self._leases[(name, holder)] = con
            return True

    def release_lease(self, name: str, holder: str) -> None:
        with self._leases_lock:
            con = self._leases.pop((name, holder), None)
        if con is None:
            return
        with contextlib.suppress(psycopg.Error):
            con.execute(b"DELETE FROM leases WHERE name = %s AND holder = %s", (name, holder))
            con.execute(b"SELECT pg_advisory_unlock(hashtext('tally:lease:' || %s))", (name,))
        con.close()

    def attempt_journal(self) -> Path | None:
        return None  # replicas record attempts in the database at once (another may take over)

    @contextmanager
    def outbox(self) -> Iterator[Executor]:
        """The webhook outbox's statements, on this thread's lookup connection (autocommit:
        ingest/webhooks_out/outbox.py delimits its transactions). A transaction left open by a
        failure is rolled back before the connection is used again. A connection failure is
        `DatabaseUnavailable` here, but does not mark the database down for the requests: the
        delivery worker looks every second, and only what the requests and the probe see decides
        whether this replica answers 503 at once."""
        self._health.check()
        try:
            con = self._lookup_connection()
            if con.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                con.execute(b"ROLLBACK")
            yield PgExecutor(con)
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(
                f"tally cannot reach its database right now: {first_line(exc)}"
            ) from exc

    def reconcile_partitions(self) -> int:
        """How many partitions the replicas reconcile in: the setting of the last one started."""
        row = self._one("SELECT value FROM tally_meta WHERE name = 'reconcile_partitions'")
        return int(row[0]) if row else 1

    # -- reads for reports and the reconciler ----------------------------------------------------------
    @contextmanager
    def reader(self) -> Iterator[PgReader]:
        with self._conn(pooled=True) as con:
            yield PgReader(con, self)

    @contextmanager
    def log_database(self, scope: Scope | None = None) -> Iterator[LogDatabase]:
        """The reconciler's working copy of the log, or of partition `scope` of it
        (ingest/storage/postgres/copy.py), made on first use and brought up to the watermark,
        publishing to this database (that partition's programs only); one at a time per scope in
        this process. A partition's copy lets go of its memory after the block: a replica works on
        one partition at a time."""
        if scope not in self._engine_locks:
            raise ValueError(f"this store is reconciled in {self.partitions} partitions, not as {scope}")
        with self._engine_locks[scope]:
            engine = self._engines.get(scope)
            if engine is None:
                directory = self.engine_dir
                if scope is not None and directory:
                    directory = str(Path(directory) / f"partition-{scope.part + 1}-of-{scope.parts}")
                engine = self._engines[scope] = WorkingCopy(directory, self.memory_mb, scope)
            try:
                with engine.cursor(PgLogSource(self)) as cur:
                    yield LogDatabase(cur, PgResultSink(self, scope))
            finally:
                if scope is not None:
                    engine.release()

    def check_backup(self, path: str) -> None:
        raise BackupTargetUnusable(
            "this server's database is PostgreSQL: back it up with pg_dump (docs/operations.md);"
            " tally backup copies the embedded database only"
        )

    def backup(self, path: str, sync: Callable[[], None], progress: Progress) -> BackupSummary:
        self.check_backup(path)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._health.close()
        for name, holder in list(self._leases):
            self.release_lease(name, holder)
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._pool.close()
        with self._lookups_lock:
            for con in self._lookups:
                with contextlib.suppress(Exception):
                    con.close()
            self._lookups.clear()
        for engine in self._engines.values():
            engine.close()

    # -- control-plane lookups ----------------------------------------------------------------------
    def credential(self, token_hash: str) -> Credential | None:
        row = self._one(CREDENTIAL + " WHERE token_hash = %s AND revoked_at IS NULL", (token_hash,))
        return credential_row(row) if row else None

    def credential_and_program(self, token_hash: str) -> KeyRead | None:
        """The track endpoints' lookup: from the cache when it has the key (the group commit
        reads it again, `PgTx.outdated`), else from the database (kept when live)."""
        kept = self._keys.get(token_hash)
        if kept is not None:
            return kept
        row = self._one(CREDENTIAL_AND_PROGRAM, (token_hash,))
        if row is None:
            return None
        found = credential_row(row[:11]), program_row(row[11:]) if row[11] is not None else None
        self.key_changed(token_hash, found)
        return found

    def key_changed(self, token_hash: str, now: KeyRead | None) -> None:
        """What a program key is now (None: revoked or gone), as a lookup or a group commit read it."""
        if self._keys_size <= 0:
            return
        with self._keys_lock:
            if now is None or now[0].kind != "program":
                self._keys.pop(token_hash, None)
                return
            if token_hash not in self._keys and len(self._keys) >= self._keys_size:
                del self._keys[next(iter(self._keys))]  # the oldest: a bounded cache
            self._keys[token_hash] = now

    def forget_keys(self) -> None:
        """Drop every cached key (this replica changed a credential or a program)."""
        with self._keys_lock:
            self._keys.clear()

    def program_credential(self, program_id: str) -> Credential | None:
        row = self._one(
            CREDENTIAL + " WHERE kind = 'program' AND subject_id = %s AND revoked_at IS NULL"
            " ORDER BY created_at DESC LIMIT 1",
            (program_id,),
        )
        return credential_row(row) if row else None

    def program(self, program_id: str) -> Program | None:
        row = self._one(PROGRAM + " WHERE program_id = %s", (program_id,))
        return program_row(row) if row else None

    def programs_in(self, workspace_ids: Sequence[str]) -> list[Program]:
        rows = self._rows(
            PROGRAM + " WHERE workspace_id = ANY(%s) ORDER BY created_at, program_id", (list(workspace_ids),)
        )
        return [program_row(r) for r in rows]

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        rows = self._rows(PROGRAM + BY_ACCOUNT, (account,))
        return [program_row(r) for r in rows]

    def role(self, workspace_id: str, account_id: str) -> Role | None:
        row = self._one(
            "SELECT role FROM memberships WHERE workspace_id = %s AND account_id = %s",
            (workspace_id, account_id),
        )
        return row[0] if row else None

    def workspaces_of(self, account_id: str) -> dict[str, Role]:
        rows = self._rows("SELECT workspace_id, role FROM memberships WHERE account_id = %s", (account_id,))
        return {str(ws): role for ws, role in rows}

    def workspace_exists(self, workspace_id: str) -> bool:
        return (
            self._one("SELECT 1 FROM memberships WHERE workspace_id = %s LIMIT 1", (workspace_id,))
            is not None
        )

    def partner(self, program_id: str, code: str) -> Partner | None:
        row = self._one(
            "SELECT partner_id, program_id, code, name, email, created_at FROM partners"
            " WHERE program_id = %s AND code = %s",
            (program_id, code),
        )
        return Partner(*row) if row else None

    def partners(self, program_id: str) -> list[Partner]:
        rows = self._rows(
            "SELECT partner_id, program_id, code, name, email, created_at FROM partners"
            " WHERE program_id = %s ORDER BY code",
            (program_id,),
        )
        return [Partner(*r) for r in rows]

    def checklist(self, program_id: str) -> dict[str, datetime]:
        rows = self._rows("SELECT step, done_at FROM checklist WHERE program_id = %s", (program_id,))
        return {str(step): at for step, at in rows}

    def tracking_log(self, program_id: str, limit: int, before: int | None = None) -> list[LogLine]:
        # the index on (program_id, log_id) walks back from `before`: the page's rows only
        sql = f"SELECT {LOG_PAGE_COLUMNS} FROM tracking_log WHERE program_id = %s"
        params: list[Any] = [program_id]
        if before is not None:
            sql += " AND log_id < %s"
            params.append(before)
        sql += " ORDER BY log_id DESC LIMIT %s"
        params.append(max(1, min(limit, LOG_PAGE_MAX)))
        return [LogLine(*r) for r in self._rows(sql, params)]

    # -- key lookups (committed state) ---------------------------------------------------------------
    def click_partner(self, program_id: str, click_id: str) -> str | None:
        with self._conn() as con:
            return keys.click_partner(con.cursor(), program_id, click_id)

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        with self._conn() as con:
            return keys.binding(con.cursor(), program_id, customer_key)

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        with self._conn() as con:
            return keys.provisional_click(con.cursor(), program_id, customer_key)

    def sale(self, program_id: str, keys_: Sequence[str]) -> SaleLedger | None:
        with self._conn() as con:
            return keys.sale(con.cursor(), program_id, keys_)

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        with self._conn() as con:
            return keys.refund_seen(con.cursor(), program_id, refund_id)

    def event_seen(self, event_id: str) -> bool:
        with self._conn() as con:
            return keys.event_seen(con.cursor(), event_id)
