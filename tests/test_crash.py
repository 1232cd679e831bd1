"""Anything acknowledged survives a crash: SIGKILL the server at chosen points (mid-traffic,
while the journal holds rows DuckDB has not got, in the middle of a copy, during start-up
recovery), restart, and every acknowledged sale is there exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import httpx
import pytest

from ingest.journal import read_segment
from tests.conftest import ROOT, LiveServer, live_program, start_server

SALE = "/api/v1/track/sale"


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
        deadline = time.monotonic() + seconds
        while len(self.acked) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> list[str]:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return list(self.acked)


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    if process.stderr:
        process.stderr.close()


def _journal(db: Path) -> Path:
    return Path(f"{db}.journal")


def _uncopied_batches(db: Path) -> int:
    """Journaled batches the database file has not got (read with the server down)."""
    with duckdb.connect(str(db)) as con:
        row = con.execute("SELECT last_batch FROM journal_state").fetchone()
    done = int(row[0]) if row else 0
    numbers = {int(r["batch"]) for p in sorted(_journal(db).glob("*.log")) for r in read_segment(p)}
    return len([n for n in numbers if n > done])


def _accepted_sales(db: Path) -> dict[str, int]:
    with duckdb.connect(str(db)) as con:
        rows = con.execute(
            "SELECT transaction_id, count(*) FROM raw_events"
            " WHERE kind = 'sale' AND outcome = 'accepted' GROUP BY 1"
        ).fetchall()
    return {str(t): int(n) for t, n in rows}


def _assert_all_there_once(db: Path, acked: list[str]) -> None:
    """Restart (recovery runs), stop cleanly, and read the log: each acknowledged sale once."""
    start_server(db).stop()
    stored = _accepted_sales(db)
    assert [t for t in acked if t not in stored] == []
    assert {t: n for t, n in stored.items() if n > 1} == {}


def _kill_when(server: LiveServer, seen: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if seen():
            _kill(server.process)
            return True
    _kill(server.process)
    return False


@pytest.mark.slow
def test_sigkill_mid_traffic_loses_no_acknowledged_sale(tmp_path: Path) -> None:
    db = tmp_path / "crash.duckdb"
    server = start_server(db)
    _, _, key = live_program(server.url)
    load = Load(server.url, key)
    load.wait_for(300)
    _kill(server.process)
    acked = load.stop()
    assert len(acked) >= 300
    _assert_all_there_once(db, acked)


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_copy(tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    server = start_server(db)
    _, _, key = live_program(server.url)
    load = Load(server.url, key)
    load.wait_for(100)
    # A copy rotates to a fresh segment and removes the closed ones only once DuckDB committed
    # their batches: two segments on disk means a copy is under way.
    journal = _journal(db)
    hit = _kill_when(server, lambda: len(os.listdir(journal)) >= 2)
    acked = load.stop()
    assert hit, "no copy was seen under way"
    _assert_all_there_once(db, acked)


@pytest.mark.slow
@pytest.mark.parametrize("recovery_kill_after", [None, 0.0, 0.05])
def test_sigkill_with_journal_only_rows_and_again_during_start_up_recovery(
    tmp_path: Path, recovery_kill_after: float | None
) -> None:
    """Killed while the journal holds rows DuckDB has not got; then (unless None) killed again
    that many seconds into the start-up that copies them in."""
    db = tmp_path / "recover.duckdb"
    server = start_server(db)
    _, _, key = live_program(server.url)
    load = Load(server.url, key)
    load.wait_for(800)
    _kill(server.process)  # the copier moves rows once a second: the newest are journal-only
    acked = load.stop()
    assert _uncopied_batches(db) > 0
    if recovery_kill_after is None:
        _assert_all_there_once(db, acked)
        return
    newest = max(int(p.stem) for p in _journal(db).glob("*.log"))
    # Start again and kill it as recovery begins (its journal opens a fresh segment first).
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
        env=server.env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(int(p.stem) > newest for p in _journal(db).glob("*.log")):
        time.sleep(0.001)
    time.sleep(recovery_kill_after)
    assert process.poll() is None
    _kill(process)
    _assert_all_there_once(db, acked)
