"""Control-plane rows of the PostgreSQL backend: the queries the store and its transactions
share, and rows back to records."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from ingest.domain.records import Credential, Program, ProgramSettings


def credential_row(r: Sequence[Any]) -> Credential:
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


def program_row(r: Sequence[Any]) -> Program:
    return Program(r[0], r[1], r[2], _settings(r[3], r[0]), r[4], r[5])


CREDENTIAL = (
    "SELECT token_hash, kind, subject_id, masked, scopes, workspace_ids, name, created_at, revoked_at,"
    " flagged_at, rotation_deadline FROM credentials"
)
PROGRAM = "SELECT program_id, workspace_id, name, settings, created_at, updated_at FROM programs"
CREDENTIAL_AND_PROGRAM = (
    "SELECT c.token_hash, c.kind, c.subject_id, c.masked, c.scopes, c.workspace_ids, c.name, c.created_at,"
    " c.revoked_at, c.flagged_at, c.rotation_deadline,"
    " p.program_id, p.workspace_id, p.name, p.settings, p.created_at, p.updated_at"
    " FROM credentials c LEFT JOIN programs p ON c.kind = 'program' AND p.program_id = c.subject_id"
    " WHERE c.token_hash = %s AND c.revoked_at IS NULL"
)
CREDENTIALS_AND_PROGRAMS = CREDENTIAL_AND_PROGRAM.replace("c.token_hash = %s", "c.token_hash = ANY(%s)")
BY_ACCOUNT = " WHERE settings::jsonb ->> 'stripe_account_id' = %s ORDER BY created_at, program_id"
