"""Versioned schema migrations of both backends: one ordered list, applied in order.

The database records every migration it has taken in `schema_version` (one row each: version,
when, what). `apply` brings a database up to `LATEST` inside one transaction per migration, so a
migration that fails leaves the database at the version before it. A database whose version is
newer than this release's `LATEST` is refused (`DatabaseTooNew`): an older `tally` must not write
to a schema it does not know.

A database made before migrations were versioned (no `schema_version` table, but tally's tables
present) is taken as version 0: migration 1 creates the baseline with `CREATE ... IF NOT EXISTS`,
so it adopts those tables as they are, every row kept, and records version 1.

Both backends take the same list (each step runs on an `ingest.storage.sql.Executor` and asks its
`dialect` where the two differ): a DuckDB file and a PostgreSQL database at the same version hold
the same tables. On PostgreSQL, where several replicas may start at once, `apply` holds an
advisory lock while it migrates, so one of them migrates and the others find it done.

Add a migration by appending to `MIGRATIONS` with the next version number; never edit or reorder
one that has shipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from ingest.domain.clock import utcnow
from ingest.domain.keys import EVENT_KEY_SPACE, SALE_CLAIM
from ingest.storage.schema import BASELINE_RAW_COLUMNS, CONTROL_PLANE_DDL, POSTGRES_LOG_DDL, raw_events_ddl
from ingest.storage.sql import DuckExecutor, Executor
from ingest.webhooks_out import outbox

log = logging.getLogger("tally")

VERSION_DDL = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL,
    description VARCHAR NOT NULL)"""

JOURNAL_STATE_DDL = "CREATE TABLE IF NOT EXISTS journal_state (last_batch BIGINT NOT NULL)"


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    steps: Callable[[Executor], None]


Target = Executor | duckdb.DuckDBPyConnection


def _executor(con: Target) -> Executor:
    return DuckExecutor(con) if isinstance(con, duckdb.DuckDBPyConnection) else con


def _baseline(con: Executor) -> None:
    con.execute(raw_events_ddl(BASELINE_RAW_COLUMNS))
    for ddl in CONTROL_PLANE_DDL:
        con.execute(ddl)
    con.execute(JOURNAL_STATE_DDL)
    if con.rows("SELECT count(*) FROM journal_state") == [(0,)]:
        con.execute("INSERT INTO journal_state VALUES (0)")


RUNS_DDL = """CREATE TABLE IF NOT EXISTS rc_runs (
    run_id VARCHAR PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ NOT NULL,
    high_water_seq BIGINT NOT NULL,
    events_read BIGINT NOT NULL,
    sales BIGINT NOT NULL,
    commissions BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    mode VARCHAR,
    fingerprint VARCHAR)"""


def _runs(con: Executor) -> None:
    """The reconciler's record of its runs (reconcile/run/job.py), which it used to create and widen
    on every run: `mode` full | incremental; `fingerprint` of the engine and control plane a run
    used (NULL for results no incremental run may build on). Databases older than 0.1 lack the
    last two columns."""
    con.execute(RUNS_DDL)
    for column in ("mode VARCHAR", "fingerprint VARCHAR"):
        con.execute(f"ALTER TABLE rc_runs ADD COLUMN IF NOT EXISTS {column}")


def _sessions(con: Executor) -> None:
    """Dashboard sessions (api/session.py), kept in the database so a restart keeps people
    logged in: keyed by the hash of the session id (the cookie's value is never stored)."""
    con.execute(
        """CREATE TABLE IF NOT EXISTS dashboard_sessions (
        session_hash VARCHAR PRIMARY KEY,
        account_id VARCHAR NOT NULL,
        csrf_token VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL)"""
    )


def _leases(con: Executor) -> None:
    """Leases (the reconcile run's lock): who holds a named lock and until when, in the database
    so that it outlives the process that took it only until it expires, and binds every process
    that shares the database."""
    con.execute(
        """CREATE TABLE IF NOT EXISTS leases (
        name VARCHAR PRIMARY KEY,
        holder VARCHAR NOT NULL,
        acquired_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL)"""
    )


def _shared_log(con: Executor) -> None:
    """PostgreSQL, where several replicas share the log: the log head (sequence numbers handed
    out in commit order, ingest/storage/postgres/store.py), the keyed tables ingest decides from
    (duplicates, refund ceilings, claims, clicks, bindings: the embedded backend keeps them in
    its key index file beside the database, ingest/storage/duckdb/keys.py), the indexes the hot path looks
    up by, the database's identity (for the reconciler's working copy), and the raw log made
    append-only by the database itself. Nothing changes in an embedded database."""
    if con.dialect != "postgresql":
        return
    for ddl in POSTGRES_LOG_DDL:
        con.execute(ddl)


