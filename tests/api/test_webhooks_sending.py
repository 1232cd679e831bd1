"""How attempts are made and recorded (api/outbound/sending.py, ingest/webhooks_out/journal.py):

- the attempt file of the embedded database: attempts appended survive the process (they are
  read back by another), a torn last line is skipped, a recording that fails leaves the file as
  it was, and recording an attempt twice changes the delivery once;
- the sending process that `tally serve` uses: it signs and sends a group, records each attempt
  in the file, and a sending process that is killed mid-group is started again, with every
  delivery sent (only the one under way at the kill may come twice) and none left waiting for
  its lease to run out; one that hangs is ended when its group has had its time.
"""

from __future__ import annotations

import contextlib
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from standardwebhooks.webhooks import Webhook
from starlette.testclient import TestClient

from api.outbound import sending, worker
from api.outbound.sending import ProcessSender
from api.outbound.worker import Deliverer
from api.settings import Settings
from ingest.storage.sql import DuckExecutor
from ingest.webhooks_out import outbox
from ingest.webhooks_out.journal import AttemptJournal
from tests.conftest import make_world
from tests.processes import wait_until
from tests.receiver import Receiver

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _attempt(n: int, ok: bool = True, prior: int = 0) -> outbox.Attempt:
    outcome = outbox.Outcome(ok, 204 if ok else 500, 3, "", None if ok else "HTTP 500")
    return outbox.Attempt(
        f"whd_{n}", "we_1", prior, False, outcome, NOW, None if ok else NOW + timedelta(minutes=1)
    )


