"""Connecting to PostgreSQL and telling its faults apart (the PostgreSQL backend,
ingest/storage/postgres/store.py): connection strings with tally's session settings, URLs as messages
may show them, what counts as the database being unreachable, the health that makes a replica
answer 503 at once while it is, connections checked out healthy (`stale`), and `tally migrate`
on a PostgreSQL database."""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import PoolTimeout

from ingest.domain.errors import DatabaseUnavailable
from ingest.storage import migrations
from ingest.storage.sql import PgExecutor

log = logging.getLogger("tally.store")

# How often a replica retries an unreachable database: also the longest a request can still be
# answered 503 after the database accepts connections again (requests never try it themselves,
# so an unreachable one cannot hold up the event loop). A refused connection costs microseconds;
# a database still starting up answers each attempt with a process of its own, ten a second.
PROBE_SECONDS = 0.1
CONNECT_TIMEOUT_SECONDS = 3
# Statements slower than this are cancelled: a lookup or a group commit never hangs a replica.
STATEMENT_TIMEOUT_MS = 30_000


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


class Health:
    """Whether the database answers. Down: every request fails at once (503, `Retry-After: 1`)
    and a probe thread tries the database every `PROBE_SECONDS` until it answers again; then
    the replica's connections are renewed (`on_up`) before requests are let through."""

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


def stale(con: psycopg.Connection[Any]) -> bool:
    """Whether a connection about to be used is no use: closed, broken, or ended by the server
    while it sat idle (PostgreSQL restarted: its connections are gone, though nothing told ours).
    An idle connection has nothing to read, so a readable socket is the server's goodbye (its
    FATAL, or the close itself). One poll, no round trip: the hot path's lookups and the writer
    check their connection before each use; a false alarm costs one reconnect."""
    if con.closed or con.broken:
        return True
    if con.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False  # in the middle of something: the statement itself will tell
    try:
        poller = select.poll()
        poller.register(con.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def adbc_connection(info: str) -> Iterator[adbc.Connection]:
    """An ADBC connection (Arrow in and out, binary COPY), closed when the block ends."""
    con = adbc.connect(info)
    try:
        yield con
    finally:
        con.close()


@contextmanager
def _migrating(url: str) -> Iterator[PgExecutor]:
    try:
        with psycopg.connect(conninfo(url), autocommit=True) as con:
            yield PgExecutor(con)
    except psycopg.OperationalError as exc:
        raise migrations.MigrationFailed(f"cannot connect to {describe(url)}: {first_line(exc)}") from None


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
