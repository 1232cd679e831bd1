"""A file lock that says who holds it: one process at a time on a database file (the embedded
store) or a working directory (the reconciler's working copy). Also a process's identity
(`identity`), by which a lock recorded elsewhere (the reconcile lease) is known to be a dead
process's (`dead`)."""

from __future__ import annotations

import fcntl
import os
import socket
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


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22), or None
    when there is no such process (or no /proc to ask)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count from after it
    return text[text.rfind(b")") + 2 :].split()[19].decode()


def identity() -> str:
    """This process as `host:pid:start`: a pid that is reused by a later process (a restart in a
    container often gets the same pid) comes with another start time."""
    return f"{socket.gethostname()}:{os.getpid()}:{_started(os.getpid()) or '0'}"


def dead(holder: str) -> bool:
    """Whether `holder` (an `identity()`, with anything after a further `:`) names a process of
    this host that no longer runs: no process has its pid, or the one that has it started at
    another time. False for another host's holder or one in another form (it may be alive)."""
    parts = holder.split(":")
    if len(parts) < 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    return _started(int(parts[1])) != parts[2]
