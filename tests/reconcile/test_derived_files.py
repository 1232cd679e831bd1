"""Derived files beside the database cannot change money (issue 48, item 3;
reconcile/run/derived.py): the row store (`<database>.rows`) and the column mirror's segments
(`<database>.mirror/`) corrupt, altered into other valid rows, cut short or of another database.
Each time the run succeeds, its books equal a run on the log alone, the bad file is set aside in
`<database>.rejected/` (not deleted), counted, and made anew; and a property damages both at
random."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from reconcile.run import components, derived, job, mirror, rowstore
from reconcile.run.rowstore import RowStore
from reconcile.run.source import read_linked
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.database import append, program_database, stream_file
from tests.reconcile.streams import Stream, profile, streams
from tests.reconcile.test_incremental import _split, assert_same_as_full_run

AMOUNT = rowstore.KEYS["amount"]


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row store serves every closure of these small logs, the mirror cuts small segments."""
    monkeypatch.setattr(rowstore, "SHARE", 1)
    monkeypatch.setattr(mirror, "MIN_ROWS", 2)
    monkeypatch.setattr(mirror, "SEGMENT_ROWS", 8)


def _two_runs(folder: Path) -> tuple[duckdb.DuckDBPyConnection, list[dict[str, Any]]]:
    """A database after a full run on half of a small log (row store and mirror written), the
    other half appended: the next run is incremental and reads every earlier row by seq."""
    folder.mkdir(parents=True, exist_ok=True)
    con = program_database(folder / "tally.duckdb", {"commission_bps": 2000, "holding_days": 30})
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


