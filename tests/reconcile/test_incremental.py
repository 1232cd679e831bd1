"""Incremental runs give exactly the tables a full run gives, and fall back to one when needed.

The properties run on database files, so the full runs read the log through the Parquet mirror
(segments of a few rows) and the incremental runs add whole segments to it; what a full run
gives is checked against the reference (tests/reconcile/reference.py) every time."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from reconcile.pipeline import reconcile
from reconcile.run import components, incremental, job, mirror
from reconcile.run.source import control_plane, read_linked, read_rows
from reconcile.schema import UNROUTABLE_SCHEMA
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.compare import checked
from tests.reconcile.database import (
    ORDERS,
    SALE,
    append,
    materialised,
    mirrored_rows,
    program_database,
    stream_file,
)
from tests.reconcile.streams import ENGINEER, Stream, ledger_streams, profile, streams

MATERIALISED = {**job.TABLES, "rc_unroutable": ("unroutable", UNROUTABLE_SCHEMA)}


def assert_same_as_full_run(con: duckdb.DuckDBPyConnection, now: datetime) -> None:
    """The rc_* tables hold exactly what reconciling the whole log as of `now` gives (read from
    DuckDB, not through the mirror), which is what the reference gives."""
    raw, programs, partners = job.read(con)
    expected = checked(raw, programs, partners, now)
    for table, (attribute, schema) in MATERIALISED.items():
        got = materialised(con, table, schema).sort(ORDERS[attribute], nulls_last=True)
        assert_frame_equal(got, getattr(expected, attribute), check_exact=True)
    steps = con.sql("SELECT * FROM rc_explain").pl().sort("program_id", "sale_id", "step")
    assert_frame_equal(steps, expected.explain, check_dtypes=False)


def _split(rows: list[dict[str, Any]], cut: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The log up to `cut` and the rest, with the rest's engineer actions (which force a full
    run) moved, in their order, to the end of the first part."""
    head, tail = rows[:cut], rows[cut:]
    return head + [r for r in tail if r["kind"] in ENGINEER], [r for r in tail if r["kind"] not in ENGINEER]


def assert_whole_segments(con: duckdb.DuckDBPyConnection, full_run_rows: int, rows: int) -> None:
    """The mirror holds what the full run over `full_run_rows` rows wrote (all of them, from
    MIN_ROWS on) plus the whole segments incremental runs added since, up to `rows` in all."""
    mirrored = mirrored_rows(con)
    first = full_run_rows if full_run_rows >= mirror.MIN_ROWS else 0
    assert mirrored >= first and (mirrored - first) % mirror.SEGMENT_ROWS == 0
    assert rows - mirrored < mirror.SEGMENT_ROWS


@profile(6, ci=40)
@given(stream=streams(closes=False, max_events=35), data=st.data())
def test_full_run_then_incremental_run_equals_one_full_run(stream: Stream, data: st.DataObject) -> None:
    """Split a random log in two: reconcile the first part in full (as of an earlier `now`),
    append the rest, run again: the incremental run must leave exactly the full run's tables;
    and so must a full run reading the segments both runs wrote."""
    head, tail = _split(stream.rows, data.draw(st.integers(0, len(stream.rows)), label="cut"))
    earlier = data.draw(st.sampled_from((at(days=0), at(days=20), stream.now)), label="earlier")
    with stream_file(stream, data.draw(st.sampled_from((3, 7)), label="segment_rows")) as con:
        append(con, head)
        assert job.run(con, earlier).mode == "full"
        append(con, tail, first_seq=len(head) + 1)
        assert job.run(con, stream.now).mode == "incremental"
        assert_same_as_full_run(con, stream.now)
        assert_whole_segments(con, len(head), len(stream.rows))
        # a processor delivery retried (track calls get a new event id each: never repeated)
        retried = [r for r in tail if r["kind"] == "stripe"][:1]
        append(con, retried, first_seq=len(head) + len(tail) + 1)
        assert job.run(con, stream.now).mode == "incremental"
        assert_same_as_full_run(con, stream.now)
        # a full run reads the segments both kinds of run wrote
        assert job.run(con, stream.now, full=True).mode == "full"
        assert_same_as_full_run(con, stream.now)


