"""The raw log's column mirror (reconcile/mirror.py): full runs that read the log through Parquet
segments must materialise exactly what the pure pipeline computes, whatever segments exist,
are lost or are damaged."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from reconcile.pipeline import reconcile
from reconcile.run import job, mirror
from reconcile.schema import UNROUTABLE_SCHEMA
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.database import (
    NOW,
    ORDERS,
    SALE,
    append,
    materialised,
    program_database,
    stream_database,
    table,
)
from tests.reconcile.streams import Stream, profile, streams


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of a few rows, so that small logs make several."""
    monkeypatch.setattr(mirror, "MIN_ROWS", 2)
    monkeypatch.setattr(mirror, "SEGMENT_ROWS", 3)


@pytest.fixture
def con(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = program_database(tmp_path / "tally.duckdb", {"commission_bps": 2000})
    yield connection
    connection.close()


def segments(con: duckdb.DuckDBPyConnection) -> list[tuple[int, int, int]]:
    rows = con.execute("SELECT after_seq, upto_seq, rows FROM rc_mirror ORDER BY after_seq").fetchall()
    return [(int(a), int(u), int(n)) for a, u, n in rows]


def files(con: duckdb.DuckDBPyConnection) -> set[str]:
    root = mirror.directory(con)
    assert root is not None
    return {path.name for path in root.iterdir()} if root.is_dir() else set()


def assert_matches_pipeline(con: duckdb.DuckDBPyConnection, stream: Stream, upto: int) -> None:
    raw = stream.frame().head(upto)
    expected = reconcile(raw, stream.programs, stream.partners, stream.now).sorted()
    tables = {**job.TABLES, "rc_unroutable": ("unroutable", UNROUTABLE_SCHEMA)}
    for name, (attribute, schema) in tables.items():
        got = materialised(con, name, schema).sort(ORDERS[attribute], nulls_last=True)
        assert_frame_equal(got, getattr(expected, attribute), check_exact=True)


@profile(3, ci=25)
@given(stream=streams(max_events=30), cuts=st.lists(st.integers(0, 30), max_size=3))
def test_full_runs_through_the_mirror_give_the_pipeline_tables(stream: Stream, cuts: list[int]) -> None:
    """The log arrives in parts with a full run after each (so later runs read segments written
    by earlier ones plus newer rows from DuckDB), chunked one program a chunk."""
    rows = stream.rows
    bounds = sorted({min(c, len(rows)) for c in cuts} | {len(rows)})
    with tempfile.TemporaryDirectory() as folder, duckdb.connect(str(Path(folder) / "t.duckdb")) as con:
        stream_database(con, stream)
        start = 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job, "CHUNK_EVENTS", 1)
            for bound in bounds:
                if bound > start:
                    append(con, rows[start:bound], first_seq=start + 1)
                job.run(con, stream.now, full=True)
                assert_matches_pipeline(con, stream, bound)
                start = bound
        chain = segments(con)
        assert [after for after, _, _ in chain] == [0, *(upto for _, upto, _ in chain)][: len(chain)]
        assert len(files(con)) == len(chain)
        covered = chain[-1][1] if chain else 0
        assert len(rows) - covered < mirror.MIN_ROWS
        assert sum(count for *_, count in chain) == covered


def test_segments_hold_the_log_and_runs_read_them(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, NOW)
    assert segments(con) == [(0, 3, 3), (3, 4, 1)]
    # What the run reads comes from the segments: a row changed behind the mirror's back (which
    # the append-only log never does) is not seen by the next full run.
    con.execute("UPDATE raw_events SET amount = 1 WHERE seq = 3")
    job.run(con, NOW, full=True)
    assert table(con, "rc_sales").select("sale_id", "commission").rows() == [("sale_1", 2_000)]


def test_a_lost_or_damaged_segment_is_rewritten(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, NOW)
    before = table(con, "rc_sales")
    first, second = sorted(files(con))
    root = mirror.directory(con)
    assert root is not None
    chain = dict(con.execute("SELECT segment, after_seq FROM rc_mirror").fetchall())
    damaged, lost = (first, second) if chain[first] == 0 else (second, first)
    (root / damaged).write_bytes((root / damaged).read_bytes()[:100])
    (root / lost).unlink()
    job.run(con, NOW, full=True)
    assert_frame_equal(table(con, "rc_sales"), before)
    assert segments(con) == [(0, 3, 3), (3, 4, 1)]
    assert damaged not in files(con) and len(files(con)) == 2


