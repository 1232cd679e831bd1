"""The group-commit writer: batching, isolation of a failing operation, and the duplicate race."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import duckdb
import pytest

from ingest.domain.clock import utcnow
from ingest.domain.errors import ValidationFailed
from ingest.storage.contract import Tx
from ingest.storage.duckdb.store import DuckStore
from ingest.writer import Writer
from tests.conftest import World
from tests.helpers import sql_rows


def _row(n: int) -> dict[str, object]:
    return {
        "received_at": utcnow(),
        "source": "track",
        "kind": "click",
        "program_id": "p",
        "outcome": "accepted",
        "event_id": f"clk_{n}",
        "click_id": f"clk_{n}",
        "partner_code": "a",
        "body": "{}",
        "headers": "{}",
    }


def test_concurrent_operations_share_commits(writer: tuple[DuckStore, Writer]) -> None:
    store, w = writer
    gate = threading.Event()

    def slow(tx: Tx) -> int:
        gate.wait(5)
        return tx.append(_row(0))

    first = w.submit(slow)
    rest = [w.submit(lambda tx, n=n: tx.append(_row(n))) for n in range(1, 50)]
    gate.set()
    seqs = [first.result(), *(f.result() for f in rest)]
    assert seqs == list(range(1, 51))
    assert w.commits <= 3  # the 49 queued behind the slow one commit together
    w.sync_blocking()
    assert sql_rows(store, "SELECT count(*) FROM raw_events") == [(50,)]


def test_domain_error_fails_only_its_operation(writer: tuple[DuckStore, Writer]) -> None:
    _store, w = writer

    def refuse(tx: Tx) -> None:
        raise ValidationFailed("no")

    futures = [
        w.submit(lambda tx: tx.append(_row(1))),
        w.submit(refuse),
        w.submit(lambda tx: tx.append(_row(2))),
    ]
    assert futures[0].result() == 1 and futures[2].result() == 2
    with pytest.raises(ValidationFailed):
        futures[1].result()


def test_unexpected_failure_is_isolated_and_rolled_back(writer: tuple[DuckStore, Writer]) -> None:
    store, w = writer
    gate = threading.Event()

    def blocker(tx: Tx) -> int:
        gate.wait(5)
        return tx.append(_row(1))

    def broken(tx: Tx) -> None:
        tx.append(_row(99))
        tx.add_workspace("ws_twice", "first", datetime(2026, 1, 1, tzinfo=UTC))
        tx.add_workspace("ws_twice", "again", datetime(2026, 1, 1, tzinfo=UTC))  # its primary key refuses

    f1 = w.submit(blocker)
    f2 = w.submit(broken)
    f3 = w.submit(lambda tx: tx.append(_row(3)))
    gate.set()
    assert f1.result() == 1
    with pytest.raises(duckdb.ConstraintException, match="ws_twice"):
        f2.result()
    assert f3.result() == 2
    w.sync_blocking()
    assert sql_rows(store, "SELECT event_id FROM raw_events ORDER BY seq") == [("clk_1",), ("clk_3",)]
    assert store.click_partner("p", "clk_99") is None  # the key index was rolled back with the database


def test_concurrent_duplicate_sales_exactly_one_wins(world: World) -> None:
    body = {"transaction_id": "in_race", "customer_external_id": "c", "amount": 100}

    def post(_: int) -> int:
        return world.client.post("/api/v1/track/sale", json=body, headers=world.key).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = sorted(pool.map(post, range(40)))
    assert codes == [200] + [409] * 39
    world.client.app.state.tally.writer.sync_blocking()  # type: ignore[attr-defined]
    store = world.client.app.state.tally.store  # type: ignore[attr-defined]
    assert sql_rows(
        store, "SELECT outcome, count(*) FROM raw_events WHERE kind='sale' GROUP BY 1 ORDER BY 1"
    ) == [("accepted", 1), ("duplicate", 39)]
    assert sql_rows(store, "SELECT count(*) FROM idempotency_keys WHERE key = 'sale:in_race'") == [(1,)]
