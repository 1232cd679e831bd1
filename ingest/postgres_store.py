"""The PostgreSQL backend: several `tally serve` replicas sharing one database.

Everything that decides lives in the database; a replica keeps no copy of the log or of the
control plane, so what one replica commits (a sale, a regenerated key, a revoked credential, a
dashboard session) binds every replica from that moment:

- Lookups (credentials, programs, partners, roles, clicks, bindings, sale ledgers, seen refunds
  and events) are point queries on primary keys and indexes, on a pooled connection
  (psycopg-pool). No cache: a regenerated or revoked key is refused by every replica as soon as
  the regenerate call has returned.
- Writes: the writer thread (ingest/writer.py) runs each group commit as one transaction on its
  own connection. Each operation gets a savepoint (taken only when it runs a statement), its
  claims and key updates run as it goes (ingest/postgres_keys.py: the database's unique keys
  and row locks decide duplicates and refund ceilings across replicas), and its raw-log,
  tracking-log and checklist rows are buffered and written at commit with COPY.
- Sequence numbers are handed out at commit, in commit order: the group takes its block of
  `seq` by updating the one `log_head` row just before COMMIT, and that row's lock is held until
  the commit is visible. So a row with a lower `seq` can never become visible after one with a
  higher `seq` was read, and `watermark()` (the head as committed) is exact: the reconciler's
  promise that nothing below it can still appear.
- Faults: a connection that fails, or a database that cannot be reached, is
  `DatabaseUnavailable` (503, nothing acknowledged). While it lasts, lookups and writes fail at
  once instead of waiting (the event loop is never held up by an unreachable database) and a
  probe thread retries every half second; the replica recovers by itself when the database
  returns (`readiness()` says why it is not ready meanwhile).

The reconciler works in a DuckDB working copy of the log on this machine (reconcile/engine.py)
fed through `PgLogSource` and publishes its tables through `PgResultSink`
(ingest/postgres_log.py); reports read the published tables through `PgReader`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from ingest import migrations
from ingest import postgres_keys as keys
from ingest.errors import DatabaseUnavailable, ValidationFailed
from ingest.postgres_log import PgLogSource, PgReader, PgResultSink, reader_types
from ingest.records import (
    Binding,
    Credential,
    LogLine,
    Partner,
    Program,
    ProgramSettings,
    Role,
    SaleLedger,
    StoredSession,
)
from ingest.schema import RAW_EVENT_FIELDS, storable
from ingest.sql import PgExecutor

if TYPE_CHECKING:
    from ingest.backup import BackupSummary
    from ingest.store import Engine, Progress

log = logging.getLogger("tally.store")

Connection = psycopg.Connection[Any]

POOL_MAX = 10  # pooled connections per replica (lookups, reads, sessions)
POOL_WAIT_SECONDS = 5.0  # longest wait for a pooled connection while the database is up
PROBE_SECONDS = 0.5  # how often a replica retries an unreachable database
CONNECT_TIMEOUT_SECONDS = 3
# Statements slower than this are cancelled: a lookup or a group commit never hangs a replica.
STATEMENT_TIMEOUT_MS = 30_000
_KIND, _OUTCOME, _SEQ = (RAW_EVENT_FIELDS.index(n) for n in ("kind", "outcome", "seq"))
_LOG_COLUMNS = (
    "log_id",
    "program_id",
    "logged_at",
    "endpoint",
    "status",
    "outcome",
    "detail",
    "request_id",
    "raw_seq",
)


def conninfo(url: str, statement_timeout: bool = False) -> str:
    """The libpq connection string for `url` (libpq's environment fills what it leaves out),
    with tally's session settings: UTC times, a connect timeout and, for the request path, a
    statement timeout."""
    params = conninfo_to_dict(url)
    options = [str(params.get("options") or ""), "-c TimeZone=UTC"]
    if statement_timeout:
        options.append(f"-c statement_timeout={STATEMENT_TIMEOUT_MS}")
    params.update(
        options=" ".join(filter(None, options)),
        connect_timeout=params.get("connect_timeout") or CONNECT_TIMEOUT_SECONDS,
        application_name=params.get("application_name") or "tally",
    )
    return make_conninfo("", **params)


def describe(url: str) -> str:
    """`url` without its password, for messages and logs."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the PostgreSQL database (unreadable URL)"
    host = params.get("host") or "localhost"
    user, port, name = params.get("user") or "", params.get("port") or 5432, params.get("dbname") or ""
    return f"postgresql://{user}@{host}:{port}/{name}"


def resource_fault(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) is the database being unreachable or out of resources,
    as opposed to a refusal of the data."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DatabaseUnavailable | PoolTimeout | psycopg.OperationalError):
            return True
        if isinstance(seen, psycopg.errors.InsufficientResources | psycopg.errors.AdminShutdown):
            return True
        if isinstance(seen, psycopg.Error) and (seen.sqlstate or "").startswith(("08", "53", "57P")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Health:
    """Whether the database answers. Down: every request fails at once (503) and a probe
    thread tries the database every `PROBE_SECONDS` until it answers again."""

    def __init__(self, info: str, on_up: Any) -> None:
        self._info = info
        self._on_up = on_up
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None

    def down(self, exc: BaseException) -> None:
        with self._lock:
            first = self.reason is None
            self.reason = f"the database cannot be reached ({type(exc).__name__})"
            if self._prober is None or not self._prober.is_alive():
                self._prober = threading.Thread(target=self._probe, name="tally-pg-probe", daemon=True)
                self._prober.start()
        if first:
            log.error("PostgreSQL unreachable (%s); answering 503 until it is back", str(exc).splitlines()[0])

    def _probe(self) -> None:
        while not self._closed.wait(PROBE_SECONDS):
            try:
                with psycopg.connect(self._info, autocommit=True) as con:
                    con.execute(b"SELECT 1")
            except psycopg.Error:
                continue
            self._on_up()
            with self._lock:
                self.reason = None
            log.warning("PostgreSQL is reachable again")
            return

    def check(self) -> None:
        reason = self.reason
        if reason is not None:
            raise DatabaseUnavailable(f"{reason}; nothing of this request was stored")

    def close(self) -> None:
        self._closed.set()


class PgTx:
    """One group commit on the writer's connection (see `ingest.store.Tx`)."""

    def __init__(self, store: PgStore, con: Connection) -> None:
        self._store = store
        self._con = con
        self._cur = con.cursor()
        self._raw: list[list[Any]] = []
        self._logs: list[list[Any]] = []
        self._claims: list[list[Any]] = []  # (program_id, key, raw seq or stand-in): idempotency_keys
        self._checks: dict[tuple[str, str], datetime] = {}
        # Writes nobody reads the result of (key updates of appended rows, control-plane
        # changes) wait in `_pending` and go out with the next read, which must see them, in
        # one round trip (pipeline mode; COPY cannot run in it: `commit` leaves it first). An
        # operation whose writes have not gone out yet is dropped by forgetting them, with no
        # savepoint: every write is numbered, and `release` works while none of the operation's
        # has been sent.
        self._pending: list[tuple[int, bytes, Any]] = []
        self._numbered = 0  # writes numbered so far
        self._marked = 0  # the number at the latest mark: the operation running now wrote after it
        self._sent = 0  # the highest number sent to the database
        self._pipe: AbstractContextManager[psycopg.Pipeline] | None = con.pipeline()
        self._pipe.__enter__()

    def _leave_pipeline(self) -> None:
        """Send what is queued and leave pipeline mode (raising any error it met)."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.__exit__(None, None, None)

    # -- statements ------------------------------------------------------------------------
    def _write(self, sql: bytes, params: Any) -> None:
        self._numbered += 1
        self._pending.append((self._numbered, sql, params))

    def _read(self, upto: int | None = None) -> keys.Cursor:
        """The cursor, once the pending writes (those numbered up to `upto`, if given) are on
        their way (the read sees them)."""
        if self._pending:
            kept = []
            for number, sql, params in self._pending:
                if upto is not None and number > upto:
                    kept.append((number, sql, params))
                    continue
                self._cur.execute(sql, params)
                self._sent = number
            self._pending = kept
        return self._cur

    def mark(self) -> tuple[int, int, int, int, dict[tuple[str, str], datetime]]:
        self._marked = self._numbered
        return (self._numbered, len(self._raw), len(self._logs), len(self._claims), dict(self._checks))

    def release(self, mark: tuple[int, int, int, int, dict[tuple[str, str], datetime]]) -> bool:
        """Drop the operation's writes since `mark`; False once one of them went out (the
        writer then replays the group one operation at a time)."""
        number, raw, logs, claims, checks = mark
        if self._sent > number:
            return False
        self._pending = [p for p in self._pending if p[0] <= number]
        del self._raw[raw:], self._logs[logs:], self._claims[claims:]
        self._checks = checks
        return True

    # -- lookups inside the transaction (they see its own writes) -----------------------------
    def sale(self, program_id: str, keys_: Sequence[str]) -> SaleLedger | None:
        return keys.sale(self._read(), program_id, keys_, lock=True)

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        return keys.refund_seen(self._read(), program_id, refund_id)

    def event_seen(self, event_id: str) -> bool:
        return keys.event_seen(self._read(), event_id)

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        return keys.click_partner(self._read(), program_id, click_id)

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        return keys.binding(self._read(), program_id, customer_key)

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        return keys.provisional_click(self._read(), program_id, customer_key)

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        cur = self._read()
        cur.execute(b"SELECT pg_advisory_xact_lock(hashtext('stripe_account:' || %s))", (account,))
        rows = cur.execute((_PROGRAM + _BY_ACCOUNT).encode(), (account,)).fetchall()
        return [_program(r) for r in rows]

    def credential_used(self, token_hash: str) -> bool:
        sql = b"SELECT 1 FROM credentials WHERE token_hash = %s"
        return self._read().execute(sql, (token_hash,)).fetchone() is not None

    # -- the log -------------------------------------------------------------------------------
    def append(self, row: Mapping[str, Any]) -> int:
        """Buffer one raw row; its `seq` is handed out at commit, so this returns a stand-in
        (negative, unique in the transaction) that `log` and `claim_keys` accept."""
        full = dict(row)
        full.setdefault("test_mode", False)
        full["seq"] = 0
        problems = storable(full)
        if problems:
            raise ValidationFailed("the event holds values tally cannot store", fields=problems)
        stand_in = -(len(self._raw) + 1)
        values = [full.get(name) for name in RAW_EVENT_FIELDS]
        values[_SEQ] = stand_in
        self._raw.append(values)
        keys.observe(self._write, full)
        return stand_in

    def claim_keys(self, program_id: str, keys_: Sequence[str], raw_seq: int) -> list[str]:
        """Sent at once, ahead of pending writes (no one of them touches claims): a claim that
        takes nothing leaves the operation free to be dropped."""
        claimed = keys.claim(self._cur, program_id, list(dict.fromkeys(keys_)))
        if claimed:
            self._numbered += 1
            self._sent = self._numbered
        self._claims += [[program_id, key, raw_seq] for key in claimed]
        return claimed

    def claim_sale(
        self, program_id: str, transaction_id: str, raw_seq: int, click_id: str | None, customer_key: str
    ) -> str | None:
        """One statement: the claim and the partner lookup. Pending writes of earlier operations
        go out with it (a click or lead of this group is seen); this operation's own (its sale's
        ledger, which the lookup does not read) wait, so a refused claim leaves nothing sent."""
        partner = keys.claim_sale(
            self._read(upto=self._marked), program_id, transaction_id, click_id, customer_key
        )
        if partner is not None:
            self._numbered += 1
            self._sent = self._numbered
            self._claims.append([program_id, transaction_id, raw_seq])
        return partner

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
        self._logs.append([0, program_id, at, endpoint, status, outcome, detail, request_id, raw_seq])

    def check(self, program_id: str, step: str, at: datetime) -> None:
        self._checks.setdefault((program_id, step), at)

    # -- the control plane ----------------------------------------------------------------------
    def add_account(self, account_id: str, email: str, at: datetime) -> None:
        self._write(b"INSERT INTO accounts VALUES (%s, %s, %s)", (account_id, email, at))

    def add_workspace(self, workspace_id: str, name: str, at: datetime) -> None:
        self._write(b"INSERT INTO workspaces VALUES (%s, %s, %s)", (workspace_id, name, at))

    def add_member(self, workspace_id: str, account_id: str, role: Role, at: datetime) -> None:
        self._write(b"INSERT INTO memberships VALUES (%s, %s, %s, %s)", (workspace_id, account_id, role, at))

    def put_program(self, program: Program) -> None:
        self._write(
            b"INSERT INTO programs VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (program_id) DO UPDATE SET"
            b" workspace_id = EXCLUDED.workspace_id, name = EXCLUDED.name, settings = EXCLUDED.settings,"
            b" created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at",
            (
                program.program_id,
                program.workspace_id,
                program.name,
                program.settings.model_dump_json(),
                program.created_at,
                program.updated_at,
            ),
        )

    def add_partner(self, partner: Partner) -> None:
        self._write(
            b"INSERT INTO partners VALUES (%s, %s, %s, %s, %s, %s)",
            (
                partner.program_id,
                partner.code,
                partner.partner_id,
                partner.name,
                partner.email,
                partner.created_at,
            ),
        )

    def add_credential(self, cred: Credential) -> None:
        self._write(
            b"INSERT INTO credentials VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                cred.token_hash,
                cred.kind,
                cred.subject_id,
                cred.masked,
                json.dumps(sorted(cred.scopes)),
                json.dumps(sorted(cred.workspace_ids)),
                cred.name,
                cred.created_at,
                cred.revoked_at,
                cred.flagged_at,
                cred.rotation_deadline,
            ),
        )

    def revoke_credentials(self, kind: str, subject_id: str, at: datetime) -> None:
        self._write(
            b"UPDATE credentials SET revoked_at = %s"
            b" WHERE kind = %s AND subject_id = %s AND revoked_at IS NULL",
            (at, kind, subject_id),
        )

    def flag_credential(self, token_hash: str, flagged_at: datetime, deadline: datetime) -> None:
        self._write(
            b"UPDATE credentials SET flagged_at = %s, rotation_deadline = %s WHERE token_hash = %s",
            (flagged_at, deadline, token_hash),
        )

    # -- commit ----------------------------------------------------------------------------------
    def commit(self) -> None:
        """Write the buffered rows and commit: the group's seqs and log ids are taken from
        `log_head` last, so its lock is held only for the COPY and the commit itself."""
        cur = self._cur
        try:
            self._read()
            self._leave_pipeline()
            if self._checks:
                rows = [(p, s, at) for (p, s), at in self._checks.items()]
                cur.executemany(b"INSERT INTO checklist VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", rows)
            if self._raw or self._logs or self._claims:
                self._write_log(cur)
            self._con.commit()
        except Exception as exc:
            self._store._failed(self._con, exc)
            if resource_fault(exc):
                raise DatabaseUnavailable(
                    "tally cannot write to its database right now; nothing of this request was stored"
                ) from exc
            raise
        counts = self._store.ingested
        for row in self._raw:
            key = (row[_KIND], row[_OUTCOME])
            counts[key] = counts.get(key, 0) + 1

    def _write_log(self, cur: keys.Cursor) -> None:
        row = cur.execute(
            b"UPDATE log_head SET seq = seq + %s, log_id = log_id + %s WHERE id = 1 RETURNING seq, log_id",
            (len(self._raw), len(self._logs)),
        ).fetchone()
        assert row is not None, "log_head lost its row"
        first_seq = int(row[0]) - len(self._raw) + 1
        first_log = int(row[1]) - len(self._logs) + 1

        def real(seq: int | None) -> int | None:  # stand-in -k is the k-th raw row
            return first_seq - seq - 1 if seq is not None and seq < 0 else seq

        if self._raw:
            with cur.copy(f"COPY raw_events ({', '.join(RAW_EVENT_FIELDS)}) FROM STDIN".encode()) as copy:
                for values in self._raw:
                    values[_SEQ] = real(values[_SEQ])
                    copy.write_row(values)
        if self._logs:
            with cur.copy(f"COPY tracking_log ({', '.join(_LOG_COLUMNS)}) FROM STDIN".encode()) as copy:
                for number, values in enumerate(self._logs):
                    values[0] = first_log + number
                    values[-1] = real(values[-1])
                    copy.write_row(values)
        if self._claims:
            with cur.copy(b"COPY idempotency_keys (program_id, key, raw_seq) FROM STDIN") as copy:
                for values in self._claims:
                    values[-1] = real(values[-1])
                    copy.write_row(values)

    def rollback(self) -> None:
        try:
            with contextlib.suppress(psycopg.Error):  # what it met is the reason for the rollback
                self._leave_pipeline()
            self._con.rollback()
        except psycopg.Error as exc:  # the connection broke: the next group opens another
            self._store._failed(self._con, exc)


def _credential(r: Sequence[Any]) -> Credential:
    return Credential(
        token_hash=r[0],
        kind=r[1],
        subject_id=r[2],
        masked=r[3],
        scopes=frozenset(json.loads(r[4])),
        workspace_ids=frozenset(json.loads(r[5])),
        name=r[6],
        created_at=r[7],
        revoked_at=r[8],
        flagged_at=r[9],
        rotation_deadline=r[10],
    )


@functools.lru_cache(maxsize=4096)
def _settings(stored: str, program_id: str) -> ProgramSettings:
    """Stored settings parsed once per distinct text (the model is frozen: sharing it is safe)."""
    return ProgramSettings.from_stored(stored, program_id)


def _program(r: Sequence[Any]) -> Program:
    return Program(r[0], r[1], r[2], _settings(r[3], r[0]), r[4], r[5])


_CREDENTIAL = (
    "SELECT token_hash, kind, subject_id, masked, scopes, workspace_ids, name, created_at, revoked_at,"
    " flagged_at, rotation_deadline FROM credentials"
)
_PROGRAM = "SELECT program_id, workspace_id, name, settings, created_at, updated_at FROM programs"
_CREDENTIAL_AND_PROGRAM = (
    "SELECT c.token_hash, c.kind, c.subject_id, c.masked, c.scopes, c.workspace_ids, c.name, c.created_at,"
    " c.revoked_at, c.flagged_at, c.rotation_deadline,"
    " p.program_id, p.workspace_id, p.name, p.settings, p.created_at, p.updated_at"
    " FROM credentials c LEFT JOIN programs p ON c.kind = 'program' AND p.program_id = c.subject_id"
    " WHERE c.token_hash = %s AND c.revoked_at IS NULL"
)
_BY_ACCOUNT = " WHERE settings::jsonb ->> 'stripe_account_id' = %s ORDER BY created_at, program_id"


class PgStore:
    """The PostgreSQL backend of `ingest.store.Store` (see the module docstring)."""

    set_aside = 0  # no journal: nothing is ever set aside

    def __init__(self, url: str, memory_mb: int = 512, engine_dir: str | None = None) -> None:
        """Connect to the database at `url`, migrate it (one replica at a time) and open the
        pool. `memory_mb` bounds the reconciler's working copy; `engine_dir` is where it lives
        (None: a temporary directory of this process)."""
        self.url = url
        self.name = describe(url)
        self._info = conninfo(url)
        self._request_info = conninfo(url, statement_timeout=True)
        self.adbc_info = self._info  # bulk reads and writes (ingest/postgres_log.py)
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
        self._engine: Any = None
        self._engine_lock = threading.Lock()
        try:
            with psycopg.connect(self._info, autocommit=True) as con:
                migrations.apply(PgExecutor(con))
                self.schema_version = migrations.check(PgExecutor(con))
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"cannot connect to {self.name}: {_first_line(exc)}") from None
        self._health = _Health(self._info, self._recovered)
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
        if con is not None and (con.closed or con.broken or self._local.generation != self._generation):
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
                with self._pool.connection(timeout=POOL_WAIT_SECONDS) as con:
                    yield con
            else:
                yield self._lookup_connection()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            self._failed(None, exc)
            raise DatabaseUnavailable(
                f"tally cannot reach its database right now: {_first_line(exc)}"
            ) from exc
        except psycopg.Error as exc:
            if resource_fault(exc):
                self._failed(None, exc)
                raise DatabaseUnavailable(
                    f"tally cannot reach its database right now: {_first_line(exc)}"
                ) from exc
            raise

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
        if self._writer is None or self._writer.closed or self._writer.broken:
            try:
                self._writer = psycopg.connect(self._request_info, autocommit=False)
            except psycopg.Error as exc:
                self._failed(None, exc)
                raise DatabaseUnavailable(
                    f"tally cannot reach its database right now: {_first_line(exc)}"
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
        dies drops its connection, and with it the lock, at once (no waiting for `ttl`); the
        `leases` row says who holds it, for operators."""
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
                    f"tally cannot reach its database right now: {_first_line(exc)}"
                ) from exc
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

    # -- reads for reports and the reconciler ----------------------------------------------------------
    @contextmanager
    def reader(self) -> Iterator[PgReader]:
        with self._conn(pooled=True) as con:
            yield PgReader(con, self)

    @contextmanager
    def engine(self) -> Iterator[Engine]:
        """The reconciler's working copy (reconcile/engine.py), brought up to the watermark;
        one at a time in this process."""
        from reconcile.engine import LocalEngine  # reconcile reads through ingest, not the other way

        with self._engine_lock:
            if self._engine is None:
                self._engine = LocalEngine(self.engine_dir, self.memory_mb)
            engine: LocalEngine = self._engine
            source, sink = PgLogSource(self), PgResultSink(self)
            with engine.session(source, sink) as session:
                yield session

    def check_backup(self, path: str) -> None:
        from ingest.backup import BackupTargetUnusable

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
        if self._engine is not None:
            self._engine.close()

    # -- control-plane lookups ----------------------------------------------------------------------
    def credential(self, token_hash: str) -> Credential | None:
        row = self._one(_CREDENTIAL + " WHERE token_hash = %s AND revoked_at IS NULL", (token_hash,))
        return _credential(row) if row else None

    def credential_and_program(self, token_hash: str) -> tuple[Credential, Program | None] | None:
        row = self._one(_CREDENTIAL_AND_PROGRAM, (token_hash,))
        if row is None:
            return None
        return _credential(row[:11]), _program(row[11:]) if row[11] is not None else None

    def program_credential(self, program_id: str) -> Credential | None:
        row = self._one(
            _CREDENTIAL + " WHERE kind = 'program' AND subject_id = %s AND revoked_at IS NULL"
            " ORDER BY created_at DESC LIMIT 1",
            (program_id,),
        )
        return _credential(row) if row else None

    def program(self, program_id: str) -> Program | None:
        row = self._one(_PROGRAM + " WHERE program_id = %s", (program_id,))
        return _program(row) if row else None

    def programs_in(self, workspace_ids: Sequence[str]) -> list[Program]:
        rows = self._rows(
            _PROGRAM + " WHERE workspace_id = ANY(%s) ORDER BY created_at, program_id", (list(workspace_ids),)
        )
        return [_program(r) for r in rows]

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        rows = self._rows(_PROGRAM + _BY_ACCOUNT, (account,))
        return [_program(r) for r in rows]

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
        sql = f"SELECT {', '.join(_LOG_COLUMNS)} FROM tracking_log WHERE program_id = %s"
        params: list[Any] = [program_id]
        if before is not None:
            sql += " AND log_id < %s"
            params.append(before)
        sql += " ORDER BY log_id DESC LIMIT %s"
        params.append(limit)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def wait_for(url: str, seconds: float) -> None:
    """Wait until the database at `url` accepts connections (for tests and tools)."""
    deadline = time.monotonic() + seconds
    info = conninfo(url)
    while True:
        try:
            with psycopg.connect(info, autocommit=True):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextmanager
def _migrating(url: str) -> Iterator[PgExecutor]:
    try:
        with psycopg.connect(conninfo(url), autocommit=True) as con:
            yield PgExecutor(con)
    except psycopg.OperationalError as exc:
        raise migrations.MigrationFailed(f"cannot connect to {describe(url)}: {_first_line(exc)}") from None


def migrate(
    url: str, on_step: Callable[[migrations.Migration], None] | None = None
) -> tuple[int, list[migrations.Migration]]:
    """`tally migrate` on a PostgreSQL database (replicas may keep serving: they migrate under
    the same lock at start); the version it had and the migrations applied."""
    with _migrating(url) as db:
        before = migrations.check(db)
        return before, migrations.apply(db, on_step=on_step)


def migration_status(url: str) -> tuple[int, list[migrations.Migration]]:
    with _migrating(url) as db:
        return migrations.check(db), migrations.pending(db)
