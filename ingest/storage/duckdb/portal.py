"""The partners' portal on the embedded database: one-time sign-in links, partner sessions and
payout details, rows of their own (not raw-log rows), each call committed at once on the
caller's cursor (`DuckStore` gives each thread its own), like the dashboard's sessions
(sessions.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import duckdb

from ingest.domain.records import PartnerSession, PayoutDetails, PortalLink
from ingest.storage.duckdb.control import stored_time


def _write(cur: duckdb.DuckDBPyConnection, statements: Sequence[tuple[str, list[Any]]]) -> None:
    cur.execute("BEGIN TRANSACTION")
    try:
        for sql, params in statements:
            cur.execute(sql, params)
        cur.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            cur.execute("ROLLBACK")
        raise


def _time(value: Any) -> datetime:
    moment = stored_time(value)
    assert moment is not None
    return moment


def add_portal_link(cur: duckdb.DuckDBPyConnection, link: PortalLink) -> None:
    """Keep a new link, and drop the expired ones while at it."""
    _write(
        cur,
        [
            ("DELETE FROM portal_links WHERE expires_at <= ?", [link.created_at]),
            (
                "INSERT INTO portal_links VALUES (?, ?, ?, ?, ?, ?)",
                [
                    link.token_hash,
                    link.program_id,
                    link.partner_code,
                    link.created_at,
                    link.expires_at,
                    link.created_by,
                ],
            ),
        ],
    )


def use_portal_link(cur: duckdb.DuckDBPyConnection, token_hash: str, now: datetime) -> PortalLink | None:
    """The link with this hash, deleted in the same statement (whoever deletes it has it); None
    when unknown, used already or expired by `now`."""
    try:
        rows = cur.execute(
            "DELETE FROM portal_links WHERE token_hash = ?"
            " RETURNING token_hash, program_id, partner_code, created_at, expires_at, created_by",
            [token_hash],
        ).fetchall()
    except duckdb.TransactionException:  # another cursor took it at the same moment
        return None
    if not rows:
        return None
    r = rows[0]
    link = PortalLink(str(r[0]), str(r[1]), str(r[2]), _time(r[3]), _time(r[4]), str(r[5]))
    return link if link.expires_at > now else None


def save_partner_session(cur: duckdb.DuckDBPyConnection, session: PartnerSession) -> None:
    _write(
        cur,
        [
            ("DELETE FROM partner_sessions WHERE expires_at <= ?", [session.created_at]),
            (
                "INSERT INTO partner_sessions VALUES (?, ?, ?, ?, ?, ?)",
                [
                    session.session_hash,
                    session.program_id,
                    session.partner_code,
                    session.csrf_token,
                    session.created_at,
                    session.expires_at,
                ],
            ),
        ],
    )


def load_partner_session(
    cur: duckdb.DuckDBPyConnection, session_hash: str, now: datetime
) -> PartnerSession | None:
    r = cur.execute(
        "SELECT session_hash, program_id, partner_code, csrf_token, created_at, expires_at"
        " FROM partner_sessions WHERE session_hash = ? AND expires_at > ?",
        [session_hash, now],
    ).fetchone()
    if r is None:
        return None
    return PartnerSession(str(r[0]), str(r[1]), str(r[2]), str(r[3]), _time(r[4]), _time(r[5]))


def end_partner_session(cur: duckdb.DuckDBPyConnection, session_hash: str) -> None:
    cur.execute("DELETE FROM partner_sessions WHERE session_hash = ?", [session_hash])


_DETAILS = "program_id, partner_code, method, email, name, currency, updated_at, updated_by"


def payout_details(cur: duckdb.DuckDBPyConnection, program_id: str) -> dict[str, PayoutDetails]:
    rows = cur.execute(
        f"SELECT {_DETAILS} FROM payout_details WHERE program_id = ? ORDER BY partner_code", [program_id]
    ).fetchall()
    return {
        str(r[1]): PayoutDetails(
            str(r[0]), str(r[1]), r[2], str(r[3]), str(r[4]), str(r[5]), _time(r[6]), str(r[7])
        )
        for r in rows
    }


def set_payout_details(cur: duckdb.DuckDBPyConnection, details: PayoutDetails) -> None:
    d = details
    cur.execute(
        f"INSERT OR REPLACE INTO payout_details ({_DETAILS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [d.program_id, d.partner_code, d.method, d.email, d.name, d.currency, d.updated_at, d.updated_by],
    )
