"""A file lock that says who holds it: one process at a time on a database file (the embedded
store) or a working directory (the reconciler's working copy)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class Held(Exception):
    """Raised by `hold` when another process (or another holder in this one) has the lock;
    `holder` is its pid as it wrote it."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def hold(path: str | Path) -> int:
    """Lock `path` (created if missing) for as long as the returned descriptor stays open, and
    write this process's pid in it; `Held` when someone else has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise Held(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