@profile(5, ci=20)
@given(stream=ledger_streams(max_events=30), data=st.data())
def test_the_linked_rows_read_in_one_scan_are_those_read_group_by_group(
    stream: Stream, data: st.DataObject
) -> None:
    """An incremental run reads the closure's rows with `read_linked` (one scan for three
    groups of rows): the same rows, columns and values as `read_rows` reading each group with
    its own columns (every other column null), whatever the filter."""
    cut = data.draw(st.integers(0, len(stream.rows)), label="cut")
    with stream_file(stream) as con:
        append(con, stream.rows)
        for where, params in (("", []), ("seq > ?", [cut]), ("program_id IS NOT NULL AND seq % 2 = 0", [])):
            expected = read_rows(con, where, params, groups=("stripe", "other", "ledger", "click"))
            got = read_linked(con, where, params)
            assert_frame_equal(got.sort("seq"), expected.sort("seq"), check_exact=True)


@profile(5, ci=30)
@given(stream=ledger_streams(max_events=20), data=st.data())
def test_bookings_and_finance_actions_reconciled_incrementally_equal_a_full_run(
    stream: Stream, data: st.DataObject
) -> None:
    """Bookings (and the finance actions and batches around them) split between a full run and
    an incremental one: a booking row reaches its sale's component through its transaction id,
    and the incremental run leaves exactly the full run's tables (the ledger's property (d))."""
    head, tail = _split(stream.rows, data.draw(st.integers(0, len(stream.rows)), label="cut"))
    with stream_file(stream, 7) as con:
        append(con, head)
        assert job.run(con, at(days=20)).mode == "full"
        append(con, tail, first_seq=len(head) + 1)
        assert job.run(con, stream.now).mode == "incremental"
        assert_same_as_full_run(con, stream.now)


@profile(5, ci=15)
@given(stream=ledger_streams(max_events=20), data=st.data())
def test_an_incremental_run_in_parts_equals_a_full_run(stream: Stream, data: st.DataObject) -> None:
    """An incremental run whose rows to recompute outnumber a step reconciles them in parts by
    component, each with every engineer action (bookings, finance actions, batches and payments
    included): every table of the result, the payout batches' listing too, is the one reconciling
    them at once gives, and the run leaves exactly the full run's tables."""
    head, tail = _split(stream.rows, data.draw(st.integers(0, len(stream.rows)), label="cut"))
    chunk_events = data.draw(st.sampled_from((1, 3)), label="chunk_events")
    with stream_file(stream, 7) as con:
        append(con, head)
        assert job.run(con, at(days=20)).mode == "full"
        append(con, tail, first_seq=len(head) + 1)
        store = components.catch_up(con, components.high_water(con))
        rows = incremental._closure(con, store)
        engineer = read_rows(con, "program_id IS NOT NULL", groups=("engineer",))
        control = control_plane(con)
        whole, parts = (
            incremental._in_parts(con, store, rows, engineer, control, stream.now, limit).sorted()
            for limit in (None, chunk_events)
        )
        for field in dataclasses.fields(whole):
            assert_frame_equal(getattr(parts, field.name), getattr(whole, field.name), check_exact=True)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job, "CHUNK_EVENTS", chunk_events)
            assert job.run(con, stream.now).mode == "incremental"
        assert_same_as_full_run(con, stream.now)


