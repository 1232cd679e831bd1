"""The reconcile schedule runs inside the server (APScheduler in the app's lifespan)."""

from __future__ import annotations

import time

from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.conftest import make_world


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
    from tests.conftest import OP

    r = client.post("/api/v1/operator/reconcile", headers={**OP, "Accept": "application/x-ndjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    import json

    lines = [json.loads(line) for line in r.text.splitlines()]
    assert all("progress" in line for line in lines[:-1]) and len(lines) >= 2
    assert set(lines[-1]["data"]) >= {"run_id", "events_read", "sales", "commissions", "duration_ms"}


def test_a_run_waits_for_the_lease_another_process_holds(client: TestClient) -> None:
    """The run lock is the database's `reconcile` lease: while another holder has it, the
    scheduled run skips and an on-demand run waits; once it is released, runs go ahead and
    leave the lease free."""
    import threading

    from api.jobs import LEASE, LEASE_TTL
    from api.state import State
    from ingest.clock import utcnow

    st: State = client.app.state.tally  # type: ignore[attr-defined]
    store, reconciler = st.store, st.reconciler
    assert store.acquire_lease(LEASE, "another-replica", utcnow(), LEASE_TTL)
    assert reconciler.run(wait=False) is None
    done: list[object] = []
    waiting = threading.Thread(target=lambda: done.append(reconciler.run()))
    waiting.start()
    time.sleep(1)
    assert done == [] and waiting.is_alive()
    store.release_lease(LEASE, "another-replica")
    waiting.join(30)
    assert done and done[0] is not None
    assert store.acquire_lease(LEASE, "another-replica", utcnow(), LEASE_TTL)  # released after the run
