"""Anything acknowledged survives a crash: SIGKILL the server at chosen points (mid-traffic,
while the journal holds rows DuckDB has not got, in the middle of a copy, during start-up
recovery), restart, and every acknowledged sale is there exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import httpx
import pytest

from tests.conftest import OP, ROOT, LiveServer, live_program, start_server
from tests.processes import Load, accepted_sales, journal_dir, kill, uncopied_batches

SALE = "/api/v1/track/sale"


def _assert_all_there_once(db: Path, acked: list[str]) -> None:
    """Restart (recovery runs), stop cleanly, and read the log: each acknowledged sale once."""
    start_server(db).stop()
    stored = accepted_sales(db)
    assert [t for t in acked if t not in stored] == []
    assert {t: n for t, n in stored.items() if n > 1} == {}


def _kill_when(server: LiveServer, seen: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if seen():
            kill(server.process)
            return True
    kill(server.process)
    return False


@pytest.mark.slow
def test_sigkill_mid_traffic_loses_no_acknowledged_sale(tmp_path: Path) -> None:
    db = tmp_path / "crash.duckdb"
    server = start_server(db)
    _, _, key = live_program(server.url)
    load = Load(server.url, key)
    load.wait_for(300)
    kill(server.process)
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
    journal = journal_dir(db)
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
    kill(server.process)  # the copier moves rows once a second: the newest are journal-only
    acked = load.stop()
    assert uncopied_batches(db) > 0
    if recovery_kill_after is None:
        _assert_all_there_once(db, acked)
        return
    newest = max(int(p.stem) for p in journal_dir(db).glob("*.log"))
    # Start again and kill it as recovery begins (its journal opens a fresh segment first).
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
        env=server.env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        int(p.stem) > newest for p in journal_dir(db).glob("*.log")
    ):
        time.sleep(0.001)
    time.sleep(recovery_kill_after)
    assert process.poll() is None
    kill(process)
    _assert_all_there_once(db, acked)


@pytest.mark.slow
def test_sigkill_mid_reconcile_leaves_no_lock_behind(tmp_path: Path) -> None:
    """A server killed in the middle of a reconcile run leaves its lease in the database (held
    for 10 minutes by the clock); restarted, it reconciles at once: the lease names a process
    that no longer runs."""
    db = tmp_path / "reconcile.duckdb"
    server = start_server(db)
    _, _, key = live_program(server.url)
    load = Load(server.url, key)
    load.wait_for(300)
    load.stop()
    stream_headers = {**OP, "Accept": "application/x-ndjson"}
    with httpx.stream("POST", f"{server.url}/api/v1/operator/reconcile", headers=stream_headers) as r:
        first = next(r.iter_lines())
        kill(server.process)  # at its first progress line: the run holds the lease
    assert "progress" in first
    with duckdb.connect(str(db)) as con:
        left = con.execute("SELECT holder, expires_at > now() FROM leases").fetchall()
    assert [(holder.split(":")[1], live) for holder, live in left] == [(str(server.process.pid), True)]
    restarted = start_server(db)
    try:
        r = httpx.post(f"{restarted.url}/api/v1/operator/reconcile", headers=OP, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["data"]["sales"] >= 300
    finally:
        restarted.stop()
