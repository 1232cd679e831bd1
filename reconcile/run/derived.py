"""Derived files beside the database that the reconciler reads: what happens to one not believed.

The row store (`<database>.rows`, reconcile/run/rowstore.py) and the column mirror's segments
(`<database>.mirror/`, reconcile/run/mirror.py) are copies of the log kept for speed. Each is
verified before it is read (the row store row by row, with a keyed checksum whose key only the
database holds; a segment whole, against the digest its registry row holds), so that a file
damaged, altered, cut short or of another database can never change a figure. One that fails is
set aside here, not deleted (an operator may want to see what was in it): renamed into
`<database>.rejected/` (private, like every file tally writes). The run goes on from the log, the
file is made anew, a warning is logged (the path and the reason, never a key or a row) and
`tally_derived_file_rejected_total{file}` counts it (api/observability.py).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path

from ingest.storage import private

log = logging.getLogger("tally.reconcile")

SUFFIX = ".rejected"
# The files `rejected` counts, by kind: "rows" (the row store), "mirror" (a mirror segment).
KINDS = ("rows", "mirror")

_lock = threading.Lock()
_rejected = dict.fromkeys(KINDS, 0)


def rejected() -> dict[str, int]:
    """How many derived files of each kind this process has set aside."""
    with _lock:
        return dict(_rejected)


def folder(database: Path) -> Path:
    """Where the rejected derived files of the database file `database` go."""
    return Path(f"{database}{SUFFIX}")


def set_aside(kind: str, database: Path, files: list[Path], reason: str) -> Path | None:
    """Move `files` (the first the derived file, the others its companions: SQLite's `-wal` and
    `-shm`) into the database's rejected folder under a name of their own, log it and count it;
    the new path of the first file (None when it could not be moved, or was not there: it is
    then deleted instead, so that it is never read again)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = folder(database)
    moved: Path | None = None
    try:
        target.mkdir(mode=private.DIRECTORY_MODE, exist_ok=True)
        prefix = f"{kind}-{stamp}-{uuid.uuid4().hex[:8]}-"
        for path in files:
            if path.exists():
                destination = target / f"{prefix}{path.name}"
                path.rename(destination)
                if moved is None and path == files[0]:
                    moved = destination
    except OSError as exc:
        log.warning("derived file %s could not be set aside (%s): deleting it", files[0], exc)
        for path in files:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                log.warning("derived file %s could not be deleted either", path)
    with _lock:
        _rejected[kind] += 1
    log.warning(
        "derived file %s not believed (%s): set aside as %s; the run reads the log, the file is made anew",
        files[0],
        reason,
        moved,
    )
    return moved