@profile(4, ci=30)
@given(stream=streams(max_events=30), data=st.data())
def test_months_closed_before_the_previous_run_are_reconciled_incrementally(
    stream: Stream, data: st.DataObject
) -> None:
    """With period closes (and other engineer actions) in the first part of the log, the run
    after the rest arrives is still incremental and leaves exactly the full run's tables,
    frozen months and adjustment lines included."""
    head, tail = _split(stream.rows, data.draw(st.integers(0, len(stream.rows)), label="cut"))
    with stream_file(stream) as con:
        append(con, head)
        assert job.run(con, stream.now).mode == "full"
        append(con, tail, first_seq=len(head) + 1)
        assert job.run(con, stream.now).mode == "incremental"
        assert_same_as_full_run(con, stream.now)


def test_a_sale_in_a_closed_month_is_booked_as_an_adjustment_by_an_incremental_run(
    con: duckdb.DuckDBPyConnection,
) -> None:
    append(con, [*SALE, b.period_close("close_1", "2026-01")])
    assert job.run(con, at(days=50)).mode == "full"
    late = b.track_sale("sale_late", "tx_late", 8_000, customer_key="ck_1", occurred_at=at(days=20))
    append(con, [late], first_seq=10)
    assert job.run(con, at(days=50)).mode == "incremental"
    assert_same_as_full_run(con, at(days=50))
    kinds = con.sql("SELECT kind, period FROM rc_commissions WHERE transaction_id = 'tx_late'").fetchall()
    assert kinds and all(kind == "adjustment" and period != "2026-01" for kind, period in kinds)


def _customer(n: int, days: float) -> list[dict[str, Any]]:
    """A customer of its own (its own click, lead and sale: a component of its own)."""
    return [
        b.click(f"clk_{n}", "p1"),
        b.lead(f"lead_{n}", f"ck_{n}", click_id=f"clk_{n}"),
        b.track_sale(f"sale_{n}", f"tx_{n}", 1_000 * n, customer_key=f"ck_{n}", occurred_at=at(days)),
    ]