def _shown_once(con: Executor) -> None:
    """Values the dashboard shows once after a redirect (a newly generated program key), so the
    page that shows it may be served by any replica. Sealed (AES-GCM) with a key derived from the
    session's id, which the database never holds (only its hash): a row cannot be read without
    the browser's cookie. Taken (deleted) by the page that shows it; kept minutes at most."""
    con.execute(
        """CREATE TABLE IF NOT EXISTS shown_once (
        session_hash VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        sealed VARCHAR NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (session_hash, name))"""
    )


PORTAL_DDL: tuple[str, ...] = (
    # A partner's one-time sign-in links (api/portal.py): only the hash of the token; a link is
    # taken (deleted) by the sign-in that uses it, so of two replicas only one can.
    """CREATE TABLE IF NOT EXISTS portal_links (
        token_hash VARCHAR PRIMARY KEY,
        program_id VARCHAR NOT NULL,
        partner_code VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        created_by VARCHAR NOT NULL)""",
    # Partners' portal sessions, like the dashboard's: keyed by the hash of the session id.
    """CREATE TABLE IF NOT EXISTS partner_sessions (
        session_hash VARCHAR PRIMARY KEY,
        program_id VARCHAR NOT NULL,
        partner_code VARCHAR NOT NULL,
        csrf_token VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL)""",
    # Where each partner of a program is paid (PayPal or Wise), for the payout files.
    """CREATE TABLE IF NOT EXISTS payout_details (
        program_id VARCHAR NOT NULL,
        partner_code VARCHAR NOT NULL,
        method VARCHAR NOT NULL,
        email VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        currency VARCHAR NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL,
        updated_by VARCHAR NOT NULL,
        PRIMARY KEY (program_id, partner_code))""",
)


def _portal(con: Executor) -> None:
    """The partners' portal: sign-in links, partner sessions, payout details; and the raw log's
    `promo_code` column (a sale's promotion code, a promo-code assignment's code), which a
    database made before it gets empty on its earlier rows (ingest/storage/schema.py)."""
    con.execute("ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS promo_code VARCHAR")
    for ddl in PORTAL_DDL:
        con.execute(ddl)


def _run_partitions(con: Executor) -> None:
    """Which reconcile partition a run published (ingest/storage/partitions.py): `part` of
    `parts`, NULL for a run of the whole log."""
    for column in ("part INTEGER", "parts INTEGER"):
        con.execute(f"ALTER TABLE rc_runs ADD COLUMN IF NOT EXISTS {column}")


# The raw rows whose claims in a program were sale ids (a track sale's, a processor sale's).
_SALE_ROWS = "SELECT seq FROM raw_events WHERE kind IN ('sale', 'stripe')"


def _claim_kinds(con: Executor) -> None:
    """Claims tagged with their kind (ingest/domain/keys.py): sale ids were claimed untagged, in
    the same space as refunds' `refund:<id>` and promo codes' `promo_code:<code>`, so a sale with
    transaction id `refund:r77` took refund `r77`'s claim. Which kind each claim is cannot be read
    from the key, but can from the raw row that made it (`idempotency_keys.raw_seq`): the claims a
    sale or processor row made in a program become `sale:<id>`; refunds', promo codes' and
    processor event ids' (under `*`) stay as they were. On PostgreSQL `key_claims` (what claims
    are decided by) is told apart by the same rows, before they change. Moved by delete and
    insert, not update: an untagged `sale:x` and `x` become `sale:sale:x` and `sale:x`, which an
    update row by row would find taken. The embedded key index is rebuilt from the log
    (ingest/storage/duckdb/keys.py, format 4), a journal of the release before tagged as it is
    copied in (ingest/storage/duckdb/copier.py)."""
    con.execute(
        "CREATE TEMP TABLE sale_claims AS SELECT program_id, key, raw_seq FROM idempotency_keys"
        f" WHERE program_id <> ? AND raw_seq IN ({_SALE_ROWS})",
        [EVENT_KEY_SPACE],
    )
    if con.dialect == "postgresql":
        con.execute(
            "DELETE FROM key_claims c USING sale_claims s WHERE c.program_id = s.program_id AND c.key = s.key"
        )
        con.execute("INSERT INTO key_claims SELECT program_id, ? || key FROM sale_claims", [SALE_CLAIM])
    con.execute(
        f"DELETE FROM idempotency_keys WHERE program_id <> ? AND raw_seq IN ({_SALE_ROWS})", [EVENT_KEY_SPACE]
    )
    con.execute(
        "INSERT INTO idempotency_keys SELECT program_id, ? || key, raw_seq FROM sale_claims", [SALE_CLAIM]
    )
    con.execute("DROP TABLE sale_claims")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "raw event log, control plane and journal state (the 0.1 schema)", _baseline),
    Migration(2, "reconcile run records (rc_runs) made once, not on every run", _runs),
    Migration(3, "dashboard sessions in the database", _sessions),
    Migration(4, "leases: the reconcile run lock in the database", _leases),
    Migration(5, "PostgreSQL: log head, ingest's keyed tables, append-only raw log", _shared_log),
    Migration(6, "dashboard values shown once, sealed with the session's id", _shown_once),
    Migration(7, "webhooks to brand servers: endpoints, the outbox, deliveries, attempts", outbox.migrate),
    Migration(8, "partners' portal: sign-in links, partner sessions, payout details, promo codes", _portal),
    Migration(9, "reconcile runs record the partition of the programs they published", _run_partitions),
    Migration(10, "claims tagged with their kind: a sale id takes no refund's or promo code's", _claim_kinds),
)
LATEST = MIGRATIONS[-1].version


