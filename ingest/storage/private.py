"""Private files: what tally writes holds emails, raw request bodies and credential hashes, so
only the user it runs as may read it (files 0600, directories 0700), whatever the umask it was
started with.

DuckDB and SQLite create files of their own (the database's `.wal`, the key index's `-wal`,
`-shm` and `-journal`, a backup's copy), and create some again later (a WAL after each
checkpoint), so no chmod after the fact can cover them: the process's umask does. Every store,
working copy and backup sets it before it creates anything (`restrict_umask`), and the CLI does
at start-up. Files an older release created with wider modes are narrowed when a store opens
them (`make_private`).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("tally.files")

PRIVATE_UMASK = 0o077
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def restrict_umask() -> None:
    """Take the group's and others' bits from every file and directory this process creates
    from now on (the umask's other bits stay as they were)."""
    os.umask(os.umask(PRIVATE_UMASK) | PRIVATE_UMASK)


def make_private(*paths: str | Path) -> None:
    """Narrow each of `paths` that exists to 0600 (a file) or 0700 (a directory, and everything
    in it). Symbolic links are left alone; a path that cannot be changed (another user's) is
    logged, never fatal."""
    for path in paths:
        _narrow(Path(path))


def _narrow(path: Path) -> None:
    try:
        found = path.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("cannot check the mode of %s: %s", path, exc.strerror or exc)
        return
    if stat.S_ISLNK(found.st_mode):
        return
    directory = stat.S_ISDIR(found.st_mode)
    wanted = DIRECTORY_MODE if directory else FILE_MODE
    if stat.S_IMODE(found.st_mode) & ~wanted:
        try:
            path.chmod(stat.S_IMODE(found.st_mode) & wanted)
        except OSError as exc:
            log.warning("cannot make %s private (mode %o): %s", path, wanted, exc.strerror or exc)
    if directory:
        try:
            children = list(path.iterdir())
        except OSError as exc:
            log.warning("cannot list %s: %s", path, exc.strerror or exc)
            return
        for child in children:
            _narrow(child)
