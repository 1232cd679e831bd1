"""The row store (reconcile/run/rowstore.py): incremental runs read their closure's rows there,
exactly as the log gives them, and never trust a file the database does not name.

Every property of tests/reconcile/test_incremental.py runs on database files, so on the row
store too; these check the store itself: what it reads back, that incremental runs do read it,
and each case where the file must not be believed (lost, cut short, another database's, rows
of a run that did not commit)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from reconcile.run import components, incremental, job, rowstore
from reconcile.run.rowstore import RowStore
from reconcile.run.source import read_linked
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.database import append, program_database, stream_file
from tests.reconcile.streams import Stream, ledger_streams, profile, streams
from tests.reconcile.test_incremental import _split, assert_same_as_full_run

# Strings JSON must carry as they are: quotes, backslashes, the text the encoder drops, control
# characters, characters outside the BMP.
AWKWARD = ('say "hi"', "back\\", ',"1":null', '\\",\\"2\\":null', "tab\tnew\nline", "é 😀 \u2028", "")


@pytest.fixture(autouse=True)
def _every_closure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The closures of these small logs are most of them: the row store serves them all the same
    (`test_a_closure_too_large_a_share_of_the_log_is_read_by_scan` says when it does not)."""
    monkeypatch.setattr(rowstore, "SHARE", 1)


def _covered(con: duckdb.DuckDBPyConnection) -> pl.Series:
    rows: pl.DataFrame = con.sql(f"SELECT seq FROM raw_events WHERE {components.COVERED}").pl()
    return rows.get_column("seq")


def _state(con: duckdb.DuckDBPyConnection) -> tuple[str, int]:
    ((token, upto),) = con.execute("SELECT token, upto_seq FROM rc_row_state").fetchall()
    return str(token), int(upto)


def _path(con: duckdb.DuckDBPyConnection) -> Path:
    path = rowstore.path_of(con)
    assert path is not None
    return path


def _read_back(con: duckdb.DuckDBPyConnection, seqs: pl.Series) -> pl.DataFrame | None:
    """What the row store of `con`'s database gives for `seqs`, as a run would open it."""
    high = int(con.execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchall()[0][0])
    store = RowStore.open(con, high)
    assert store is not None
    try:
        return store.read(con, seqs)
    finally:
        store.close()


@profile(5, ci=25)
@given(stream=ledger_streams(max_events=30), data=st.data())
def test_rows_read_back_exactly_as_the_log_gives_them(stream: Stream, data: st.DataObject) -> None:
    """Caught up in batches of any size, the store gives every covered row (any subset of them)
    with the columns, types, values and order `read_linked` gives."""
    batch = data.draw(st.sampled_from((1, 4, 1_000)), label="batch_seqs")
    with stream_file(stream) as con, pytest.MonkeyPatch.context() as patch:
        patch.setattr(rowstore, "BATCH_SEQS", batch)
        append(con, stream.rows)
        high = len(stream.rows)
        store = RowStore.open(con, high)
        assert store is not None and store.upto == 0
        store.catch_up(con, high)
        seqs = _covered(con)
        wanted = seqs.filter(
            pl.Series(data.draw(st.lists(st.booleans(), min_size=seqs.len(), max_size=seqs.len())))
        )
        for asked in (seqs, wanted):
            got = store.read(con, asked)
            expected = read_linked(con, "seq IN (SELECT unnest(?::BIGINT[]))", [asked.to_list()])
            assert got is not None
            assert_frame_equal(got, expected, check_exact=True)
        store.close()


