"""Anything acknowledged survives a crash: SIGKILL the server mid-traffic, restart, and every
acknowledged sale is still there (re-posting it gets 409)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import OP, start_server


def _setup(url: str) -> str:
    with httpx.Client(base_url=url, timeout=10) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        auth = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "P"}, headers=auth
        ).json()["data"]["program_id"]
        return str(c.post(f"/api/v1/programs/{pid}/api-key", headers=auth).json()["data"]["api_key"])


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_sale(tmp_path: Path) -> None:
    db = tmp_path / "crash.duckdb"
    server = start_server(db)
    key = _setup(server.url)
    headers = {"Authorization": f"Bearer {key}"}
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=5, headers=headers) as c:
            n = 0
            while not stop.is_set():
                txn = f"in_{worker}_{n}"
                n += 1
                try:
                    r = c.post(
                        "/api/v1/track/sale",
                        json={"transaction_id": txn, "customer_external_id": "c", "amount": 100},
                    )
                except httpx.HTTPError:
                    return  # the server died under us: this one was never acknowledged
                if r.status_code == 200:
                    with lock:
                        acked.append(txn)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(acked) < 300 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    stop.set()
    for t in threads:
        t.join(10)
    if server.process.stderr:
        server.process.stderr.close()
    assert len(acked) >= 300

    restarted = start_server(db)
    try:
        with httpx.Client(base_url=restarted.url, timeout=10, headers=headers) as c:
            codes = {
                txn: c.post(
                    "/api/v1/track/sale",
                    json={"transaction_id": txn, "customer_external_id": "c", "amount": 100},
                ).status_code
                for txn in acked
            }
        assert set(codes.values()) == {409}, {t: s for t, s in codes.items() if s != 409}
    finally:
        restarted.stop()
        if restarted.process.stderr:
            restarted.process.stderr.close()
