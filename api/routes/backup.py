"""`POST /api/v1/operator/backup` (an addition to the contract's operator endpoints): a
consistent copy of the database, written by the running server to a path on its machine
(see ingest/storage/duckdb/backup.py). With `Accept: application/x-ndjson` it streams progress lines, as
`POST /api/v1/operator/reconcile` does; a path that cannot take the copy is refused with 422
`validation_error` before any work starts."""

from __future__ import annotations

import asyncio
from typing import Annotated

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import require_operator, state
from api.http import body_model, ok
from api.openapi import OPERATOR_TOKEN, Doc, document
from api.state import State
from api.streaming import progress_stream, summary_view
from ingest.domain.errors import ValidationFailed
from ingest.domain.inputs import Strict
from ingest.progress import Progress
from ingest.storage.contract import BackupSummary


class BackupIn(Strict):
    path: Annotated[str, Field(min_length=1, max_length=4096)]


def _backup(st: State, path: str, progress: Progress) -> BackupSummary:
    # The target is checked again inside: its directory may have changed meanwhile.
    return st.store.backup(path, st.writer.sync_blocking, progress)


def _quiet(stage: str, done: int, total: int) -> None:
    return None


async def backup(request: Request) -> Response:
    require_operator(request)
    _, inp = await body_model(request, BackupIn)
    st = state(request)
    st.store.check_backup(inp.path)
    if "application/x-ndjson" in request.headers.get("accept", ""):
        return progress_stream(lambda progress: _backup(st, inp.path, progress))
    summary = await asyncio.to_thread(_backup, st, inp.path, _quiet)
    return ok(request, summary_view(summary))


routes = [Route("/api/v1/operator/backup", backup, methods=["POST"])]

document(
    {
        backup: Doc(
            "Back up the database while it serves",
            "operator",
            description="Writes a consistent copy (every acknowledged write, journal included) to a "
            "new file `path` on the server's machine; never overwrites. With "
            '`Accept: application/x-ndjson` the answer streams `{"progress": {...}}` lines, then one '
            '`{"data": ...}` line (what `tally backup` shows). See docs/operations.md.',
            auth=(OPERATOR_TOKEN,),
            body=BackupIn,
            data=BackupSummary,
            example={"path": "/var/backups/tally-2026-11-23.db"},
            result={
                "path": "/var/backups/tally-2026-11-23.db",
                "bytes": 12_845_056,
                "tables": 14,
                "rows": {"raw_events": 48_210, "tracking_log": 48_305},
                "last_seq": 48_210,
                "last_batch": 3_911,
                "set_aside": 0,
                "duration_ms": 1_840,
            },
            errors=(ValidationFailed,),
            writes=True,
        ),
    }
)
