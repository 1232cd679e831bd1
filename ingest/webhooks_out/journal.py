"""Attempts kept in a file before they reach the embedded database (CONTRACT section 13).

The delivery worker records every attempt before it sends the endpoint's next delivery, so a
SIGKILL resends at most the delivery that was being sent. On the embedded database a
transaction costs milliseconds of CPU (`outbox.record` of one attempt about 6 ms, taken from
the ingest it shares two cores with), where appending a line to a file costs microseconds. So
on the embedded backend an attempt is recorded by appending it to `<database>.webhooks`, and
the attempts of the file reach the database together (`outbox.record`, one transaction) a
group at a time: before the worker claims again, at least once a second, and when it stops.
Until then the deliveries stay leased to the worker, so nothing claims them again.

A write to the file survives a SIGKILL (the data is in the kernel's page cache once `write`
returns); a power cut may lose the last lines, and then those deliveries are sent again, which
at-least-once allows. The file is not fsynced for that reason. After a crash the next worker
records what the file holds before it frees the dead worker's leases; recording an attempt a
second time (a crash between the database's commit and emptying the file) changes nothing
(`outbox.record` checks the attempts made before). A torn last line (a crash mid-write) is
skipped: its attempt was not recorded, so its delivery is sent again.

The server's sending process (api/outbound/sending.py) appends to the file as it sends a group
of deliveries, and the worker records and empties it: an exclusive `flock` around each append
and around a read and the emptying that follows it keeps both whole, across processes and
between two workers of one process (tests have those). PostgreSQL replicas record in the
database directly (another replica must see an attempt at once).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from ingest.webhooks_out.outbox import Attempt, Outcome

log = logging.getLogger("tally.webhooks")


def _line(a: Attempt) -> bytes:
    o = a.outcome
    entry: dict[str, Any] = {
        "d": a.delivery_id,
        "e": a.endpoint_id,
        "p": a.prior_attempts,
        "f": a.failing,
        "at": a.at.isoformat(),
        "next": a.next_at.isoformat() if a.next_at else None,
        "ok": o.succeeded,
        "code": o.response_status,
        "ms": o.duration_ms,
        "body": o.response_body,
        "error": o.error,
    }
    return orjson.dumps(entry) + b"\n"


def _attempt(entry: dict[str, Any]) -> Attempt:
    outcome = Outcome(bool(entry["ok"]), entry["code"], int(entry["ms"]), entry["body"], entry["error"])
    return Attempt(
        str(entry["d"]),
        str(entry["e"]),
        int(entry["p"]),
        bool(entry["f"]),
        outcome,
        datetime.fromisoformat(entry["at"]),
        datetime.fromisoformat(entry["next"]) if entry["next"] else None,
    )


class AttemptJournal:
    """The file: `append` attempts (one `write`); `take` hands what it holds to a function
    (which records it in the database) and empties the file once that returns."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def has_any(self) -> bool:
        """Whether the file holds anything (one `fstat`)."""
        return os.fstat(self._fd).st_size > 0

    def append(self, attempts: Sequence[Attempt]) -> None:
        data = memoryview(b"".join(_line(a) for a in attempts))
        with self._locked():
            while data:
                written = os.write(self._fd, data)
                data = data[written:]

    def take(self, record: Callable[[list[Attempt]], object]) -> int:
        """`record` the attempts in the file, then empty it (not when `record` raises: they are
        taken again next time); how many there were."""
        with self._locked():
            found = self._read()
            if found:
                record(found)
            os.ftruncate(self._fd, 0)
        return len(found)

    def _read(self) -> list[Attempt]:
        """The attempts in the file, in the order they were appended (a torn last line skipped)."""
        with open(self.path, "rb") as f:
            text = f.read()
        found: list[Attempt] = []
        for number, line in enumerate(text.split(b"\n")):
            if not line:
                continue
            try:
                found.append(_attempt(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                # only the last line can be torn (each append is one write); anything else is
                # a damaged file: its deliveries are sent again, never lost
                log.warning("skipped an unreadable line %d of %s", number + 1, self.path)
        return found

    def close(self) -> None:
        os.close(self._fd)
