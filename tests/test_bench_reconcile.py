"""bench/reconcile.py's runs: each in a fresh interpreter, with DuckDB's memory bounded as the
server bounds it, on both sides of a comparison (bench/bounded.py)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
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


def test_a_log_drawn_in_shards_is_written_in_arrival_order(tmp_path: Path) -> None:
    """bench/rawgen.py `write_sharded` (sizes above 10M events): the database holds the first
    `size` rows numbered 1..size in arrival order, the tail file the held-back rows after them."""
    from bench import rawgen

    db, tail = tmp_path / "log.duckdb", tmp_path / "tail.parquet"
    rawgen.write_sharded(db, tail, 2_500, 100, 1_000)
    with duckdb.connect(str(db), read_only=True) as con:
        ((rows, first, last, ordered),) = con.sql(
            "SELECT count(*), min(seq), max(seq), bool_and(received_at >= previous) FROM ("
            " SELECT seq, received_at, lag(received_at) OVER (ORDER BY seq) AS previous FROM raw_events)"
        ).fetchall()
    assert (rows, first, last) == (2_500, 1, 2_500) and ordered
    assert pl.read_parquet(tail).height == 100
