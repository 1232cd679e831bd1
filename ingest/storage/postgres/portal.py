"""The partners' portal on PostgreSQL: one-time sign-in links, partner sessions and payout
details, each call its own transaction, so every replica sees them at once. A link is taken by
`DELETE ... RETURNING`: of two replicas using the same link at once, exactly one gets it."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from psycopg import Connection

from ingest.domain.records import PartnerSession, PayoutDetails, PortalLink

_DETAILS = "program_id, partner_code, method, email, name, currency, updated_at, updated_by"


class _Connected(Protocol):
    def _conn(self, pooled: bool = False) -> AbstractContextManager[Connection]: ...

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


class PortalRows:
    """The portal's part of `PgStore` (ingest/storage/contract.py `Portal`)."""

    def add_portal_link(self: _Connected, link: PortalLink) -> None:
        with self._conn() as con, con.transaction():
            con.execute(b"DELETE FROM portal_links WHERE expires_at <= %s", (link.created_at,))
            con.execute(
                b"INSERT INTO portal_links VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    link.token_hash,
                    link.program_id,
                    link.partner_code,
                    link.created_at,
                    link.expires_at,
                    link.created_by,
                ),
            )

    def use_portal_link(self: _Connected, token_hash: str, now: datetime) -> PortalLink | None:
        rows = self._rows(
            "DELETE FROM portal_links WHERE token_hash = %s"
            " RETURNING token_hash, program_id, partner_code, created_at, expires_at, created_by",
            (token_hash,),
        )
        if not rows:
            return None
        link = PortalLink(*rows[0])
        return link if link.expires_at > now else None

    def save_partner_session(self: _Connected, session: PartnerSession) -> None:
        with self._conn() as con, con.transaction():
            con.execute(b"DELETE FROM partner_sessions WHERE expires_at <= %s", (session.created_at,))
            con.execute(
                b"INSERT INTO partner_sessions VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    session.session_hash,
                    session.program_id,
                    session.partner_code,
                    session.csrf_token,
                    session.created_at,
                    session.expires_at,
                ),
            )

    def load_partner_session(self: _Connected, session_hash: str, now: datetime) -> PartnerSession | None:
        rows = self._rows(
            "SELECT session_hash, program_id, partner_code, csrf_token, created_at, expires_at"
            " FROM partner_sessions WHERE session_hash = %s AND expires_at > %s",
            (session_hash, now),
        )
        return PartnerSession(*rows[0]) if rows else None

    def end_partner_session(self: _Connected, session_hash: str) -> None:
        self._rows("DELETE FROM partner_sessions WHERE session_hash = %s RETURNING 1", (session_hash,))

    def payout_details(self: _Connected, program_id: str) -> dict[str, PayoutDetails]:
        rows = self._rows(
            f"SELECT {_DETAILS} FROM payout_details WHERE program_id = %s ORDER BY partner_code",
            (program_id,),
        )
        return {str(r[1]): PayoutDetails(*r) for r in rows}

    def set_payout_details(self: _Connected, details: PayoutDetails) -> None:
        d = details
        self._rows(
            f"INSERT INTO payout_details ({_DETAILS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (program_id, partner_code) DO UPDATE SET method = EXCLUDED.method,"
            " email = EXCLUDED.email, name = EXCLUDED.name, currency = EXCLUDED.currency,"
            " updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by RETURNING 1",
            (d.program_id, d.partner_code, d.method, d.email, d.name, d.currency, d.updated_at, d.updated_by),
        )
