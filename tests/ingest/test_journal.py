"""The write-ahead journal: acknowledged batches survive a crash before they reach DuckDB."""

from __future__ import annotations

import json
import os
import struct
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ingest.storage.contract import Tx
from ingest.storage.duckdb.journal import Journal
from ingest.storage.duckdb.store import DuckStore
from ingest.storage.schema import RAW_EVENT_FIELDS
from ingest.writer import Writer
from tests.helpers import sql_rows

AT = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)


def _click(n: int) -> dict[str, object]:
    return {
        "received_at": AT,
        "source": "track",
        "kind": "click",
        "program_id": "p",
        "outcome": "accepted",
        "event_id": f"clk_{n}",
        "click_id": f"clk_{n}",
        "partner_code": "a",
        "occurred_at": AT,
        "body": f'{{"n": {n}}}',
        "headers": "{}",
    }


def test_records_round_trip_and_torn_tail_is_ignored(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    journal.append({"batch": 1, "raw": [[1, AT, "x", None, True]]})
    journal.append({"batch": 2, "raw": []})
    journal.close()
    [segment] = journal.segments()
    with segment.open("ab") as fh:
        fh.write(b"\x00\x00\x01\x00garbage")  # a write cut short by a crash
    reopened = Journal(tmp_path / "j")
    assert list(reopened.records()) == [
        {"batch": 1, "raw": [[1, AT.isoformat(), "x", None, True]]},
        {"batch": 2, "raw": []},
    ]
    reopened.append({"batch": 3, "raw": []})  # appends go to a new segment, after the torn one
    assert [r["batch"] for r in reopened.records()] == [1, 2, 3]
    closed = reopened.rotate()
    assert len(closed) == 2  # the segment with batches 1-2 and the one with batch 3
    Journal.remove(closed)
    assert list(reopened.records()) == []
    reopened.close()


def test_the_next_segment_is_made_ahead_and_never_taken_for_a_closed_one(tmp_path: Path) -> None:
    """The copier makes the next segment before it takes the writer's lock (`prepare`); the
    rotation then switches to it, and a segment made ahead is never handed back as closed (the
    copier deletes those)."""
    journal = Journal(tmp_path / "j")
    journal.append({"batch": 1, "raw": []})
    journal.prepare()
    journal.prepare()  # once is enough
    first, ahead = journal.segments()
    assert ahead.stat().st_size == 0
    assert journal.rotate() == [first]
    assert journal.segments() == [first, ahead]  # the rotation made no file: it took the one ahead
    Journal.remove([first])
    journal.prepare()
    assert journal.rotate() == []  # nothing appended: no rotation, and the one ahead is not closed
    journal.append({"batch": 2, "raw": []})
    [current, next_one] = journal.segments()
    assert (current, next_one.stat().st_size) == (ahead, 0)
    journal.close()  # a crash, with an empty segment made ahead
    again = Journal(tmp_path / "j")
    assert [r["batch"] for r in again.records()] == [2]
    again.append({"batch": 3, "raw": []})  # after the empty one
    assert [r["batch"] for r in again.records()] == [2, 3]
    assert again.rotate() == [current, next_one, again.segments()[2]]
    again.close()


def test_journaled_batches_are_recovered_after_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "crash.duckdb"
    store = DuckStore(db)
    for n in range(5):  # what the writer thread does for each group commit
        tx = store.begin()
        tx.append(_click(n))
        tx.commit()
    # acknowledged, journaled, not yet copied into DuckDB
    assert store.backlog()[0] == 5
    assert sql_rows(store, "SELECT count(*) FROM raw_events") == [(0,)]
    # crash: the process dies without flushing or closing anything (and its lock goes with it)
    store._con.close()
    store._unclaim()
    reopened = DuckStore(db)
    assert sql_rows(reopened, "SELECT seq, event_id, received_at FROM raw_events ORDER BY seq") == [
        (n + 1, f"clk_{n}", AT) for n in range(5)
    ]
    assert reopened.click_partner("p", "clk_4") == "a"
    assert reopened.backlog() == (0, 0.0)
    assert list(Journal(tmp_path / "crash.duckdb.journal").records()) == []
    reopened.close()


def test_batches_already_in_duckdb_are_not_copied_twice(tmp_path: Path) -> None:
    db = tmp_path / "twice.duckdb"
    store = DuckStore(db)
    tx = store.begin()
    tx.append(_click(1))
    tx.commit()
    store.flush()
    # a crash between DuckDB's commit and the journal's truncation leaves the batch in both
    journal = Journal(Path(f"{db}.journal"))
    journal.append(
        {
            "batch": 1,
            "raw": [list(sql_rows(store, "SELECT * FROM raw_events")[0])],
            "logs": [],
            "keys": [],
            "checks": [],
        }
    )
    journal.close()
    store._con.close()
    store._unclaim()
    reopened = DuckStore(db)
    assert sql_rows(reopened, "SELECT count(*) FROM raw_events") == [(1,)]
    reopened.close()


def test_control_plane_and_journal_commits_coexist(tmp_path: Path) -> None:
    store = DuckStore(tmp_path / "cp.duckdb")
    writer = Writer(store)
    writer.start()
    writer.run_sync(lambda tx: tx.append(_click(1)))

    def control(tx: Tx) -> None:
        tx.add_workspace("ws_1", "W", AT)

    writer.run_sync(control)
    writer.sync_blocking()
    assert sql_rows(store, "SELECT count(*) FROM raw_events") == [(1,)]
    assert sql_rows(store, "SELECT count(*) FROM workspaces") == [(1,)]
    writer.stop()
    store.close()


def test_a_journal_in_the_earlier_tagged_layout_is_still_recovered(tmp_path: Path) -> None:
    """Journals written before datetimes became plain ISO strings tagged them `{"$t": ...}`; a
    server upgraded over an uncopied journal must still copy it."""
    db = tmp_path / "old.duckdb"
    DuckStore(db).close()
    row = {**_click(7), "seq": 1, "test_mode": False}
    old_row = [
        {"$t": v.isoformat()} if isinstance(v, datetime) else v
        for v in (row.get(f) for f in RAW_EVENT_FIELDS)
    ]
    payload = json.dumps({"batch": 1, "raw": [old_row], "logs": [], "keys": [], "checks": []}).encode()
    journal_dir = Path(f"{db}.journal")
    (journal_dir / "000000000099.log").write_bytes(
        struct.pack(">II", len(payload), zlib.crc32(payload)) + payload
    )
    reopened = DuckStore(db)
    assert sql_rows(reopened, "SELECT seq, event_id, received_at FROM raw_events") == [(1, "clk_7", AT)]
    reopened.close()


def test_a_short_write_fails_the_batch_and_later_batches_stay_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path / "j")
    journal.append({"batch": 1, "raw": []})
    real_write = os.write

    def half(fd: int, data: bytes) -> int:  # the disk filled up mid-record
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(OSError, match="journal write failed"):
        journal.append({"batch": 2, "raw": [[1, "x" * 100]]})
    monkeypatch.setattr(os, "write", real_write)
    journal.append({"batch": 3, "raw": []})
    assert [r["batch"] for r in journal.records()] == [1, 3]
    journal.close()