def test_awkward_strings_and_times_travel_unchanged(tmp_path: Path) -> None:
    con = program_database(tmp_path / "tally.duckdb", {"commission_bps": 2000})
    rows: list[dict[str, Any]] = []
    for i, text in enumerate(AWKWARD):
        rows += [
            b.click(f"clk_{i}", "p1", occurred_at=at(days=i, hours=0.123456)),
            b.lead(f"lead_{i}", text, click_id=f"clk_{i}", email=f"{text}@x.test"),
            b.track_sale(f"sale_{i}", f"tx_{i}", 1000 + i, customer_key=text, promo_code=text),
            b.invoice(
                f"evt_{i}", f"in_{i}", 1000 + i, subscription_id=f"sub_{text}", customer_key=text, email=text
            ),
        ]
    append(con, [{**r, "program_id": "prog_a"} for r in rows])
    job.run(con, at(days=30))
    got = _read_back(con, _covered(con))
    assert got is not None
    assert_frame_equal(got, read_linked(con, components.COVERED), check_exact=True)
    con.close()


@profile(4, ci=20)
@given(stream=streams(max_events=30), data=st.data())
def test_incremental_runs_read_the_closure_from_the_store_not_the_log(
    stream: Stream, data: st.DataObject
) -> None:
    """With the log's read of the closure taken away, incremental runs still leave exactly the
    full run's tables: they read the row store; and it follows the log run after run."""
    head, tail = _split(stream.rows, data.draw(st.integers(0, len(stream.rows)), label="cut"))
    with stream_file(stream) as con, pytest.MonkeyPatch.context() as patch:
        append(con, head)
        assert job.run(con, at(days=20)).mode == "full"
        assert _state(con)[1] == len(head)

        def no_scan(*args: Any, **kwargs: Any) -> pl.DataFrame:
            raise AssertionError("the closure was read from the log")

        patch.setattr(incremental, "read_linked", no_scan)
        append(con, tail, first_seq=len(head) + 1)
        assert job.run(con, stream.now).mode == "incremental"
        assert_same_as_full_run(con, stream.now)
        assert _state(con)[1] == len(stream.rows)


def _two_runs(tmp_path: Path) -> tuple[duckdb.DuckDBPyConnection, list[dict[str, Any]]]:
    """A database after a full run on half of a small log, the other half appended."""
    con = program_database(tmp_path / "tally.duckdb", {"commission_bps": 2000, "holding_days": 30})
    rows: list[dict[str, Any]] = []
    for i in range(12):
        rows += [
            b.click(f"clk_{i}", "p1"),
            b.lead(f"lead_{i}", f"cust_{i % 5}", click_id=f"clk_{i}"),
            b.track_sale(f"sale_{i}", f"tx_{i}", 1000 + i, customer_key=f"cust_{i % 5}"),
        ]
    rows = [{**r, "program_id": "prog_a"} for r in rows]
    append(con, rows[:18])
    assert job.run(con, at(days=20)).mode == "full"
    append(con, rows[18:], first_seq=19)
    return con, rows


def test_a_lost_file_is_made_anew_and_filled(tmp_path: Path) -> None:
    con, rows = _two_runs(tmp_path)
    token, _ = _state(con)
    _path(con).unlink()
    assert job.run(con, at(days=40)).mode == "incremental"
    assert_same_as_full_run(con, at(days=40))
    assert _state(con)[0] != token and _state(con)[1] == len(rows)
    got = _read_back(con, _covered(con))
    assert got is not None and got.height == len(rows)
    con.close()


def test_a_row_missing_from_the_file_is_read_from_the_log_and_the_file_made_anew(tmp_path: Path) -> None:
    """A file cut short (a power loss after the database committed) loses rows the database
    trusts it with: the run that misses one reads the log instead, trusts the file no more, and
    the next run makes it anew."""
    con, rows = _two_runs(tmp_path)
    token, _ = _state(con)
    with sqlite3.connect(_path(con)) as lite:
        lite.execute("DELETE FROM rows WHERE seq IN (2, 3)")  # clk_0's lead and sale: in the closure
    assert _read_back(con, _covered(con)) is None
    assert job.run(con, at(days=40)).mode == "incremental"
    assert_same_as_full_run(con, at(days=40))
    assert con.execute("SELECT count(*) FROM rc_row_state").fetchall() == [(0,)]
    append(con, [{**b.click("clk_late", "p1"), "program_id": "prog_a"}], first_seq=len(rows) + 1)
    assert job.run(con, at(days=41)).mode == "incremental"
    assert _state(con)[0] != token and _state(con)[1] == len(rows) + 1
    got = _read_back(con, _covered(con))
    assert got is not None and got.height == len(rows) + 1
    con.close()


