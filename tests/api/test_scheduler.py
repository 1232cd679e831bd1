"""The reconcile schedule runs inside the server (APScheduler in the app's lifespan)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from api.state import State
from ingest.domain.errors import ReconcileRunning
from tests.conftest import OP, World, make_world
from tests.helpers import query


def test_scheduled_reconcile_materialises_sales(settings: Settings) -> None:
    scheduled = settings.model_copy(update={"reconcile_interval_seconds": 1})
    with TestClient(create_app(scheduled)) as client:
        world = make_world(client)
        assert world.sale().status_code == 200
        deadline = time.monotonic() + 20
        rows: list[object] = []
        while time.monotonic() < deadline and not rows:
            time.sleep(0.2)
            rows = client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner).json()[
                "data"
            ]
        assert [r["transaction_id"] for r in rows] == ["in_1"]  # type: ignore[index]


def test_operator_reconcile_streams_progress(client: TestClient) -> None:
    r = client.post("/api/v1/operator/reconcile", headers={**OP, "Accept": "application/x-ndjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    import json

    lines = [json.loads(line) for line in r.text.splitlines()]
    assert all("progress" in line for line in lines[:-1]) and len(lines) >= 2
    assert set(lines[-1]["data"]) >= {"run_id", "events_read", "sales", "commissions", "duration_ms"}


def _busy(r: httpx.Response) -> bool:
    return (
        r.status_code == 409
        and r.json()["error"]["code"] == "reconcile_running"
        and int(r.headers["Retry-After"]) >= 1
    )


def _closes(client: TestClient) -> int:
    return len(query(client, "SELECT seq FROM raw_events WHERE kind = 'period_close'"))


def test_calls_needing_the_run_lock_while_a_run_holds_it_are_answered_at_once(world: World) -> None:
    """While a run is in progress (held at its first progress step), a reconcile (plain or
    streamed), a payout batch, a backfill and a period close are each answered 409
    `reconcile_running` with `Retry-After` at once (the client's 10 s timeout would fail a
    call that waited), and the close appends nothing; once the run ends they go ahead."""
    client = world.client
    st: State = client.app.state.tally  # type: ignore[attr-defined]
    inside, leave = threading.Event(), threading.Event()

    def held(stage: str, done: int, total: int) -> None:
        inside.set()
        leave.wait(60)

    run = threading.Thread(target=st.reconciler.run, args=(held,))
    run.start()
    try:
        assert inside.wait(30)
        programs = f"/api/v1/programs/{world.program_id}"
        calls = [
            lambda: client.post("/api/v1/operator/reconcile", headers=OP),
            lambda: client.post(
                "/api/v1/operator/reconcile", headers={**OP, "Accept": "application/x-ndjson"}
            ),
            lambda: client.post(f"{programs}/payouts", json={"up_to": "2026-01-31"}, headers=world.owner),
            lambda: client.post(
                f"{programs}/backfill",
                json={"from": "2026-01-01", "to": "2026-01-31", "dry_run": True},
                headers=world.owner,
            ),
            lambda: client.post(f"{programs}/periods/2026-01/close", headers=world.owner),
        ]
        for call in calls:
            with ThreadPoolExecutor(1) as pool:  # a call that parks its thread fails here
                r = pool.submit(call).result(timeout=10)
            assert _busy(r), r.text
        assert _closes(client) == 0
    finally:
        leave.set()
        run.join(60)
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    r = client.post(f"/api/v1/programs/{world.program_id}/periods/2026-01/close", headers=world.owner)
    assert r.status_code == 200, r.text
    assert _closes(client) == 1


def test_a_lease_another_process_holds_refuses_runs_at_once(client: TestClient) -> None:
    """The run lock is the database's `reconcile` lease: while another (live) holder has it, a
    scheduled run skips and an on-demand one is refused at once; once it is released, runs go
    ahead and leave the lease free."""
    from api.jobs import LEASE, LEASE_TTL
    from ingest.domain.clock import utcnow

    st: State = client.app.state.tally  # type: ignore[attr-defined]
    store, reconciler = st.store, st.reconciler
    assert store.acquire_lease(LEASE, "another-replica", utcnow(), LEASE_TTL)
    reconciler._scheduled()  # skips (logged), raises nothing
    with pytest.raises(ReconcileRunning):
        reconciler.run()
    assert _busy(client.post("/api/v1/operator/reconcile", headers=OP))
    store.release_lease(LEASE, "another-replica")
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    assert store.acquire_lease(LEASE, "another-replica", utcnow(), LEASE_TTL)  # released after the run
