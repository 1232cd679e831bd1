"""Helpers of the tests that drive real `tally serve` processes (crash points, backups): load
that remembers what was acknowledged, SIGKILL, waiting on a condition with a deadline, and reads
of the database file once it is down."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import httpx

from ingest.storage.duckdb.journal import read_segment

SALE = "/api/v1/track/sale"


def poll(condition: Callable[[], bool], seconds: float = 30, every: float = 0.01) -> bool:
    """Whether `condition()` came to hold within `seconds`, checking every `every` seconds (the
    caller learns as soon as it does: no fixed sleep, and no busy loop starving the server)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 30, every: float = 0.01) -> None:
    """`poll`, failing (naming `what`) when the condition does not come to hold in time."""
    if not poll(condition, seconds, every):
        raise AssertionError(f"waited {seconds} s for {what}")


class Load:
    """Threads posting sales with fresh transaction ids; remembers the acknowledged ones."""

    def __init__(self, url: str, key: str, workers: int = 8) -> None:
        self.acked: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(url, key, i), daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def _client(self, url: str, key: str, worker: int) -> None:
        with httpx.Client(base_url=url, timeout=5, headers={"Authorization": f"Bearer {key}"}) as c:
            n = 0
            while not self._stop.is_set():
                txn = f"in_{time.monotonic_ns()}_{worker}_{n}"
                n += 1
                try:
                    r = c.post(SALE, json={"transaction_id": txn, "customer_external_id": "c", "amount": 100})
                except httpx.HTTPError:
                    return  # the server died under us: this one was never acknowledged
                if r.status_code == 200:
                    with self._lock:
                        self.acked.append(txn)

    def wait_for(self, count: int, seconds: float = 30) -> None:
        """Until `count` sales are acknowledged (fails after `seconds`)."""
        wait_until(lambda: len(self.acked) >= count, f"{count} acknowledged sales", seconds)

    def stop(self) -> list[str]:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return list(self.acked)


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    if process.stderr:
        process.stderr.close()


def journal_dir(db: Path) -> Path:
    return Path(f"{db}.journal")


def uncopied_batches(db: Path) -> int:
    """Journaled batches the database file has not got (read with the server down)."""
    with duckdb.connect(str(db)) as con:
        row = con.execute("SELECT last_batch FROM journal_state").fetchone()
    done = int(row[0]) if row else 0
    numbers = {int(r["batch"]) for p in sorted(journal_dir(db).glob("*.log")) for r in read_segment(p)}
    return len([n for n in numbers if n > done])


def accepted_sales(db: Path) -> dict[str, int]:
    with duckdb.connect(str(db)) as con:
        rows = con.execute(
            "SELECT transaction_id, count(*) FROM raw_events"
            " WHERE kind = 'sale' AND outcome = 'accepted' GROUP BY 1"
        ).fetchall()
    return {str(t): int(n) for t, n in rows}