@contextmanager
def _lite(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to the row store, committed and closed after use."""
    with closing(sqlite3.connect(path)) as lite, lite:
        yield lite


def _rows_path(con: duckdb.DuckDBPyConnection) -> Path:
    path = rowstore.path_of(con)
    assert path is not None and path.is_file()
    return path


def _set_aside(con: duckdb.DuckDBPyConnection, kind: str) -> list[Path]:
    root = mirror.directory(con)
    assert root is not None
    rejected = derived.folder(root.with_suffix(""))
    found = sorted(rejected.glob(f"{kind}-*")) if rejected.is_dir() else []
    return [path for path in found if not path.name.endswith(("-wal", "-shm"))]  # SQLite's companions


def _token(con: duckdb.DuckDBPyConnection) -> str:
    ((token,),) = con.execute("SELECT token FROM rc_row_state").fetchall()
    return str(token)


def _store_equals_log(con: duckdb.DuckDBPyConnection) -> None:
    """The row store the database now trusts gives exactly the log's covered rows."""
    seqs = con.sql(f"SELECT seq FROM raw_events WHERE {components.COVERED}").pl().get_column("seq")
    high = int(con.execute("SELECT max(seq) FROM raw_events").fetchall()[0][0])
    store = RowStore.open(con, high)
    assert store is not None
    try:
        got = store.read(con, seqs)
    finally:
        store.close()
    assert got is not None
    assert_frame_equal(got, read_linked(con, components.COVERED), check_exact=True)


# -- the row store -------------------------------------------------------------------------------
def _alter_amount(path: Path) -> None:
    """sale_0 (seq 3) for 999,000 instead of 1,000: a valid row, its checksum left as it was."""
    with _lite(path) as lite:
        ((data,),) = lite.execute("SELECT data FROM rows WHERE seq = 3").fetchall()
        row = json.loads(data)
        assert row[AMOUNT] == 1000
        lite.execute("UPDATE rows SET data = ? WHERE seq = 3", [json.dumps({**row, AMOUNT: 999_000})])


def _garbage_row(path: Path) -> None:
    """Rows SQLite reads well whose data is not what the store writes (what made every
    reconcile a 500 on main)."""
    with _lite(path) as lite:
        lite.execute("UPDATE rows SET data = '{\"0\": [' WHERE seq = 3")
        lite.execute("UPDATE rows SET data = 'x' WHERE seq = 6")


def _corrupt_bytes(path: Path) -> None:
    """Every page after the first overwritten."""
    raw = path.read_bytes()
    path.write_bytes(raw[:4096] + b"\xa5" * (len(raw) - 4096))


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


@pytest.mark.parametrize("damage", [_alter_amount, _garbage_row, _corrupt_bytes, _truncate])
def test_a_damaged_row_store_is_set_aside_and_the_books_are_the_logs(tmp_path: Path, damage: Any) -> None:
    con, rows = _two_runs(tmp_path)
    token = _token(con)
    before = derived.rejected()["rows"]
    damage(_rows_path(con))
    assert job.run(con, at(days=40)).mode == "incremental"
    assert_same_as_full_run(con, at(days=40))
    assert len(_set_aside(con, "rows")) == 1
    assert derived.rejected()["rows"] == before + 1
    # made anew (by this run, or by the next when this one found out while reading)
    append(con, [{**b.click("clk_late", "p1"), "program_id": "prog_a"}], first_seq=len(rows) + 1)
    assert job.run(con, at(days=41)).mode == "incremental"
    assert_same_as_full_run(con, at(days=41))
    assert _token(con) != token
    _store_equals_log(con)
    assert len(_set_aside(con, "rows")) == 1
    con.close()


def test_another_databases_row_store_is_set_aside(tmp_path: Path) -> None:
    """A file of another database (valid rows, sealed with its own key, another token)."""
    con, _ = _two_runs(tmp_path / "ours")
    other, _ = _two_runs(tmp_path / "theirs")
    with _lite(_rows_path(other)) as lite:  # even one claiming our token
        lite.execute("UPDATE meta SET token = ?", [_token(con)])
    _alter_amount(_rows_path(other))
    other.close()
    ours = rowstore.path_of(con)
    assert ours is not None
    for forged in (True, False):  # the first time found by its rows, the second by its token
        shutil.copyfile(tmp_path / "theirs" / f"tally.duckdb{rowstore.SUFFIX}", ours)
        if not forged:
            with _lite(ours) as lite:
                lite.execute("UPDATE meta SET token = 'theirs'")
        before = derived.rejected()["rows"]
        assert job.run(con, at(days=40)).mode == "incremental"
        assert_same_as_full_run(con, at(days=40))
        assert derived.rejected()["rows"] == before + 1
        assert job.run(con, at(days=40)).mode == "incremental"  # trusts a file of its own again
    assert len(_set_aside(con, "rows")) == 2
    _store_equals_log(con)
    con.close()


def test_a_row_moved_to_another_seq_fails_its_checksum(tmp_path: Path) -> None:
    """sale_1's row (seq 6, sealed) copied over sale_0's (seq 3) with its checksum."""
    con, _ = _two_runs(tmp_path)
    with _lite(_rows_path(con)) as lite:
        ((data, mac),) = lite.execute("SELECT data, mac FROM rows WHERE seq = 6").fetchall()
        lite.execute("UPDATE rows SET data = ?, mac = ? WHERE seq = 3", [data, mac])
    assert job.run(con, at(days=40)).mode == "incremental"
    assert_same_as_full_run(con, at(days=40))
    assert len(_set_aside(con, "rows")) == 1
    con.close()


# -- the mirror ----------------------------------------------------------------------------------
def _segments(con: duckdb.DuckDBPyConnection) -> list[Path]:
    root = mirror.directory(con)
    assert root is not None
    names = con.execute("SELECT segment FROM rc_mirror ORDER BY after_seq").fetchall()
    return [root / str(name) for (name,) in names]


def _mirror_amount(path: Path) -> None:
    """Every sale's amount times 1,000: a valid segment of as many rows."""
    rows = pl.read_parquet(path)
    assert rows.get_column("amount").drop_nulls().len() > 0
    rows.with_columns(pl.col("amount") * 1000).write_parquet(path, compression="lz4", statistics=True)


def _mirror_bytes(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for offset in range(8, len(raw) - 8, 97):
        raw[offset] ^= 0x20
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [_mirror_amount, _mirror_bytes, _truncate])
def test_a_damaged_mirror_segment_is_set_aside_and_the_books_are_the_logs(
    tmp_path: Path, damage: Any
) -> None:
    con, _ = _two_runs(tmp_path)
    assert job.run(con, at(days=40), full=True).mode == "full"
    first = _segments(con)[0]
    before = derived.rejected()["mirror"]
    damage(first)
    assert job.run(con, at(days=40), full=True).mode == "full"
    assert_same_as_full_run(con, at(days=40))
    assert derived.rejected()["mirror"] == before + 1
    assert [path.name.endswith(first.name) for path in _set_aside(con, "mirror")] == [True]
    assert first not in _segments(con) and all(path.is_file() for path in _segments(con))
    con.close()


def test_another_databases_segment_is_set_aside(tmp_path: Path) -> None:
    con, _ = _two_runs(tmp_path / "ours")
    other, _ = _two_runs(tmp_path / "theirs")
    _mirror_amount(_segments(other)[0])  # their rows, other figures: same shape, same row count
    shutil.copyfile(_segments(other)[0], _segments(con)[0])
    other.close()
    assert job.run(con, at(days=40), full=True).mode == "full"
    assert_same_as_full_run(con, at(days=40))
    assert len(_set_aside(con, "mirror")) == 1
    con.close()


# -- both, at random -----------------------------------------------------------------------------
@st.composite
def _damages(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Up to 4 damages: (what, where, how much), applied to a file by `_damage`."""
    kinds = st.sampled_from(("flip", "cut", "zero", "amount", "swap", "delete"))
    return draw(st.lists(st.tuples(kinds, st.integers(0, 2**31), st.integers(1, 255)), max_size=4))


def _damage(path: Path, damages: list[tuple[str, int, int]], sqlite: bool) -> None:
    for what, where, much in damages:
        if not path.is_file():
            return
        if sqlite and what in ("amount", "swap", "delete"):
            with contextlib.suppress(sqlite3.DatabaseError), _lite(path) as lite:  # once cut, maybe not
                seqs = [s for (s,) in lite.execute("SELECT seq FROM rows ORDER BY seq").fetchall()]
                if not seqs:
                    continue
                seq, other = seqs[where % len(seqs)], seqs[(where // 7) % len(seqs)]
                if what == "delete":
                    lite.execute("DELETE FROM rows WHERE seq = ?", [seq])
                elif what == "swap":
                    lite.execute(
                        "UPDATE rows SET data = (SELECT data FROM rows WHERE seq = ?) WHERE seq = ?",
                        [other, seq],
                    )
                else:
                    ((data,),) = lite.execute("SELECT data FROM rows WHERE seq = ?", [seq]).fetchall()
                    row = json.loads(data)
                    row[AMOUNT] = int(row.get(AMOUNT) or 0) + much
                    lite.execute("UPDATE rows SET data = ? WHERE seq = ?", [json.dumps(row), seq])
            continue
        raw = bytearray(path.read_bytes())
        if not raw:
            continue
        at_ = where % len(raw)
        if what == "cut":
            raw = raw[:at_]
        elif what == "zero":
            raw[at_ : at_ + much] = bytes(len(raw[at_ : at_ + much]))
        elif what == "amount":  # a Parquet segment rewritten, its amounts changed (when it reads)
            try:
                rows = pl.read_parquet(path)
            except pl.exceptions.PolarsError:
                continue
            rows.with_columns(pl.col("amount") + much).write_parquet(path)
            continue
        else:
            raw[at_] ^= much
        path.write_bytes(bytes(raw))


@profile(6, ci=30)
@given(stream=streams(max_events=30), data=st.data())
def test_random_damage_to_derived_files_never_changes_the_books(stream: Stream, data: st.DataObject) -> None:
    """Whatever is done to the row store and the mirror's segments between runs, the next
    incremental run and the next full run succeed with exactly the log's books."""
    head, tail = _split(stream.rows, data.draw(st.integers(0, len(stream.rows)), label="cut"))
    with stream_file(stream) as con:
        append(con, head)
        job.run(con, at(days=20))
        rows = rowstore.path_of(con)
        assert rows is not None
        _damage(rows, data.draw(_damages(), label="rows"), sqlite=True)
        for segment in _segments(con) if "rc_mirror" in _tables(con) else []:
            _damage(segment, data.draw(_damages(), label="segment"), sqlite=False)
        append(con, tail, first_seq=len(head) + 1)
        job.run(con, stream.now)
        assert_same_as_full_run(con, stream.now)
        for segment in _segments(con) if "rc_mirror" in _tables(con) else []:
            _damage(segment, data.draw(_damages(), label="segment again"), sqlite=False)
        job.run(con, stream.now, full=True)
        assert_same_as_full_run(con, stream.now)


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    names = con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    return {str(name) for (name,) in names}