class DatabaseTooNew(Exception):
    """The database was migrated by a newer tally than this one."""


class MigrationFailed(Exception):
    """A migration raised; the database stays at the version before it."""


@dataclass(frozen=True)
class Applied:
    version: int
    description: str
    applied_at: datetime


def current_version(con: Target) -> int:
    """The database's schema version: 0 for a new database or one older than versioning."""
    db = _executor(con)
    known = db.rows(
        "SELECT count(*) FROM information_schema.tables"
        " WHERE table_name = 'schema_version' AND table_schema = current_schema()"
    )
    if known == [(0,)]:
        return 0
    rows = db.rows("SELECT max(version) FROM schema_version")
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def history(con: Target) -> list[Applied]:
    if current_version(con) == 0:
        return []
    rows = _executor(con).rows("SELECT version, description, applied_at FROM schema_version ORDER BY version")
    return [Applied(int(v), str(d), at) for v, d, at in rows]


def check(con: Target, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """The database's version; raises `DatabaseTooNew` when this release cannot serve it."""
    version = current_version(con)
    latest = migrations[-1].version
    if version > latest:
        raise DatabaseTooNew(
            f"the database is at schema version {version}, newer than this tally's {latest}: "
            "run a tally release at least as new as the one that migrated it"
        )
    return version


def pending(con: Target, migrations: Sequence[Migration] = MIGRATIONS) -> list[Migration]:
    version = check(con, migrations)
    return [m for m in migrations if m.version > version]


# The advisory lock PostgreSQL replicas migrate under (any constant of our own).
_MIGRATION_LOCK = 0x7A11_0001


@contextmanager
def _exclusive(db: Executor) -> Iterator[None]:
    """On PostgreSQL, one migrating process at a time (the others wait, then find it done)."""
    if db.dialect != "postgresql":
        yield
        return
    db.execute("SELECT pg_advisory_lock(?)", [_MIGRATION_LOCK])
    try:
        yield
    finally:
        db.execute("SELECT pg_advisory_unlock(?)", [_MIGRATION_LOCK])


def apply(
    con: Target,
    migrations: Sequence[Migration] = MIGRATIONS,
    on_step: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Apply every pending migration in order, one transaction each; return those applied."""
    _ordered(migrations)
    db = _executor(con)
    with _exclusive(db):
        return _apply(db, migrations, on_step)


def _apply(
    db: Executor, migrations: Sequence[Migration], on_step: Callable[[Migration], None] | None
) -> list[Migration]:
    todo = pending(db, migrations)
    done: list[Migration] = []
    for migration in todo:
        if on_step is not None:
            on_step(migration)
        db.execute("BEGIN TRANSACTION")
        try:
            db.execute(VERSION_DDL)
            migration.steps(db)
            db.execute(
                "INSERT INTO schema_version VALUES (?, ?, ?)",
                [migration.version, utcnow(), migration.description],
            )
            db.execute("COMMIT")
        except Exception as exc:
            db.execute("ROLLBACK")
            raise MigrationFailed(
                f"migration {migration.version} ({migration.description}) failed, "
                f"the database stays at version {migration.version - 1}: {exc}"
            ) from exc
        log.info("schema migrated to version %d (%s)", migration.version, migration.description)
        done.append(migration)
    return done


def _ordered(migrations: Sequence[Migration]) -> None:
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1..n in order, got {versions}")


def _open(path: str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    if read_only and not Path(path).exists():
        raise MigrationFailed(f"{path} does not exist")
    try:
        return duckdb.connect(path, read_only=read_only)
    except duckdb.Error as exc:
        raise MigrationFailed(
            f"cannot open {path}: {str(exc).splitlines()[0]} (is a `tally serve` running on it?)"
        ) from None


def status_of_file(path: str) -> tuple[int, list[Migration]]:
    """`tally migrate --status`: the version of the database at `path` and what is pending."""
    con = _open(path, read_only=True)
    try:
        return check(con), pending(con)
    finally:
        con.close()


def migrate_file(
    path: str, on_step: Callable[[Migration], None] | None = None
) -> tuple[int, list[Migration]]:
    """`tally migrate`: open the database file at `path` (which no server may hold), apply what is
    pending; return the version it had and the migrations applied."""
    con = _open(path)
    try:
        before = check(con)
        return before, apply(con, on_step=on_step)
    finally:
        con.close()