def test_the_attempt_file_keeps_attempts_until_they_are_recorded(tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb.webhooks"
    first = AttemptJournal(path)
    first.append([_attempt(1), _attempt(2, ok=False)])
    first.append([_attempt(3)])
    first.close()
    again = AttemptJournal(path)  # another process after a crash
    assert again.has_any()
    with path.open("ab") as f:
        f.write(b'{"d": "whd_4", "e": "we_')  # a write cut short by a crash
    taken: list[list[outbox.Attempt]] = []
    assert again.take(taken.append) == 3
    assert taken == [[_attempt(1), _attempt(2, ok=False), _attempt(3)]]
    assert not again.has_any() and path.stat().st_size == 0
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_recording_that_fails_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    journal = AttemptJournal(tmp_path / "x.webhooks")
    journal.append([_attempt(1)])

    def failing(_: list[outbox.Attempt]) -> None:
        raise RuntimeError("the database is away")

    with pytest.raises(RuntimeError):
        journal.take(failing)
    taken: list[list[outbox.Attempt]] = []
    assert journal.take(taken.append) == 1 and taken == [[_attempt(1)]]


def _pings(client: TestClient, url: str, count: int) -> tuple[Any, str, str]:
    world = make_world(client)
    base = f"/api/v1/programs/{world.program_id}/webhook-endpoints"
    made = client.post(base, json={"url": url, "events": ["ping"]}, headers=world.owner).json()["data"]
    for _ in range(count):
        assert client.post(f"{base}/{made['endpoint_id']}/ping", headers=world.owner).status_code == 202
    return world, str(made["endpoint_id"]), str(made["secret"])


def _statuses(client: TestClient, world: Any, endpoint_id: str) -> list[str]:
    path = f"/api/v1/programs/{world.program_id}/webhook-endpoints/{endpoint_id}/deliveries"
    return [d["status"] for d in client.get(path, headers=world.owner).json()["data"]]


def test_recording_an_attempt_twice_changes_the_delivery_once(
    app_client: TestClient, receiver: Receiver
) -> None:
    world, endpoint_id, _ = _pings(app_client, receiver.url, 1)
    store = app_client.app.state.tally.store  # type: ignore[attr-defined]
    deliverer = Deliverer(store, True)
    [claimed] = deliverer._claim([])
    attempt = outbox.Attempt.of(claimed, outbox.Outcome(True, 204, 3, "", None), NOW, None)
    with store.outbox() as db:
        outbox.record(db, [attempt], NOW - timedelta(days=5))
        outbox.record(db, [attempt], NOW - timedelta(days=5))  # the file read again after a crash
    path = f"/api/v1/programs/{world.program_id}/webhook-endpoints/{endpoint_id}/deliveries"
    [row] = app_client.get(path, headers=world.owner).json()["data"]
    assert row["status"] == "succeeded" and row["attempt"] == 1 and len(row["attempt_log"]) == 1


def test_the_sending_process_sends_signs_and_records_a_group(
    app_client: TestClient, receiver: Receiver
) -> None:
    world, endpoint_id, secret = _pings(app_client, receiver.url, 12)
    store = app_client.app.state.tally.store  # type: ignore[attr-defined]
    deliverer = Deliverer(store, True, own_process=True, poll_seconds=0.05)
    deliverer.start()
    try:
        wait_until(
            lambda: _statuses(app_client, world, endpoint_id) == ["succeeded"] * 12, "12 deliveries", 60, 0.1
        )
        assert isinstance(deliverer.sender, ProcessSender) and deliverer.sender.pid != os.getpid()
    finally:
        deliverer.stop()
    assert len(receiver.received) == 12
    for got in receiver.received:
        assert Webhook(secret).verify(got.body, got.headers)["type"] == "ping"
    if store.attempt_journal() is not None:  # the embedded database: the child sent the group
        assert not store.attempt_journal().stat().st_size  # every attempt is in the database


@pytest.mark.parametrize("signal_sent", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hangs"])
def test_a_sending_process_that_dies_or_hangs_mid_group_is_replaced_and_nothing_waits(
    app_client: TestClient, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, signal_sent: int
) -> None:
    """A sending process killed mid-group is started again at once; one that stops answering
    (stopped with SIGSTOP) is ended once its group has had the time its attempts may take. Either
    way a fresh one sends the rest, well before the group's lease (over 10 minutes) runs out."""
    for size in (1, worker.PER_ENDPOINT):
        assert sending.group_seconds(size) < worker.lease_for(size).total_seconds()
    monkeypatch.setattr(sending, "group_seconds", lambda size: 2.0)  # (a group of 6: 87 s)
    world, endpoint_id, _ = _pings(app_client, receiver.url, 6)
    store = app_client.app.state.tally.store  # type: ignore[attr-defined]
    receiver.hang.set()  # the first delivery is held, unanswered, while its sender is signalled
    deliverer = Deliverer(store, True, own_process=True, poll_seconds=0.05)
    deliverer.start()
    first: int | None = None
    try:
        # the sending process is a new interpreter: on a machine at load 6 it took over 30 s to start
        receiver.wait_for(1, seconds=90)
        sender = deliverer.sender
        assert isinstance(sender, ProcessSender) and sender.pid is not None
        first = sender.pid
        os.kill(first, signal_sent)
        receiver.release()
        wait_until(
            lambda: _statuses(app_client, world, endpoint_id) == ["succeeded"] * 6, "6 deliveries", 30, 0.1
        )
        assert sender.pid != first
    finally:
        deliverer.stop()
        if first is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first, signal.SIGKILL)
    ids = receiver.ids()
    assert len(set(ids)) == 6 and len(ids) <= 7
    assert all(ids.count(i) == 1 for i in ids if i != ids[0])


@pytest.mark.shared
def test_a_claim_skips_an_endpoint_another_replica_is_claiming(
    app_client: TestClient, receiver: Receiver, hooks_settings: Settings
) -> None:
    """Two replicas claiming at the same instant: the one that locked the endpoint's row first
    takes its deliveries, the other takes none of them (they would be sent out of order)."""
    _, endpoint_id, _ = _pings(app_client, receiver.url, 3)
    store = app_client.app.state.tally.store  # type: ignore[attr-defined]
    with psycopg.connect(hooks_settings.database) as other:
        other.execute("SELECT 1 FROM webhook_endpoints WHERE endpoint_id = %s FOR UPDATE", [endpoint_id])
        assert Deliverer(store, True)._claim([]) == []  # the other replica is claiming it
    assert len(Deliverer(store, True)._claim([])) == 3  # its transaction ended: nothing leased


def test_events_are_put_in_the_outbox_a_chunk_at_a_time_in_order_and_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = DuckExecutor(duckdb.connect())
    outbox.migrate(db)
    monkeypatch.setattr(outbox, "EMIT_CHUNK", 2)  # several statements for one call
    takers = {
        "p": [
            {"endpoint_id": "we_1", "events": ["sale.created"]},
            {"endpoint_id": "we_2", "events": ["ping"]},
        ]
    }

    def event(n: int, kind: str = "sale.created") -> outbox.Event:
        return outbox.Event(f"evt_{n}", kind, "p", NOW, b"{}")

    assert (
        outbox.emit(
            db, [event(1), event(2), event(1), event(3, "ping"), event(4, "payout.paid")], takers, NOW
        )
        == 3
    )
    assert outbox.emit(db, [event(2), event(5)], takers, NOW) == 1  # evt_2 is there already
    found = db.rows("SELECT event_id, endpoint_id, event_order FROM webhook_deliveries ORDER BY event_order")
    assert [(e, w) for e, w, _ in found] == [
        ("evt_1", "we_1"),
        ("evt_2", "we_1"),
        ("evt_3", "we_2"),
        ("evt_5", "we_1"),
    ]
    assert len({o for _, _, o in found}) == 4
    # an event no endpoint takes is not kept
    assert [r[0] for r in db.rows("SELECT event_id FROM webhook_events ORDER BY event_order")] == [
        "evt_1",
        "evt_2",
        "evt_3",
        "evt_5",
    ]