def test_rows_after_what_the_database_trusts_are_replaced(tmp_path: Path) -> None:
    """A run that added rows and did not commit leaves them after `upto_seq`; a database restored
    from an older copy may have other rows at those seqs: the next run deletes them first."""
    con, _ = _two_runs(tmp_path)
    with sqlite3.connect(_path(con)) as lite:
        lite.execute('INSERT INTO rows VALUES (19, \'{"3":"click","4":"prog_other"}\', x\'00\')')
        lite.execute("INSERT INTO rows VALUES (999, '{\"3\":\"click\"}', x'00')")
    assert job.run(con, at(days=40)).mode == "incremental"
    assert_same_as_full_run(con, at(days=40))
    got = _read_back(con, _covered(con))
    assert got is not None
    assert_frame_equal(got, read_linked(con, components.COVERED), check_exact=True)
    with sqlite3.connect(_path(con)) as lite:
        assert lite.execute("SELECT count(*) FROM rows WHERE seq = 999").fetchall() == [(0,)]
    con.close()


def test_another_databases_file_is_not_believed(tmp_path: Path) -> None:
    """A database copied with another database's row store beside it (or restored without its
    own) names a token the file does not hold: the file is made anew."""
    con, _ = _two_runs(tmp_path)
    (tmp_path / "other").mkdir()
    other, _ = _two_runs(tmp_path / "other")
    assert job.run(other, at(days=40)).mode == "incremental"
    theirs = _state(other)[0]
    other.close()
    ours = _state(con)[0]
    shutil.copyfile(tmp_path / "other" / f"tally.duckdb{rowstore.SUFFIX}", _path(con))
    assert job.run(con, at(days=40)).mode == "incremental"
    assert_same_as_full_run(con, at(days=40))
    assert _state(con)[0] not in (ours, theirs)
    con.close()


def test_an_in_memory_database_has_no_row_store() -> None:
    con = duckdb.connect(":memory:")
    assert rowstore.path_of(con) is None
    assert RowStore.open(con, 0) is None
    con.close()


def test_a_row_store_that_cannot_be_written_leaves_the_run_to_read_the_log(tmp_path: Path) -> None:
    """A path the file cannot be made at (here a folder; a full disk alike) never fails a run:
    it reads its closure from the log, and the database keeps trusting what it trusted."""
    con, _ = _two_runs(tmp_path)
    trusted = _state(con)
    path = _path(con)
    path.unlink()
    path.mkdir()
    assert job.run(con, at(days=40)).mode == "incremental"
    assert_same_as_full_run(con, at(days=40))
    assert _state(con) == trusted
    path.rmdir()
    assert job.run(con, at(days=41)).mode == "incremental"
    assert _state(con)[0] != trusted[0]
    con.close()


def test_a_closure_too_large_a_share_of_the_log_is_read_by_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `SHARE` of the log's rows a closure is read by a scan of the log (cheaper and smaller
    than that many lookups); under it, from the row store."""
    con, rows = _two_runs(tmp_path)
    scans: list[str] = []
    real = read_linked

    def counted(*args: Any, **kwargs: Any) -> pl.DataFrame:
        scans.append("scan")
        return real(*args, **kwargs)

    monkeypatch.setattr(incremental, "read_linked", counted)
    monkeypatch.setattr(rowstore, "SHARE", 0.01)  # 18 rows trusted: at most 0.18 rows
    assert job.run(con, at(days=40)).mode == "incremental"
    assert scans == ["scan"]
    assert_same_as_full_run(con, at(days=40))
    monkeypatch.setattr(rowstore, "SHARE", 1)
    append(con, [{**b.click("clk_late", "p1"), "program_id": "prog_a"}], first_seq=len(rows) + 1)
    assert job.run(con, at(days=41)).mode == "incremental"
    assert scans == ["scan"]
    assert_same_as_full_run(con, at(days=41))
    con.close()
