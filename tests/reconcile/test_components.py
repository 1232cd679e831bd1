"""The component store (reconcile/run/components.py): joining rows batch by batch gives the
connected components of all of them at once, each named by its smallest seq; the store a run
series leaves in the database is the one a rebuild from the whole log gives; incremental runs
over several batches, merging components across runs, leave exactly a full run's tables."""

from __future__ import annotations

import itertools
from pathlib import Path

import duckdb
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconcile.run import components, job
from reconcile.run.source import ENGINEER_KINDS
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.database import SALE, append, program_database, stream_file
from tests.reconcile.streams import ENGINEER, Stream, profile, streams
from tests.reconcile.test_incremental import assert_same_as_full_run

Rows = list[list[int]]  # row i (seq i + 1): the values it carries


def _reference(rows: Rows) -> dict[int, int]:
    """seq -> smallest seq of its component, by a plain union-find over every row."""
    parent = list(range(len(rows) + 1))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    holder: dict[int, int] = {}
    for seq, values in enumerate(rows, start=1):
        for value in values:
            if value in holder:
                a, b = find(seq), find(holder[value])
                parent[max(a, b)] = min(a, b)
            else:
                holder[value] = seq
    return {seq: find(seq) for seq in range(1, len(rows) + 1)}


def _pairs(rows: Rows, first: int) -> pl.DataFrame:
    data = [(first + i, v) for i, values in enumerate(rows) for v in values]
    return pl.DataFrame(data, schema=components.PAIRS_SCHEMA, orient="row")


@given(
    rows=st.lists(st.lists(st.integers(0, 30), max_size=4), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_joining_batches_gives_the_components_of_the_whole(rows: Rows, cuts: list[int]) -> None:
    """The store kept in memory as `Update.apply` keeps it in the database (new rows and values
    added, merged components renamed) holds after every batch the components of all rows so
    far, each named by its smallest seq; `touched` names the store's components a batch joined."""
    store_rows = pl.DataFrame(schema={"seq": pl.Int64, "comp": pl.Int64})
    store_values = pl.DataFrame(schema=components.COMPS_SCHEMA)
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        new = _pairs(rows[start:end], start + 1)
        known = store_values.join(new.select("value").unique(), on="value")
        joined = components.union(new, pl.Series("seq", range(start + 1, end + 1), pl.Int64), known)
        assert set(joined.touched.to_list()) == set(known.get_column("comp").to_list())
        renamed = dict(zip(joined.renamed.get_column("old"), joined.renamed.get_column("new"), strict=True))
        assert all(new < old for old, new in renamed.items())
        rename = pl.col("comp").replace(renamed) if renamed else pl.col("comp")
        store_rows = pl.concat([store_rows.with_columns(rename), joined.rows])
        store_values = pl.concat([store_values.with_columns(rename), joined.values])
        expected = _reference(rows[:end])
        assert dict(zip(store_rows.get_column("seq"), store_rows.get_column("comp"), strict=True)) == expected
        assert store_values.get_column("value").is_unique().all()
        holders = _pairs(rows[:end], 1).join(store_values, on="value")
        assert all(expected[seq] == comp for seq, comp in holders.select("seq", "comp").iter_rows())


def _store(con: duckdb.DuckDBPyConnection) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    rows = con.sql("SELECT seq, comp FROM rc_link_rows ORDER BY seq").fetchall()
    values = con.sql("SELECT value, comp FROM rc_link_values ORDER BY value").fetchall()
    ((upto,),) = con.sql("SELECT upto_seq FROM rc_link_state").fetchall()
    return rows, values, int(upto)


@profile(5, ci=30)
@given(stream=streams(closes=False, max_events=35), data=st.data())
def test_runs_over_several_batches_equal_a_full_run_and_a_rebuilt_store(
    stream: Stream, data: st.DataObject
) -> None:
    """The log in three parts (engineer actions, which force a full run, in the first): a full
    run, then an incremental run after each of the others. Each leaves exactly a full run's
    tables, and the store is the one rebuilt from the whole log, in batches of a few seqs (as
    the first run built it) or in one."""
    rows = [r for r in stream.rows if r["kind"] in ENGINEER]
    rows += [r for r in stream.rows if r["kind"] not in ENGINEER]
    engineer = sum(r["kind"] in ENGINEER for r in rows)
    one = data.draw(st.integers(engineer, len(rows)), label="first cut")
    two = data.draw(st.integers(one, len(rows)), label="second cut")
    with stream_file(stream) as con, pytest.MonkeyPatch.context() as patch:
        patch.setattr(components, "BUILD_SEQS", data.draw(st.integers(1, 5), label="build_seqs"))
        append(con, rows[:one])
        assert job.run(con, stream.now).mode == "full"
        for start, end in ((one, two), (two, len(rows))):
            append(con, rows[start:end], first_seq=start + 1)
            assert job.run(con, stream.now).mode == "incremental"
            assert_same_as_full_run(con, stream.now)
        kept = _store(con)
        assert kept[2] == len(rows)
        for build_seqs in (3, 1_000_000):
            patch.setattr(components, "BUILD_SEQS", build_seqs)
            con.execute("UPDATE rc_link_state SET format = 'another'")
            assert job.run(con, stream.now).mode == "full"  # a store of another format: rebuilt
            assert _store(con) == kept
        assert_same_as_full_run(con, stream.now)


@profile(5, ci=20)
@given(stream=streams(closes=False, max_events=35), data=st.data())
def test_the_components_an_update_gives_are_a_rebuilt_stores(stream: Stream, data: st.DataObject) -> None:
    """What a full run splits programs by (`Update.comps`, before the update is applied): for
    every covered row, the store's component renamed by the merges the new rows make, or the
    new row's, is the component a store rebuilt from the whole log gives."""
    cut = data.draw(st.integers(0, len(stream.rows)), label="cut")
    with stream_file(stream) as con:
        append(con, stream.rows[:cut])
        job.run(con, stream.now)
        append(con, stream.rows[cut:], first_seq=cut + 1)
        high = components.high_water(con)
        seqs = pl.Series("seq", range(1, high + 1), pl.Int64)
        update = components.catch_up(con, high)
        got = update.comps(con, seqs).sort("seq")
        expected = (
            components._rebuild(con, high, components.Staged(con.cursor())).comps(con, seqs).sort("seq")
        )
        assert got.rows() == expected.rows()
        rows = enumerate(stream.rows, 1)
        covered = [i for i, r in rows if r["kind"] not in ENGINEER_KINDS and r["program_id"]]
        assert got.get_column("seq").to_list() == covered  # engineer actions have none


def test_a_store_ahead_of_the_previous_run_is_not_built_on(tmp_path: Path) -> None:
    """Rows after the previous run that the store already holds would be left out of the
    closure: such a run is a full one (and leaves a full run's tables)."""
    con = program_database(tmp_path / "tally.duckdb", {"commission_bps": 2000, "holding_days": 30})
    try:
        append(con, SALE)
        assert job.run(con, at(days=10)).mode == "full"
        con.execute("UPDATE rc_link_state SET upto_seq = upto_seq + 1")
        late = b.track_sale("sale_9", "tx_9", 4_000, customer_key="ck_1", occurred_at=at(5))
        append(con, [late], first_seq=len(SALE) + 1)
        assert job.run(con, at(days=10)).mode == "full"
        assert_same_as_full_run(con, at(days=10))
    finally:
        con.close()