def test_a_program_larger_than_a_chunk_is_reconciled_in_parts_that_equal_the_whole(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """A program of more events than a chunk is reconciled in parts by component, each with the
    program's engineer actions: the tables are exactly the whole log's, a payout batch (which
    every part reads) is listed once and pays the lines of every part, and an incremental run
    builds on it."""
    log = [row for n in range(1, 9) for row in _customer(n, days=n)]
    log += b.bookings(log, at(50), holding_days=30)  # finance's view of the approved lines
    log += [
        b.payout_batch("pay_1", "2026-03-01", received_at=at(60), occurred_at=at(60)),
        b.payout_paid("paid_1", "pay_1", received_at=at(61), occurred_at=at(61)),
    ]
    append(con, log)
    steps: list[tuple[str, int, int]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(job, "CHUNK_EVENTS", 4)
        assert job.run(con, at(100), lambda *step: steps.append(step)).mode == "full"
    parts = {total for stage, _, total in steps if stage == "reconcile"}
    assert parts == {-(-len(log) // 4)}  # parts of about 4 events, not one chunk
    assert_same_as_full_run(con, at(100))
    assert con.sql("SELECT payout_id, status FROM rc_payouts").fetchall() == [("pay_1", "paid")]
    paid = con.sql("SELECT count(DISTINCT sale_id) FROM rc_commissions WHERE payout_id = 'pay_1'").fetchall()
    assert paid == [(8,)]
    append(con, _customer(9, days=70), first_seq=len(log) + 1)
    assert job.run(con, at(100)).mode == "incremental"
    assert_same_as_full_run(con, at(100))


@profile(5, ci=15)
@given(stream=ledger_streams(max_events=20), chunk_events=st.sampled_from((1, 3)))
def test_a_full_run_in_parts_equals_the_whole_log(stream: Stream, chunk_events: int) -> None:
    """The ledger's streams (bookings, finance actions, batches and payments, backfills and
    fixes: one program) reconciled in parts of `chunk_events` events by component give the
    whole log's tables."""
    with stream_file(stream, 7) as con:
        append(con, stream.rows)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job, "CHUNK_EVENTS", chunk_events)
            assert job.run(con, stream.now).mode == "full"
        assert_same_as_full_run(con, stream.now)


@pytest.fixture
def con(tmp_path: Path) -> Any:
    connection = program_database(tmp_path / "tally.duckdb", {"commission_bps": 2000, "holding_days": 30})
    yield connection
    connection.close()


NEXT = [b.track_sale("sale_9", "tx_9", 4_000, customer_key="ck_1", occurred_at=at(40))]


def test_a_run_without_new_events_brings_statuses_up_to_now(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, at(days=10))
    assert con.sql("SELECT status FROM rc_commissions").fetchall() == [("pending",)]
    summary = job.run(con, at(days=40))
    assert summary.mode == "incremental" and summary.sales == 1
    assert con.sql("SELECT status FROM rc_commissions").fetchall() == [("approved",)]
    assert con.sql("SELECT commission_status FROM rc_sales").fetchall() == [("approved",)]
    assert_same_as_full_run(con, at(days=40))
    job.run(con, at(days=10))  # a clock set back: pending again, as a full run would say
    assert_same_as_full_run(con, at(days=10))


def test_the_first_run_is_a_full_one(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    assert job.run(con, at(days=50)).mode == "full"
    append(con, NEXT, first_seq=5)
    assert job.run(con, at(days=50)).mode == "incremental"
    assert_same_as_full_run(con, at(days=50))


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE programs SET settings = '{\"commission_bps\": 1000}'",
        "INSERT INTO partners VALUES ('prog_a', 'p2', 'ptr_2', 'S', 's@p.test', TIMESTAMPTZ '2026-01-01')",
        "UPDATE partners SET email = 'u1@x.com'",
    ],
)
def test_changed_settings_or_partners_give_a_full_run(con: duckdb.DuckDBPyConnection, change: str) -> None:
    append(con, SALE)
    job.run(con, at(days=50))
    con.execute(change)
    append(con, NEXT, first_seq=5)
    assert job.run(con, at(days=50)).mode == "full"
    assert_same_as_full_run(con, at(days=50))


@pytest.mark.parametrize(
    "action",
    [
        b.metadata_fix("fix_1", transaction_id="tx_9", customer_key="ck_1"),
        b.backfill("bf_1", "2025-12-01", "2026-03-01"),
        b.period_close("close_1", "2026-01"),
        b.program_terms("terms_1", {"commission_bps": 3000}, {"commission_bps": 5000, "holding_days": 0}),
    ],
)
def test_new_engineer_actions_give_a_full_run(con: duckdb.DuckDBPyConnection, action: dict[str, Any]) -> None:
    append(con, SALE)
    job.run(con, at(days=50))
    append(con, [*NEXT, action], first_seq=5)
    assert job.run(con, at(days=50)).mode == "full"
    assert_same_as_full_run(con, at(days=50))


def test_a_new_engine_version_gives_a_full_run(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(con, SALE)
    job.run(con, at(days=50))
    monkeypatch.setattr(incremental, "ENGINE_VERSION", "next")
    append(con, NEXT, first_seq=5)
    assert job.run(con, at(days=50)).mode == "full"
    assert job.run(con, at(days=50)).mode == "incremental"


def test_results_written_by_a_tool_are_never_built_on(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    raw, programs, partners = job.read(con)
    job.write(
        con,
        reconcile(raw, programs, partners, at(days=50)),
        run_id="rcr_tool",
        raw=raw,
        now=at(days=50),
        started=0.0,
    )
    append(con, NEXT, first_seq=5)
    assert job.run(con, at(days=50)).mode == "full"


def test_new_unroutable_events_are_reported(con: duckdb.DuckDBPyConnection) -> None:
    append(con, SALE)
    job.run(con, at(days=50))
    append(con, [b.invoice("evt_u", "in_u", 500, program_id=None, outcome="unroutable")], first_seq=5)
    assert job.run(con, at(days=50)).mode == "incremental"
    assert con.sql("SELECT event_id FROM rc_unroutable").fetchall() == [("evt_u",)]
    assert_same_as_full_run(con, at(days=50))