def test_a_gap_in_the_chain_stops_it(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, NOW)
    con.execute("DELETE FROM rc_mirror WHERE after_seq = 0")
    append(con, [b.track_sale("sale_3", "tx_3", 500, customer_key="ck_1", occurred_at=at(3))], first_seq=5)
    job.run(con, NOW, full=True)
    assert segments(con) == [(0, 3, 3), (3, 5, 2)]
    assert table(con, "rc_sales").select("sale_id", "commission").sort("sale_id").rows() == [
        ("sale_1", 2_000),
        ("sale_3", 100),
    ]
    assert len(files(con)) == 2


def test_another_format_retires_every_segment(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(con, SALE)
    job.run(con, NOW)
    old = files(con)
    monkeypatch.setattr(mirror, "FORMAT", "another")
    job.run(con, NOW, full=True)
    assert not old & files(con) and len(files(con)) == 2
    assert con.execute("SELECT DISTINCT format FROM rc_mirror").fetchall() == [("another",)]


def test_a_failed_run_leaves_no_segment(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(con, SALE)
    broken = {"rc_sales": job.TABLES["rc_sales"], "rc broken": job.TABLES["rc_sales"]}
    monkeypatch.setattr(job, "TABLES", broken)
    with pytest.raises(job.ReconcileFailed):
        job.run(con, NOW)
    root = mirror.directory(con)
    assert root is not None and not list(root.iterdir())
    names = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "rc_mirror" not in names


def test_files_no_registry_row_names_are_deleted(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, NOW)
    root = mirror.directory(con)
    assert root is not None
    (root / "left-by-a-crash.parquet.partial").write_bytes(b"half")
    job.run(con, NOW, full=True)
    assert len(files(con)) == 2


def test_fewer_rows_than_a_segment_are_read_from_the_database(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror, "MIN_ROWS", 10)
    append(con, SALE)
    job.run(con, NOW)
    assert segments(con) == []
    assert table(con, "rc_sales").select("sale_id", "commission").rows() == [("sale_1", 2_000)]


def test_an_in_memory_database_has_no_mirror() -> None:
    with duckdb.connect() as con:
        assert mirror.directory(con) is None


def test_incremental_runs_add_whole_segments_only(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, NOW)
    more = [
        b.track_sale("sale_3", "tx_3", 500, customer_key="ck_1", occurred_at=at(3)),
        b.track_sale("sale_4", "tx_4", 700, customer_key="ck_1", occurred_at=at(3)),
        b.track_sale("sale_5", "tx_5", 900, customer_key="ck_1", occurred_at=at(4)),
    ]
    append(con, more[:2], first_seq=5)
    assert job.run(con, NOW).mode == "incremental"
    assert segments(con) == [(0, 3, 3), (3, 4, 1)]
    append(con, more[2:], first_seq=7)
    assert job.run(con, NOW).mode == "incremental"
    assert segments(con) == [(0, 3, 3), (3, 4, 1), (4, 7, 3)]
    incremental = table(con, "rc_sales").sort("sale_id")
    assert job.run(con, NOW, full=True).mode == "full"
    assert_frame_equal(table(con, "rc_sales").sort("sale_id"), incremental)
    assert incremental.select("sale_id", "commission").rows() == [
        ("sale_1", 2_000),
        ("sale_3", 100),
        ("sale_4", 140),
        ("sale_5", 180),
    ]


def test_segments_and_newer_rows_meet_whatever_the_session_time_zones(con: duckdb.DuckDBPyConnection) -> None:
    """Segments written by a session in one time zone, newer rows read in another."""
    con.execute("SET TimeZone = 'Asia/Tokyo'")
    append(con, SALE)
    job.run(con, NOW)
    con.execute("SET TimeZone = 'America/New_York'")
    append(
        con, [b.track_sale("sale_3", "tx_3", 500, customer_key="ck_1", occurred_at=at(21, 11.5))], first_seq=5
    )
    job.run(con, NOW, full=True)
    assert segments(con) == [(0, 3, 3), (3, 4, 1)]
    sales = table(con, "rc_sales").sort("sale_id")
    assert sales.select("sale_id", "period").rows() == [("sale_1", "2026-01"), ("sale_3", "2026-01")]
