"""The write-ahead journal in front of the embedded database.

A group commit is made durable by appending one record (the batch's raw-log, tracking-log,
idempotency and checklist rows) to the current journal segment with a synchronous write (the
segment is opened `O_DSYNC`: `write` returns once the data and the file size are on disk, one
system call where `write` + `fsync` take two, and one hand-back of the GIL): about 0.15 ms,
where a DuckDB commit of the same rows costs several milliseconds. A copier thread moves journaled
batches into DuckDB in large transactions (`DuckStore.flush`): it rotates to a fresh segment,
copies the batches of the closed ones, records the last batch number copied in the same DuckDB
transaction, and only then deletes the closed segments. At start, batches the database has not
got yet (by batch number) are copied in before anything else happens. The copier makes the next
segment ahead (`prepare`), before it takes the lock the writer's appends wait on, so creating
it and syncing the directory do not hold a group commit up.

Record format: 4-byte big-endian length, 4-byte CRC-32, JSON payload (datetimes as ISO 8601
strings; the reader knows which columns are timestamps). A torn or corrupt tail (a
crash in the middle of a write, before it returned and so before anyone was answered) is
ignored. A write that fails (disk full) is cut off again before it is reported, so the segment
stays readable and nothing new is created per failure; segments are only rotated when they
hold something, so a copier that keeps failing cannot fill the directory with files.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

_HEADER = struct.Struct(">II")
_DSYNC: int = getattr(os, "O_DSYNC", 0)  # where the platform lacks it, append() fsyncs


def _revive(value: Any) -> Any:
    """Journals written before datetimes were stored as plain ISO strings tagged them as
    `{"$t": iso}`: turn those back into datetimes, anywhere in a decoded record."""
    if isinstance(value, list):
        return [_revive(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "$t" in value:
            return datetime.fromisoformat(value["$t"])
        return {k: _revive(v) for k, v in value.items()}
    return value


def read_segment(path: Path) -> Iterator[dict[str, Any]]:
    data = path.read_bytes()
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        payload = data[start : start + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            return
        record: dict[str, Any] = _revive(orjson.loads(payload))
        yield record
        offset = start + length


class Journal:
    """A directory of append-only segment files of batch records, durable on every append."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = self.segments()
        self._number = int(existing[-1].stem) if existing else 0
        self._size = 0  # bytes of whole records in the open segment
        self._torn = False  # a failed write could not be cut off: the next append starts a segment
        self._ready: tuple[int, int] | None = None  # the next segment, made ahead: (number, fd)
        self._ready_lock = threading.Lock()
        self._fd = self._open_next()

    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("*.log"))

    @property
    def current(self) -> Path:
        return self.directory / f"{self._number:012d}.log"

    def _create(self, number: int) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | _DSYNC
        fd = os.open(self.directory / f"{number:012d}.log", flags, 0o600)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the new file's name is durable before anything relies on it
        finally:
            os.close(dir_fd)
        return fd

    def _open_next(self) -> int:
        self._number += 1
        with self._ready_lock:
            ready, self._ready = self._ready, None
        if ready is not None:
            if ready[0] == self._number:
                return ready[1]
            os.close(ready[1])
        return self._create(self._number)

    def prepare(self) -> None:
        """Make the next segment's file ahead of the rotation that takes it: creating it and
        syncing the directory (up to several milliseconds on a busy disk) then happen before the
        copier takes the lock the writer's appends wait on, not while it holds it. An empty
        segment left by a crash is read as one holding nothing."""
        number = self._number + 1
        with self._ready_lock:
            if self._ready is not None and self._ready[0] == number:
                return
        fd = self._create(number)
        with self._ready_lock:
            old, self._ready = self._ready, (number, fd)
        if old is not None:
            os.close(old[1])

    def append(self, record: dict[str, Any]) -> None:
        """Append one record durably, or raise `OSError` having stored none of it."""
        payload = orjson.dumps(record)
        data = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        if self._torn:
            self._swap_segment()
        code = errno.EIO
        try:
            written = os.write(self._fd, data)
            if not _DSYNC:
                os.fsync(self._fd)
        except OSError as exc:
            written, code = -1, exc.errno or errno.EIO
        if written != len(data):
            # A short or failed write (disk full...) may have left part of a record, and whatever
            # followed it in this segment would be unreadable: cut the segment back to its last
            # whole record, or, failing that, send later records to a fresh segment.
            try:
                os.ftruncate(self._fd, self._size)
                os.fsync(self._fd)
            except OSError:
                self._torn = True
            raise OSError(code, f"journal write failed ({max(written, 0)} of {len(data)} bytes)")
        self._size += written

    def _swap_segment(self) -> None:
        old, self._fd = self._fd, self._open_next()
        self._size = 0
        self._torn = False
        os.close(old)

    def records(self) -> Iterator[dict[str, Any]]:
        for path in self.segments():
            yield from read_segment(path)

    def rotate(self) -> list[Path]:
        """Close the open segment when it holds anything (a new one takes its place); return every
        closed segment, which together hold everything appended so far."""
        if self._size or self._torn:
            self._swap_segment()
        return [path for path in self.segments() if int(path.stem) < self._number]

    @staticmethod
    def remove(paths: list[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        os.close(self._fd)
        with self._ready_lock:
            ready, self._ready = self._ready, None
        if ready is not None:
            os.close(ready[1])
