"""Faults the storage layer must survive: values the columns cannot hold, an operation failing
half-way through its writes, a journal batch the database refuses, a full disk."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ingest.domain.errors import DatabaseUnavailable, ValidationFailed
from ingest.storage.contract import Tx
from ingest.storage.duckdb.copier import Batch as _Batch
from ingest.storage.duckdb.journal import Journal
from ingest.storage.duckdb.store import DuckStore
from ingest.storage.schema import RAW_EVENT_FIELDS
from ingest.writer import Writer
from tests.conftest import fill
from tests.helpers import journal_record, sale_row, sql_rows

AT = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)


def _append(row: dict[str, object], tx: Tx) -> int:
    return tx.append(row)


@pytest.mark.parametrize(
    ("field", "value"),
    [("amount", 2**63), ("amount", -(2**63) - 1), ("amount", 1.5), ("transaction_id", "in_\ud800")],
)
def test_a_value_the_columns_cannot_hold_is_refused_before_anything_is_stored(
    writer: tuple[DuckStore, Writer], field: str, value: object
) -> None:
    store, w = writer
    row = {**sale_row(1), field: value}
    with pytest.raises(ValidationFailed) as refused:
        w.run_sync(lambda tx: tx.append(row))
    assert refused.value.extra["fields"][0]["field"] == field
    assert w.run_sync(lambda tx: tx.append(sale_row(2))) == 1  # the sequence did not move either
    w.sync_blocking()
    assert sql_rows(store, "SELECT transaction_id FROM raw_events") == [("in_2",)]
    assert store.set_aside == 0


def test_an_operation_refused_after_writing_leaves_nothing_and_its_group_commits(
    writer: tuple[DuckStore, Writer],
) -> None:
    store, w = writer
    gate = threading.Event()

    def first(tx: Tx) -> int:
        gate.wait(5)
        return tx.append(sale_row(1))

    def half(tx: Tx) -> None:
        seq = tx.append(sale_row(2))
        tx.claim_keys("p", ["in_2"], seq)
        tx.log("p", AT, "track/sale", 200, "accepted", "x", None, seq)
        tx.check("p", "sale_received", AT)
        raise ValidationFailed("refused after writing")

    futures: list[Future[Any]] = [w.submit(first), w.submit(half)]
    futures.append(w.submit(lambda tx: tx.append(sale_row(3))))
    gate.set()
    assert futures[0].result() == 1
    with pytest.raises(ValidationFailed):
        futures[1].result()
    assert futures[2].result() == 2
    w.sync_blocking()
    assert sql_rows(store, "SELECT transaction_id, seq FROM raw_events ORDER BY seq") == [
        ("in_1", 1),
        ("in_3", 2),
    ]
    assert sql_rows(store, "SELECT count(*) FROM idempotency_keys") == [(0,)]
    assert sql_rows(store, "SELECT count(*) FROM tracking_log") == [(0,)]
    assert sql_rows(store, "SELECT count(*) FROM checklist") == [(0,)]
    assert store.sale("p", ["in_2"]) is None and store.checklist("p") == {}


def test_a_refusal_after_database_statements_rolls_back_only_that_operation(
    writer: tuple[DuckStore, Writer],
) -> None:
    store, w = writer
    gate = threading.Event()

    def first(tx: Tx) -> int:
        gate.wait(5)
        return tx.append(sale_row(1))

    def half(tx: Tx) -> None:
        tx.add_workspace("ws_half", "Half", AT)
        raise ValidationFailed("refused after a control-plane write")

    futures: list[Future[Any]] = [w.submit(first), w.submit(half)]
    gate.set()
    assert futures[0].result() == 1
    with pytest.raises(ValidationFailed):
        futures[1].result()
    w.sync_blocking()
    assert sql_rows(store, "SELECT count(*) FROM workspaces") == [(0,)]
    assert sql_rows(store, "SELECT transaction_id FROM raw_events") == [("in_1",)]


def test_a_journal_batch_the_database_refuses_is_set_aside_and_the_rest_flows(tmp_path: Path) -> None:
    db = tmp_path / "j.duckdb"
    DuckStore(db).close()
    journal = Journal(Path(f"{db}.journal"))
    journal.append(journal_record(1, [sale_row(1)]))
    journal.append(journal_record(2, [sale_row(2, amount="not a number")]))  # what DuckDB refuses
    bad_time = journal_record(3, [sale_row(3)])
    bad_time["raw"][0][RAW_EVENT_FIELDS.index("received_at")] = "year ten thousand"  # type: ignore[index]
    journal.append(bad_time)
    journal.append(journal_record(4, [sale_row(4)]))
    journal.close()

    store = DuckStore(db)  # start-up never fails on a journal row
    try:
        assert sql_rows(store, "SELECT transaction_id FROM raw_events ORDER BY seq") == [("in_1",), ("in_4",)]
        assert store.set_aside == 2
        kept = sorted(p.name for p in (Path(f"{db}.journal") / "set-aside").iterdir())
        assert kept == ["000000000002.json", "000000000003.json"]
        assert store.readiness() is None
    finally:
        store.close()
    reopened = DuckStore(db)  # and nothing is copied twice, nor set aside again
    try:
        assert sql_rows(reopened, "SELECT count(*) FROM raw_events") == [(2,)]
        assert reopened.set_aside == 0
    finally:
        reopened.close()


def test_a_journal_batch_whose_claim_is_already_taken_is_set_aside_not_retried(tmp_path: Path) -> None:
    """A batch holding an idempotency row the table already has (one sale acknowledged twice)
    breaks the table's primary key: the refusal is the data's, so the batch is set aside, at
    start-up and by the copier, and never mistaken for a resource fault retried for ever."""
    db = tmp_path / "k.duckdb"
    DuckStore(db).close()
    journal = Journal(Path(f"{db}.journal"))
    for number, txn in ((1, 1), (2, 1), (3, 3)):  # batch 2: in_1 accepted again, its claim too
        batch = journal_record(number, [sale_row(txn)])
        batch["keys"] = [["p", f"in_{txn}", number * 10]]
        journal.append(batch)
    journal.close()

    store = DuckStore(db)  # start-up never fails on a journal batch
    try:
        assert sql_rows(store, "SELECT seq, transaction_id FROM raw_events ORDER BY seq") == [
            (10, "in_1"),
            (30, "in_3"),
        ]
        assert sql_rows(store, "SELECT key, raw_seq FROM idempotency_keys ORDER BY key") == [
            ("in_1", 10),
            ("in_3", 30),
        ]
        assert store.set_aside == 1
        assert sorted(p.name for p in (Path(f"{db}.journal") / "set-aside").iterdir()) == [
            "000000000002.json"
        ]
        assert store.readiness() is None
        # The copier, while serving: the same refusal is set aside and the batch behind it flows.
        store._journal_batch(_Batch([], [], [("p", "in_3", 40)], []))
        store._journal_batch(_Batch([], [], [("p", "in_5", 50)], []))
        store.flush()
        assert store.set_aside == 2
        assert sql_rows(store, "SELECT key FROM idempotency_keys ORDER BY key") == [
            ("in_1",),
            ("in_3",),
            ("in_5",),
        ]
        assert store.readiness() is None
    finally:
        store.close()
    reopened = DuckStore(db)
    try:
        assert reopened.set_aside == 0
        assert sql_rows(reopened, "SELECT count(*) FROM idempotency_keys") == [(3,)]
    finally:
        reopened.close()


def test_a_full_disk_is_database_unavailable_and_recovers_by_itself(small_disk: Path) -> None:
    store = DuckStore(small_disk / "d.duckdb")
    w = Writer(store)
    w.start()
    try:
        acked = ["in_0"]
        assert w.run_sync(lambda tx: tx.append(sale_row(0))) == 1
        filler = fill(small_disk)
        segments = len(list((small_disk / "d.duckdb.journal").glob("*.log")))
        refused = 0
        for n in range(1, 200):  # the open segment's last page may still take a few records
            try:
                w.run_sync(partial(_append, sale_row(n)))
                acked.append(f"in_{n}")
            except DatabaseUnavailable:
                refused += 1
        assert refused > 150
        assert store.readiness() is not None
        # failed writes neither tear the segment nor make new ones
        assert len(list((small_disk / "d.duckdb.journal").glob("*.log"))) == segments
        os.unlink(filler)
        assert store.readiness() is None
        w.run_sync(lambda tx: tx.append(sale_row(200)))
        acked.append("in_200")
        w.sync_blocking()
        stored = [r[0] for r in sql_rows(store, "SELECT transaction_id FROM raw_events ORDER BY seq")]
        assert stored == acked
    finally:
        w.stop()
        store.close()
    reopened = DuckStore(small_disk / "d.duckdb")
    try:
        assert sql_rows(reopened, "SELECT count(*) FROM raw_events") == [(len(acked),)]
    finally:
        reopened.close()
