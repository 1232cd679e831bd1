"""The key index (ingest/hotkeys.py): the hot path's decisions live on disk, survive restarts
without a replay of the log, catch up after a crash between the journal and the index, and
are rebuilt when they do not match the log beside them."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ingest.domain.keys import claims_of
from ingest.domain.records import SaleLedger
from ingest.storage.contract import Needs
from ingest.storage.duckdb import keys as hotkeys
from ingest.storage.duckdb.keys import KeyIndex
from ingest.storage.duckdb.store import DuckStore, index_keys
from tests.helpers import STORE_AT


def _row(kind: str, n: int, **fields: Any) -> dict[str, Any]:
    return {
        "received_at": STORE_AT + timedelta(seconds=n),
        "source": "stripe" if kind == "stripe" else "track",
        "kind": kind,
        "program_id": "p",
        "outcome": "accepted",
        "event_id": f"{kind}_{n}",
        "body": "{}",
        "headers": "{}",
        **fields,
    }


def _history() -> list[dict[str, Any]]:
    """A click, a settled lead on it, a sale, a partial refund, a processor sale of the same
    invoice, a provisional lead, a retried duplicate (ignored) and a click re-pointed."""
    return [
        _row("click", 1, click_id="clk_1", partner_code="ann"),
        _row("lead", 2, customer_key="c1", click_id="clk_1", lead_status="settled"),
        _row("sale", 3, transaction_id="in_1", customer_key="c1", amount=1000, currency="usd"),
        _row("refund", 4, transaction_id="in_1", refund_id="re_1", amount=300),
        _row(
            "stripe",
            5,
            event_id="evt_1",
            event_type="invoice.paid",
            invoice_id="in_1",
            payment_intent_id="pi_1",
            amount=1000,
            currency="usd",
        ),
        _row("lead", 6, customer_key="c2", click_id="clk_2", lead_status="provisional"),
        _row("sale", 7, transaction_id="in_2", customer_key="c2", amount=5, outcome="duplicate"),
        _row("click", 8, click_id="clk_2", partner_code="bob"),
        _row("click", 9, click_id="clk_1", partner_code="cat"),
    ]


def _write(store: DuckStore, rows: list[dict[str, Any]]) -> None:
    tx = store.begin()
    for row in rows:
        seq = tx.append(row)
        for program, key in claims_of(row):  # what ingest claims for such a row
            tx.claim_keys(program, [key], seq)
    tx.commit()


def _decisions(store: DuckStore, counts: bool = True) -> dict[str, Any]:
    """Every answer the index gives (with `counts`, its tables' sizes: that flushes it)."""
    ledger = store.sale("p", ["pi_1"])
    answers = {
        "clk_1": store.click_partner("p", "clk_1"),
        "clk_2": store.click_partner("p", "clk_2"),
        "c1": store.binding("p", "c1"),
        "c2": store.provisional_click("p", "c2"),
        "in_2": store.sale("p", ["in_2"]),
        "pi_1": (ledger.amount, ledger.currency, ledger.refunded) if ledger else None,
        "re_1": store.refund_seen("p", "re_1"),
        "evt_1": store.event_seen("evt_1"),
    }
    if counts:
        answers["counts"] = store.keys.counts()
    return answers


EXPECTED: Mapping[str, Any] = {
    "clk_1": "cat",  # the latest click with an id wins
    "clk_2": "bob",
    "c2": (True, "clk_2"),
    "in_2": None,  # a duplicate row decides nothing
    "pi_1": (1000, "usd", 300),  # one sale known by its invoice and its payment intent
    "re_1": True,
    "evt_1": True,
}


def _check(decisions: Mapping[str, Any]) -> None:
    assert {k: decisions[k] for k in EXPECTED} == EXPECTED
    binding = decisions["c1"]
    assert (binding.click_id, binding.partner_code) == ("clk_1", "ann")  # the click as of the lead


def test_decisions_survive_a_restart_without_replaying_the_log(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    store = DuckStore(db)
    _write(store, _history())
    before = _decisions(store)
    _check(before)
    store.close()
    applied: list[int] = []
    reopened = DuckStore(db, on_progress=lambda done, total: applied.append(done))
    try:
        assert applied == []  # nothing replayed: the index was level with the log
        assert _decisions(reopened) == before
        assert reopened.keys.claimed("p", "sale:in_1") and not reopened.keys.claimed("p", "sale:in_2")
    finally:
        reopened.close()


def test_a_lost_index_is_rebuilt_from_the_log_with_the_same_decisions(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    store = DuckStore(db)
    _write(store, _history())
    before = _decisions(store)
    store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}.keys{suffix}").unlink(missing_ok=True)
    assert index_keys(db) == len(_history())
    reopened = DuckStore(db)
    try:
        after = _decisions(reopened)
        # claims are derived from the accepted rows as ingest made them (hotkeys.claims_of),
        # so a claim alone still refuses a duplicate after a rebuild
        assert after == before
        assert after["counts"]["claims"] > 0
    finally:
        reopened.close()


def test_a_failed_index_commit_keeps_the_batch_and_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch is durable in the journal before the index commits; if the index then
    cannot commit, the batch still stands and the index catches up before the next write."""
    store = DuckStore(tmp_path / "t.duckdb")
    try:
        history = _history()
        _write(store, history[:3])
        real_commit = KeyIndex.commit

        def failing(self: KeyIndex, last_seq: int | None, anchor: str) -> None:
            self.rollback()
            raise OSError("no space left on device")

        monkeypatch.setattr(KeyIndex, "commit", failing)
        _write(store, history[3:])  # acknowledged: the journal has it
        monkeypatch.setattr(KeyIndex, "commit", real_commit)
        assert not store.event_seen("evt_1")  # the index lags the log...
        store.begin().rollback()  # ...until the next write catches it up
        _check(_decisions(store))
    finally:
        store.close()


def test_an_index_that_does_not_match_its_log_is_rebuilt(tmp_path: Path) -> None:
    """A database restored from a backup beside a newer index: the index leads the log (or
    names another row at its position), so it is rebuilt rather than trusted."""
    db = tmp_path / "t.duckdb"
    store = DuckStore(db)
    history = _history()
    _write(store, history[:4])
    store.close()
    shutil.copy(db, tmp_path / "backup.duckdb")
    store = DuckStore(db)
    _write(store, history[4:])
    store.close()
    shutil.copy(tmp_path / "backup.duckdb", db)  # restore the backup; the newer index stays
    restored = DuckStore(db)
    try:
        assert not restored.event_seen("evt_1")  # not in the restored log: not a duplicate
        assert restored.keys.position()[0] == 4
        ledger = restored.sale("p", ["in_1"])
        assert ledger is not None and ledger.refunded == 300
    finally:
        restored.close()


def test_a_failed_operation_leaves_no_keys_behind(tmp_path: Path) -> None:
    store = DuckStore(tmp_path / "t.duckdb")
    try:
        history = _history()
        tx = store.begin()
        tx.append(history[0])
        mark = tx.mark()
        tx.append(history[2])
        assert tx.claim_keys("p", ["in_1"], 2) == ["in_1"]
        assert tx.claim_keys("p", ["in_1"], 2) == []  # the second claim learns it from the write
        assert store.sale("p", ["in_1"]) is not None  # the transaction sees its own writes
        assert tx.release(mark)
        tx.commit()
        assert store.sale("p", ["in_1"]) is None
        assert not store.keys.claimed("p", "in_1")
        assert store.click_partner("p", "clk_1") == "ann"
    finally:
        store.close()


def test_catching_up_reads_the_database_and_then_the_journal(tmp_path: Path) -> None:
    """The rows a catch-up replays: those after the index's position that the copier has moved
    into DuckDB, then those only in the journal, each once and in order."""
    store = DuckStore(tmp_path / "t.duckdb")
    try:
        history = _history()
        _write(store, history[:6])
        store.flush()  # rows 1-6 in DuckDB
        _write(store, history[6:])  # rows 7-9 in the journal only
        assert store.backlog()[0] > 0
        assert [row["seq"] for row in store._raw_after(4)] == [5, 6, 7, 8, 9]
        assert [row["seq"] for row in store._raw_after(7)] == [8, 9]
        assert [row["event_id"] for row in store._raw_after(8)] == ["click_9"]
    finally:
        store.close()


def test_a_failed_flush_drops_the_sealed_writes_and_catches_up_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committed writes wait in memory before they go to the index file. If writing them
    fails, they are all dropped and the log replays them: each row counts once (a refund
    replayed on top of a sealed one would count twice)."""
    monkeypatch.setattr(hotkeys, "FLUSH_SECONDS", 3600.0)
    monkeypatch.setattr(hotkeys, "FLUSH_ROWS", 1_000)
    store = DuckStore(tmp_path / "t.duckdb")
    try:
        history = _history()
        _write(store, history[:3])  # sealed, not in the file
        assert store.keys.position()[0] == 0
        real_flush = KeyIndex._flush

        def failing(self: KeyIndex) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(KeyIndex, "_flush", failing)
        monkeypatch.setattr(hotkeys, "FLUSH_ROWS", 1)
        _write(store, history[3:5])  # the refund and the processor sale: acknowledged (journal)
        monkeypatch.setattr(KeyIndex, "_flush", real_flush)
        monkeypatch.setattr(hotkeys, "FLUSH_ROWS", 1_000)
        assert store.sale("p", ["in_1"]) is None  # every sealed write is gone...
        store.begin().rollback()  # ...until the next write replays the log after the file's position
        ledger = store.sale("p", ["pi_1"])
        assert ledger is not None and (ledger.amount, ledger.refunded) == (1000, 300)
        _write(store, history[5:])
        _check(_decisions(store))
    finally:
        store.close()


def test_sealed_writes_lost_in_a_crash_are_replayed_from_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash loses the writes not yet in the index file; the next start replays the raw rows
    after the file's position, and every decision is the same."""
    monkeypatch.setattr(hotkeys, "FLUSH_SECONDS", 3600.0)
    history = _history()
    db = tmp_path / "t.duckdb"
    store = DuckStore(db)
    _write(store, history[:4])
    store.keys.flush()  # rows 1-4 in the file
    _write(store, history[4:])  # rows 5-9 sealed only
    answers = _decisions(store, counts=False)
    store.keys.discard()  # what a crash loses (the journal and DuckDB keep every row)
    store.close()
    applied: list[int] = []
    reopened = DuckStore(db, on_progress=lambda done, total: applied.append(done))
    try:
        assert applied[-1] == len(history) - 4  # the rows after the file's position, once
        assert _decisions(reopened, counts=False) == answers
        _check(_decisions(reopened))
    finally:
        reopened.close()


class _PrefetchFails:
    """A key index's writer connection whose prefetch statements raise `error` (the rest pass)."""

    def __init__(self, con: sqlite3.Connection, error: Exception) -> None:
        self._con, self._error = con, error

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if any(part in sql for part in hotkeys._PREFETCH.values()):  # (one statement, of parts)
            raise self._error
        return self._con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


@pytest.mark.parametrize("failure", ["unencodable key", "statement error"])
def test_a_failed_prefetch_leaves_no_key_read_as_absent(tmp_path: Path, failure: str) -> None:
    """A group's read-ahead that raises (a key its statement cannot carry, or SQLite failing)
    notes nothing: the operations replayed after it still find the keys the file holds, so a
    re-posted sale is not claimed a second time."""
    kx = KeyIndex(tmp_path / "k.keys")
    try:
        kx.begin()
        sale = _row("sale", 1, transaction_id="in_1", customer_key="c1", amount=1000, currency="usd")
        kx.observe(sale)
        assert kx.claim("p", "in_1")
        kx.commit(1, hotkeys.anchor_of(sale["received_at"]), force=True)  # in the file
        repost = Needs(claims=(("p", "in_1"),), sales=(("p", "in_1"),))
        group = [repost]
        kx.begin()
        error: type[Exception]
        if failure == "unencodable key":  # a lone surrogate, as a JSON `\ud800` escape gives
            group.append(Needs(claims=(("p", "evt_\ud800_1"),), events=("evt_\ud800_1",)))
            error = TypeError
        else:
            kx._w = _PrefetchFails(kx._w, sqlite3.OperationalError("disk I/O error"))  # type: ignore[assignment]
            error = sqlite3.OperationalError
        with pytest.raises(error):
            kx.prefetch(group)
        if isinstance(kx._w, _PrefetchFails):
            kx._w = kx._w._con
        kx.rollback()
        kx.begin()  # the writer replays the group's operations one by one
        kx.prefetch([repost])
        assert not kx.claim("p", "in_1")  # taken: the re-post is a duplicate
        assert kx.sale("p", ["in_1"]) == SaleLedger(1000, "usd", 0)
        kx.rollback()
    finally:
        kx.close()


class _NoStatements:
    """A key index's writer connection after the read-ahead: any statement fails the test."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        raise AssertionError(f"a lookup went to SQLite after the read-ahead: {sql}")


def test_one_read_ahead_finds_every_table_in_the_file(tmp_path: Path) -> None:
    """A group needing keys of every table reads them in one statement, and its lookups then
    answer, found and absent alike, without another."""
    kx = KeyIndex(tmp_path / "k.keys")
    try:
        kx.begin()
        history = _history()
        for row in history:
            kx.observe(row)
            for claim in claims_of(row):
                kx.claim(*claim)  # (the processor's sale of in_1 finds it taken)
        kx.commit(len(history), hotkeys.anchor_of(history[-1]["received_at"]), force=True)  # in the file
        for seen in kx._seen.values():
            seen.clear()
        group = [
            Needs(
                claims=(("p", "sale:in_1"), ("p", "sale:in_new")),
                sales=(("p", "in_1"), ("p", "in_new")),
                clicks=(("p", "clk_1"), ("p", "clk_none")),
                bindings=(("p", "c1"), ("p", "c_none")),
                provisional=(("p", "c2"), ("p", "c_none")),
                refunds=(("p", "re_1"), ("p", "re_none")),
                events=("evt_1", "evt_none"),
            )
        ]
        expected = (
            kx.claimed("p", "sale:in_1"),
            kx.sale("p", ["in_1"]),
            kx.click_partner("p", "clk_1"),
            kx.binding("p", "c1"),
            kx.provisional_click("p", "c2"),
            kx.refund_seen("p", "re_1"),
            kx.event_seen("evt_1"),
        )
        kx.begin()
        statements: list[str] = []
        kx._w.set_trace_callback(statements.append)
        kx.prefetch(group)
        kx._w.set_trace_callback(None)
        assert len(statements) == 1
        writer, kx._w = kx._w, _NoStatements(kx._w)  # type: ignore[assignment]
        try:
            found = (
                kx.claimed("p", "sale:in_1"),
                kx.sale("p", ["in_1"]),
                kx.click_partner("p", "clk_1"),
                kx.binding("p", "c1"),
                kx.provisional_click("p", "c2"),
                kx.refund_seen("p", "re_1"),
                kx.event_seen("evt_1"),
            )
            absent = (
                kx.claimed("p", "sale:in_new"),
                kx.sale("p", ["in_new"]),
                kx.click_partner("p", "clk_none"),
                kx.binding("p", "c_none"),
                kx.provisional_click("p", "c_none"),
                kx.refund_seen("p", "re_none"),
                kx.event_seen("evt_none"),
            )
        finally:
            kx._w = writer
        assert found == expected
        assert found[1] is not None and found[2] is not None and found[3] is not None
        assert all(found[i] for i in (0, 5))
        assert absent == (False, None, None, None, (False, None), False, False)
        kx.rollback()
    finally:
        kx.close()
