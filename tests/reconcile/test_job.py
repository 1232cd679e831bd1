"""The reconcile job against a real DuckDB file with the ingest schema."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.domain.records import ProgramSettings
from reconcile import explain
from reconcile.run import job, mirror
from reconcile.schema import PROGRAM_DEFAULTS, setting_text
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.compare import checked
from tests.reconcile.database import (
    NOW,
    SALE,
    append,
    assert_materialised,
    mirrored_rows,
    program_database,
    stream_file,
    table,
)
from tests.reconcile.streams import Stream, profile, streams


@pytest.fixture
def con(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = program_database(
        tmp_path / "tally.duckdb", {"commission_bps": 2000, "platform_fee_bps": 100}
    )
    yield connection
    connection.close()


def test_run_materialises_every_table_and_records_the_run(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    progress: list[tuple[str, int, int]] = []
    summary = job.run(con, NOW, lambda stage, done, total: progress.append((stage, done, total)))
    assert (summary.events_read, summary.sales, summary.commissions, summary.high_water_seq) == (4, 1, 1, 4)
    assert summary.run_id.startswith("rcr_")
    recorded = con.execute("SELECT run_id, started_at, finished_at, duration_ms FROM rc_runs").fetchall()
    assert recorded == [
        (summary.run_id, NOW, NOW + timedelta(milliseconds=summary.duration_ms), summary.duration_ms)
    ]
    # the first run builds the component store before reconciling (reconcile/run/components.py)
    assert [p[0] for p in progress] == ["read", "components", "reconcile", "write", "done"]
    sales = table(con, "rc_sales")
    assert sales.select("sale_id", "partner_code", "commission", "platform_fee", "warnings").rows() == [
        ("sale_1", "p1", 2_000, 100, [])
    ]
    assert table(con, "rc_commissions").select("amount", "status", "period").rows() == [
        (2_000, "approved", "2026-01")
    ]
    assert table(con, "rc_double_counts")["kind"].to_list() == ["ingest_refused"]
    evidence = table(con, "rc_evidence")
    assert evidence.select("sale_id", "k_lead", "k_partner").rows() == [("sale_1", "lead_1", "p1")]
    steps = con.sql(
        "SELECT step, rule, looked_up, found, result FROM rc_explain"
        " WHERE program_id = 'prog_a' AND sale_id = 'sale_1' ORDER BY step"
    ).pl()
    assert steps.equals(explain.steps(evidence, sales).select(steps.columns))
    assert steps["result"].to_list() == ["no_data", "no_data", "no_data", "no_data", "matched", "attributed"]
    for name in ("rc_refunds", "rc_unroutable"):
        assert table(con, name).is_empty()
    runs = table(con, "rc_runs")
    assert runs.select("run_id", "high_water_seq", "events_read", "sales", "commissions").rows() == [
        (summary.run_id, 4, 4, 1, 1)
    ]
    assert runs["started_at"].dt.convert_time_zone("UTC").to_list() == [NOW]


def test_each_run_replaces_the_results_and_adds_a_run_row(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, NOW)
    append(con, [b.track_refund("re_1", "tx_1", 2_500, occurred_at=at(3))], first_seq=5)
    second = job.run(con, NOW)
    assert second.high_water_seq == 5
    assert table(con, "rc_sales").select("sale_id", "commission", "refunded").rows() == [
        ("sale_1", 1_500, 2_500)
    ]
    assert table(con, "rc_refunds")["outcome"].to_list() == ["applied"]
    assert table(con, "rc_runs").height == 2


def test_a_failed_write_keeps_the_previous_results(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(con, SALE)
    job.run(con, NOW)
    append(con, [b.track_sale("sale_3", "tx_3", 500, customer_key="ck_1")], first_seq=5)
    monkeypatch.setattr(
        job, "TABLES", {"rc_sales": job.TABLES["rc_sales"], "rc broken": job.TABLES["rc_sales"]}
    )
    with pytest.raises(job.ReconcileFailed, match="rcr_"):
        job.run(con, NOW)
    assert table(con, "rc_sales")["sale_id"].to_list() == ["sale_1"]
    assert table(con, "rc_runs").height == 1


def test_times_are_utc_whatever_the_session_time_zone(con: duckdb.DuckDBPyConnection) -> None:
    """A sale at 23:30 UTC on Jan 31 belongs to January even for a reader in Asia/Tokyo."""
    con.execute("SET TimeZone = 'Asia/Tokyo'")
    append(
        con, [*SALE[:2], b.track_sale("sale_1", "tx_1", 100, customer_key="ck_1", occurred_at=at(21, 11.5))]
    )
    job.run(con, NOW)
    assert table(con, "rc_sales")["period"].to_list() == ["2026-01"]


def test_program_settings_default_like_ingest(con: duckdb.DuckDBPyConnection) -> None:
    """Settings a program's JSON leaves out take ProgramSettings' defaults."""
    defaults = ProgramSettings().model_dump()
    defaults["commission_flat"] = setting_text(defaults["commission_flat"])  # as the frames carry it
    assert {k: defaults[k] for k in PROGRAM_DEFAULTS} == PROGRAM_DEFAULTS
    assert defaults["recurring_months"] is None
    con.execute("UPDATE programs SET settings = '{}'")
    append(con, SALE)
    job.run(con, NOW)
    assert table(con, "rc_sales").select("commission", "platform_fee").rows() == [(3_000, 0)]


# ci=25 (40 before steps of 1 and 4 events joined): a case in parts of one event costs several
# reconciles, and the whole test must stay far under the suite's 300 s timeout on a loaded machine.
@profile(4, ci=25)
@given(
    stream=streams(max_events=30),
    segment_rows=st.sampled_from((3, 7)),
    chunk_events=st.sampled_from((1, 4, 10_000)),
)
def test_job_materialises_exactly_what_the_reference_computes(
    stream: Stream, segment_rows: int, chunk_events: int
) -> None:
    """On a database file, reading the log through the Parquet mirror (segments of a few rows,
    so several) and in steps of at most `chunk_events` events (so programs split into parts by
    component, down to one part per event), reading only the columns each kind needs, the job
    must give the very tables the pure pipeline gives on the whole log, which must be the
    reference's (tests/reconcile/reference.py)."""
    expected = checked(stream.frame(), stream.programs, stream.partners, stream.now)
    with stream_file(stream, segment_rows) as con:
        append(con, stream.rows)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job, "CHUNK_EVENTS", chunk_events)
            job.run(con, stream.now)
        assert mirrored_rows(con) == (len(stream.rows) if len(stream.rows) >= mirror.MIN_ROWS else 0)
        assert_materialised(con, expected)


