"""A full disk under the real server: writes answer 503 `database_unavailable` (never a 2xx it
cannot keep, never a 500), `/readyz` turns 503 while `/healthz` stays 200, and once space is
freed readiness and writes come back by themselves with nothing acknowledged lost."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import OP, fill, live_program, start_server


def _sale(c: httpx.Client, key: str, txn: str) -> httpx.Response:
    body = {"transaction_id": txn, "customer_external_id": "c", "amount": 100}
    return c.post("/api/v1/track/sale", json=body, headers={"Authorization": f"Bearer {key}"})


def _wait_for(check: object, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_disk_full_is_503_then_recovers_with_nothing_acknowledged_lost(small_disk: Path) -> None:
    server = start_server(small_disk / "tally.duckdb")
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            auth, pid, key = live_program(server.url)
            acked = [f"in_{n}" for n in range(20) if _sale(c, key, f"in_{n}").status_code == 200]
            assert len(acked) == 20
            filler = fill(small_disk)
            assert _refused_while_full(c, key, "in_a", acked) > 150
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["error"]["code"] == "database_unavailable"
            assert c.get("/healthz").status_code == 200
            assert c.get(f"/api/v1/programs/{pid}/sales", headers=auth).status_code == 200  # reads go on

            os.unlink(filler)
            assert _wait_for(lambda: c.get("/readyz").status_code == 200)
            assert _sale(c, key, "in_after").status_code == 200
            acked.append("in_after")
            assert c.post("/api/v1/operator/reconcile", headers=OP).status_code == 200

            filler = fill(small_disk)  # full again, and this time shut down while it is
            assert _refused_while_full(c, key, "in_b", acked) > 150
    finally:
        server.stop()  # a stop that cannot copy the journal in still ends in time (rows stay journaled)
    assert server.process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
    os.unlink(filler)

    server = start_server(small_disk / "tally.duckdb")
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert [t for t in acked if _sale(c, key, t).status_code != 409] == []
            assert c.get("/readyz").status_code == 200
    finally:
        server.stop()


def _refused_while_full(c: httpx.Client, key: str, prefix: str, acked: list[str]) -> int:
    """Post 200 sales to a full disk: each is acknowledged (200) or refused with 503
    `database_unavailable`, never anything else; returns how many were refused."""
    refused = 0
    for n in range(200):
        r = _sale(c, key, f"{prefix}_{n}")
        assert r.status_code in (200, 503), r.text
        if r.status_code == 200:
            acked.append(f"{prefix}_{n}")
        else:
            assert r.json()["error"]["code"] == "database_unavailable"
            refused += 1
    return refused
