"""Webhooks to brand servers with real `tally serve` processes and a real receiver:

- SIGKILL in the middle of a delivery (the receiver holds the request, unanswered): after the
  restart every event reaches the receiver, and only the one that was being sent can arrive
  twice (with the same `webhook-id`);
- two replicas on one PostgreSQL database, both running a delivery worker: each event is
  delivered once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import OP, LiveServer, live_program, start_server
from tests.pg import Server
from tests.processes import kill, wait_until
from tests.receiver import Receiver

pytestmark = pytest.mark.slow

HOOKS = {"TALLY_WEBHOOKS_ALLOW_PRIVATE": "1"}


def _endpoint(url: str, auth: dict[str, str], program_id: str, target: str, events: list[str]) -> str:
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post(
            f"/api/v1/programs/{program_id}/webhook-endpoints",
            json={"url": target, "events": events},
            headers=auth,
        )
        assert r.status_code == 201, r.text
        return str(r.json()["data"]["endpoint_id"])


def _sales(url: str, key: str, count: int) -> None:
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
        for n in range(count):
            body = {"transaction_id": f"in_{n}", "customer_external_id": f"c{n}", "amount": 1000 + n}
            assert c.post("/api/v1/track/sale", json=body).status_code == 200


def _reconcile(url: str) -> None:
    assert httpx.post(f"{url}/api/v1/operator/reconcile", headers=OP, timeout=120).status_code == 200


def _deliveries(url: str, auth: dict[str, str], program_id: str, endpoint_id: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{url}/api/v1/programs/{program_id}/webhook-endpoints/{endpoint_id}/deliveries",
        params={"limit": "1000"},
        headers=auth,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["data"]
    return found


def test_a_sigkill_mid_delivery_resends_at_most_that_delivery(tmp_path: Path, receiver: Receiver) -> None:
    db = tmp_path / "hooks.duckdb"
    receiver.hang.set()  # the first request is held, unanswered, while tally is killed
    server: LiveServer = start_server(db, **HOOKS)
    try:
        auth, program_id, key = live_program(server.url)
        endpoint_id = _endpoint(server.url, auth, program_id, receiver.url, ["sale.created"])
        _sales(server.url, key, 5)
        _reconcile(server.url)
        receiver.wait_for(1)  # a delivery is under way
        kill(server.process)
        assert len(receiver.received) == 1
        receiver.release()  # the receiver is back: it answers 200 from now on
        server = start_server(db, **HOOKS)
        done = lambda: [d["status"] for d in _deliveries(server.url, auth, program_id, endpoint_id)]  # noqa: E731
        wait_until(
            lambda: done() == ["succeeded"] * 5, "every delivery to succeed after the restart", 60, 0.2
        )
        expected = {d["event_id"] for d in _deliveries(server.url, auth, program_id, endpoint_id)}
    finally:
        server.stop()
    ids = receiver.ids()
    assert set(ids) == expected
    assert len(ids) <= len(expected) + 1  # only the delivery under way at the kill came twice
    assert all(ids.count(i) == 1 for i in ids if i != ids[0])


def test_two_replicas_deliver_each_event_once(pg_server: Server, tmp_path: Path, receiver: Receiver) -> None:
    database = pg_server.fresh_database()
    a = start_server(database, TALLY_ENGINE_DIR=str(tmp_path / "engine-a"), **HOOKS)
    b = start_server(database, TALLY_ENGINE_DIR=str(tmp_path / "engine-b"), **HOOKS)
    try:
        auth, program_id, key = live_program(a.url)
        endpoint_id = _endpoint(b.url, auth, program_id, receiver.url, ["sale.created", "ping"])
        _sales(a.url, key, 40)
        _reconcile(a.url)
        with httpx.Client(base_url=b.url, timeout=30) as c:  # pings queued through the other replica
            for _ in range(20):
                r = c.post(
                    f"/api/v1/programs/{program_id}/webhook-endpoints/{endpoint_id}/ping", headers=auth
                )
                assert r.status_code == 202
        _reconcile(b.url)  # a second run on the other replica makes no event twice

        def done() -> bool:
            found = _deliveries(a.url, auth, program_id, endpoint_id)
            return len(found) == 60 and all(d["status"] == "succeeded" for d in found)

        wait_until(done, "60 deliveries to succeed", 60, 0.2)
    finally:
        a.stop()
        b.stop()
    ids = receiver.ids()
    assert len(ids) == 60 and len(set(ids)) == 60