def test_an_explain_table_of_an_older_run_becomes_the_view(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE rc_explain AS SELECT 1 AS step")
    append(con, SALE)
    job.run(con, NOW)
    kind = con.execute(
        "SELECT table_type FROM information_schema.tables WHERE table_name = 'rc_explain'"
    ).fetchone()
    assert kind == ("VIEW",)
    assert con.execute("SELECT count(*) FROM rc_explain").fetchone() == (6,)  # the five rules and the result


def test_programs_are_packed_into_chunks_without_splitting_one() -> None:
    counts = [("a", 3), ("b", 3), ("c", 10), ("d", 1), ("e", 1)]
    assert job.chunks(counts, limit=6) == [["a", "b"], ["c"], ["d", "e"]]
    assert job.chunks([], limit=6) == []


def test_a_run_splits_larger_programs_into_parts_and_takes_the_largest_steps_first() -> None:
    counts = [("a", 3), ("b", 3), ("c", 10), ("d", 1), ("e", 1), ("f", 13)]
    assert job.plan(counts, limit=6) == [
        job.Unit(("a", "b"), events=6),
        job.Unit(("c",), 0, 2, 5),
        job.Unit(("c",), 1, 2, 5),
        job.Unit(("f",), 0, 3, 5),
        job.Unit(("f",), 1, 3, 5),
        job.Unit(("f",), 2, 3, 5),
        job.Unit(("d", "e"), events=2),
    ]
    assert job.plan([("a", 1)], limit=6) == [job.Unit(("a",), events=1)]
    assert job.plan([], limit=6) == []


def test_staging_tables_left_by_a_crash_are_cleaned_up(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE rc_sales__rcr_crashed AS SELECT 1 AS x")
    con.execute("CREATE TABLE keep__rcr_crashed AS SELECT 1 AS x")
    append(con, SALE)
    job.run(con, NOW)
    names = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "rc_sales__rcr_crashed" not in names and "keep__rcr_crashed" in names
    assert not [n for n in names if n.startswith("rc_") and "__rcr_" in n]


def test_unique_id_columns_are_stored_uncompressed(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, NOW)
    con.execute("CHECKPOINT")
    stored = dict(
        con.execute(
            "SELECT column_name, any_value(compression) FROM pragma_storage_info('rc_sales')"
            " WHERE segment_type = 'VARCHAR' GROUP BY column_name"
        ).fetchall()
    )
    assert stored["sale_id"] == stored["transaction_id"] == "Uncompressed"
    assert stored["program_id"] != "Uncompressed"
    assert table(con, "rc_sales").select("sale_id", "transaction_id").rows() == [("sale_1", "tx_1")]
