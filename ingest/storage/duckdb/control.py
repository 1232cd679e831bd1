"""The embedded backend's in-memory copy of the control plane: credentials, programs, partners,
memberships and checklist steps. Its size follows the accounts, programs and partners, never the
log (what the log decides lives in `ingest/hotkeys.py`, on disk).

Valid because one process owns the embedded database (the journal's lock refuses a second) and
every write goes through its single writer: the writer updates the copy in the same step as the
database, and rolls it back when a transaction fails (`Undo`). Loaded from the database at start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from ingest.domain.records import Credential, Partner, Program, Role

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


@dataclass
class Index:
    credentials: dict[str, Credential] = field(default_factory=dict)
    programs: dict[str, Program] = field(default_factory=dict)
    partners: dict[tuple[str, str], Partner] = field(default_factory=dict)
    roles: dict[tuple[str, str], Role] = field(default_factory=dict)
    checklist: dict[tuple[str, str], datetime] = field(default_factory=dict)

    # -- writes (each records how to undo itself) ------------------------------------------
    def put_credential(self, cred: Credential, undo: Undo) -> None:
        if cred.revoked_at is not None:
            if cred.token_hash in self.credentials:
                old = self.credentials.pop(cred.token_hash)
                undo.append(lambda: self.credentials.__setitem__(old.token_hash, old))
            return
        _set_item(self.credentials, cred.token_hash, cred, undo)

    def put_program(self, program: Program, undo: Undo) -> None:
        _set_item(self.programs, program.program_id, program, undo)

    def put_partner(self, partner: Partner, undo: Undo) -> None:
        _set_item(self.partners, (partner.program_id, partner.code), partner, undo)

    def put_role(self, workspace_id: str, account_id: str, role: Role, undo: Undo) -> None:
        _set_item(self.roles, (workspace_id, account_id), role, undo)

    def put_checklist(self, program_id: str, step: str, at: datetime, undo: Undo) -> bool:
        if (program_id, step) in self.checklist:
            return False
        _set_item(self.checklist, (program_id, step), at, undo)
        return True
