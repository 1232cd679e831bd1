"""bench/reconcile.py's runs: each in a fresh interpreter, with DuckDB's memory bounded as the
server bounds it, on both sides of a comparison (bench/bounded.py)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from bench import bounded
from bench import reconcile as bench_reconcile
from bench.harness import ROOT


def _limit(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert row is not None
    return str(row[0])


def test_connections_opened_without_a_bound_get_the_servers(tmp_path: Path) -> None:
    connect = bounded.bound("300MB", duckdb.connect)
    plain = duckdb.connect(str(tmp_path / "plain.duckdb"))
    held = connect(str(tmp_path / "held.duckdb"))
    own = connect(str(tmp_path / "own.duckdb"), config={"memory_limit": "700MB"})
    try:
        assert _limit(held) == "286.1 MiB"  # 300 MB
        assert _limit(own) == "667.5 MiB"  # its own bound stays
        assert _limit(plain) != _limit(held)
    finally:
        for con in (plain, held, own):
            con.close()


def test_a_run_step_runs_in_a_child_under_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_RECONCILE_MEMORY_MB", "256")
    db = tmp_path / "log.duckdb"
    made = bench_reconcile._child("generate", str(db), "2000", "10", tree=ROOT)
    assert made.get("events") == 2000, made
    ran = bench_reconcile._child("run", str(db), tree=ROOT)
    assert ran.get("mode") == "full" and ran.get("duckdb_memory_mb") == 256, ran
