"""The embedded backend's in-memory copy of the control plane: credentials, programs, partners,
memberships and checklist steps. Its size follows the accounts, programs and partners, never the
log (what the log decides lives in the key index, ingest/storage/duckdb/keys.py, on disk).

Valid because one process owns the embedded database (the journal's lock refuses a second) and
every write goes through its single writer: the writer updates the copy in the same step as the
database, and rolls it back when a transaction fails (`Undo`). Loaded from the database at start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import duckdb

from ingest.domain import bounds
from ingest.domain.records import Credential, Partner, Program, ProgramSettings, Role

log = logging.getLogger("tally.store")

Undo = list[Callable[[], None]]
K = TypeVar("K")
V = TypeVar("V")


def _set_item(mapping: dict[K, V], key: K, value: V, undo: Undo) -> None:
    if key in mapping:
        old = mapping[key]
        undo.append(lambda: mapping.__setitem__(key, old))
    else:
        undo.append(lambda: _discard(mapping, key))
    mapping[key] = value


def _discard(mapping: dict[K, V], key: K) -> None:
    mapping.pop(key, None)


def stored_time(value: Any) -> datetime | None:
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


@dataclass
class ControlCache:
    """The control plane as the database holds it (live credentials only), kept by the writer."""

    credentials: dict[str, Credential] = field(default_factory=dict)
    programs: dict[str, Program] = field(default_factory=dict)
    partners: dict[tuple[str, str], Partner] = field(default_factory=dict)
    roles: dict[tuple[str, str], Role] = field(default_factory=dict)
    checklist: dict[tuple[str, str], datetime] = field(default_factory=dict)
    # The programs connected to each Stripe account, oldest first: a webhook is routed by a
    # lookup, whatever the number of programs. A key's tuple is replaced whole, never changed.
    by_account: dict[str, tuple[Program, ...]] = field(default_factory=dict)

    # -- writes (each records how to undo itself) ------------------------------------------
    def put_credential(self, cred: Credential, undo: Undo) -> None:
        if cred.revoked_at is not None:
            if cred.token_hash in self.credentials:
                old = self.credentials.pop(cred.token_hash)
                undo.append(lambda: self.credentials.__setitem__(old.token_hash, old))
            return
        _set_item(self.credentials, cred.token_hash, cred, undo)

    def put_program(self, program: Program, undo: Undo) -> None:
        before = self.programs.get(program.program_id)
        _set_item(self.programs, program.program_id, program, undo)
        self._reindex(before, program)
        undo.append(lambda: self._reindex(program, before))

    def _reindex(self, before: Program | None, after: Program | None) -> None:
        """`by_account` after a program changed from `before` to `after` (None: absent)."""
        changed = after or before
        assert changed is not None
        accounts = {p.settings.stripe_account_id for p in (before, after) if p is not None}
        for account in accounts - {None}:
            assert account is not None
            kept = [p for p in self.by_account.get(account, ()) if p.program_id != changed.program_id]
            if after is not None and after.settings.stripe_account_id == account:
                kept.append(after)
                kept.sort(key=lambda p: (p.created_at, p.program_id))
            if kept:
                self.by_account[account] = tuple(kept)
            else:
                self.by_account.pop(account, None)

    def put_partner(self, partner: Partner, undo: Undo) -> None:
        _set_item(self.partners, (partner.program_id, partner.code), partner, undo)

    def put_role(self, workspace_id: str, account_id: str, role: Role, undo: Undo) -> None:
        _set_item(self.roles, (workspace_id, account_id), role, undo)

    def put_checklist(self, program_id: str, step: str, at: datetime, undo: Undo) -> bool:
        if (program_id, step) in self.checklist:
            return False
        _set_item(self.checklist, (program_id, step), at, undo)
        return True

    # -- start-up -------------------------------------------------------------------------------
    def load(self, con: duckdb.DuckDBPyConnection) -> None:
        """Read the control plane from the database (at start, before any write)."""
        undo: Undo = []
        idx = self
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
                    flagged_at=stored_time(r[8]),
                    rotation_deadline=stored_time(r[9]),
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
