"""The write-ahead journal in front of the embedded database.

A group commit is made durable by appending one record (the batch's raw-log, tracking-log,
idempotency and checklist rows) to the current journal segment with a synchronous write (the
segment is opened `O_DSYNC`: `write` returns once the data and the file size are on disk, one
system call where `write` + `fsync` take two, and one hand-back of the GIL): about 0.15 ms,
where a DuckDB commit of the same rows costs several milliseconds. A copier thread moves journaled
batches into DuckDB in large transactions (`DuckStore.flush`): it rotates to a fresh segment,
copies the batches of the closed ones, records the last batch number copied in the same DuckDB
transaction, and only then deletes the closed segments. At start, batches the database has not
got yet (by batch number) are copied in before anything else happens.

Record format: 4-byte big-endian length, 4-byte CRC-32, JSON payload (datetimes as ISO 8601
strings; the reader knows which columns are timestamps). A torn or corrupt tail (a
crash in the middle of a write, before it returned and so before anyone was answered) is
ignored.
"""

from __future__ import annotations

import os
import struct
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
        self._fd = self._open_next()

    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("*.log"))

    def _open_next(self) -> int:
        self._number += 1
        path = self.directory / f"{self._number:012d}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _DSYNC, 0o600)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the new file's name is durable before anything relies on it
        finally:
            os.close(dir_fd)
        return fd

    def append(self, record: dict[str, Any]) -> None:
        payload = orjson.dumps(record)
        data = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        try:
            written = os.write(self._fd, data)
            if not _DSYNC:
                os.fsync(self._fd)
        except OSError:
            written = -1
        if written != len(data):
            # A short or failed write (disk full...) may leave a torn record; whatever follows it
            # in this segment would be unreadable, so later batches go to a fresh segment.
            old, self._fd = self._fd, self._open_next()
            os.close(old)
            raise OSError(f"journal write failed ({written} of {len(data)} bytes)")

    def records(self) -> Iterator[dict[str, Any]]:
        for path in self.segments():
            yield from read_segment(path)

    def rotate(self) -> list[Path]:
        """Start a new segment; return the closed ones (everything appended so far)."""
        closed = self.segments()
        old = self._fd
        self._fd = self._open_next()
        os.close(old)
        return closed

    @staticmethod
    def remove(paths: list[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        os.close(self._fd)
