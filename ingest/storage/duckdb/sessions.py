"""Dashboard sessions, values shown once, and leases on the embedded database: rows of their own
(not raw-log rows), each call committed at once on the caller's cursor (`DuckStore` gives each
thread its own).
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

import duckdb

from ingest.domain.errors import DatabaseUnavailable
from ingest.domain.records import StoredSession
from ingest.storage import lockfile
from ingest.storage.duckdb.control import stored_time
from ingest.storage.duckdb.faults import not_the_data


# -- dashboard sessions and values shown once ----------------------------------------------------
def save_session(cur: duckdb.DuckDBPyConnection, session: StoredSession) -> None:
    """Store a new session, and drop the expired ones while at it."""
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
        if isinstance(exc, Exception) and not_the_data(exc):
            raise DatabaseUnavailable(
                "tally cannot write to its database right now; log in again later"
            ) from exc
        raise


def load_session(cur: duckdb.DuckDBPyConnection, session_hash: str, now: datetime) -> StoredSession | None:
    """The live session with this hash; None when unknown, ended or expired."""
    row = cur.execute(
        "SELECT session_hash, account_id, csrf_token, created_at, expires_at"
        " FROM dashboard_sessions WHERE session_hash = ? AND expires_at > ?",
        [session_hash, now],
    ).fetchone()
    if row is None:
        return None
    created, expires = stored_time(row[3]), stored_time(row[4])
    assert created is not None and expires is not None
    return StoredSession(str(row[0]), str(row[1]), str(row[2]), created, expires)


def end_session(cur: duckdb.DuckDBPyConnection, session_hash: str) -> None:
    cur.execute("DELETE FROM dashboard_sessions WHERE session_hash = ?", [session_hash])
    cur.execute("DELETE FROM shown_once WHERE session_hash = ?", [session_hash])


def keep_once(
    cur: duckdb.DuckDBPyConnection,
    session_hash: str,
    name: str,
    sealed: str,
    now: datetime,
    expires_at: datetime,
) -> None:
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


def take_once(cur: duckdb.DuckDBPyConnection, session_hash: str, name: str, now: datetime) -> str | None:
    rows = cur.execute(
        "DELETE FROM shown_once WHERE session_hash = ? AND name = ? RETURNING sealed, expires_at",
        [session_hash, name],
    ).fetchall()
    return str(rows[0][0]) if rows and (stored_time(rows[0][1]) or now) > now else None


# -- leases: named locks that expire (the reconcile run) -------------------------------------------
def acquire_lease(
    cur: duckdb.DuckDBPyConnection, name: str, holder: str, now: datetime, ttl: timedelta
) -> bool:
    """Take or renew the lease `name` for `holder` until `now + ttl`; False while another
    holder's lease has not expired and that holder may be alive. A holder named by its
    process (`lockfile.identity()`, as the reconciler names itself) that no longer runs left
    its lease by dying (killed mid-run, the server restarted): that lease is free at once."""
    cur.execute("BEGIN TRANSACTION")
    try:
        row = cur.execute(
            "SELECT holder, expires_at, acquired_at FROM leases WHERE name = ?", [name]
        ).fetchone()
        held = row is not None and row[0] != holder and (stored_time(row[1]) or now) > now
        if held and row is not None and not lockfile.dead(str(row[0])):
            cur.execute("ROLLBACK")
            return False
        acquired = row[2] if row is not None and row[0] == holder else now
        cur.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)", [name, holder, acquired, now + ttl])
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


def release_lease(cur: duckdb.DuckDBPyConnection, name: str, holder: str) -> None:
    """Give the lease up, if `holder` still holds it."""
    cur.execute("DELETE FROM leases WHERE name = ? AND holder = ?", [name, holder])
