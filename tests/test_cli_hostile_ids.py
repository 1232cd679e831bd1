"""`tally explain` and `tally commissions hold|release|void` take any transaction id the ingest
accepted, against a real server (uvicorn decodes a path once: `%2F` in an id is tried here,
which Starlette's in-process TestClient cannot do): the CLI sends the id as one percent-encoded
segment and the server routes it as `:path` (issue 48, item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import OP, ROOT, LiveServer, live_program

IDS = ["x/../../payouts/po_1/paid", "a/b", "%2F", "50%25 off?#", "reçu ✓"]


def tally(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env["XDG_CONFIG_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_explains_and_acts_on_any_accepted_id(live_server: LiveServer, tmp_path: Path) -> None:
    url = live_server.url
    auth, pid, key = live_program(url)
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post(f"/api/v1/programs/{pid}/partners", json={"code": "alice", "name": "A"}, headers=auth)
        assert r.status_code == 201, r.text
        click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"})
        lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
        assert c.post("/api/v1/track/lead", json=lead, headers={"Authorization": f"Bearer {key}"}).is_success
        for tx in IDS:
            sale = {"transaction_id": tx, "customer_external_id": "cust_1", "amount": 1000}
            r = c.post("/api/v1/track/sale", json=sale, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, (tx, r.text)
        assert c.post("/api/v1/operator/reconcile", headers=OP, timeout=120).status_code == 200
    token = auth["Authorization"].removeprefix("Bearer ")
    assert tally(tmp_path, "login", "--url", url, "--token", token).returncode == 0
    for tx in IDS:
        r = tally(tmp_path, "explain", "--program", pid, "--transaction", tx, "--json")
        assert r.returncode == 0, (tx, r.stderr)
        assert json.loads(r.stdout)["sale"]["transaction_id"] == tx
        for action, status in (("hold", "held"), ("release", "pending"), ("void", "void")):
            r = tally(
                tmp_path,
                "commissions",
                action,
                "--program",
                pid,
                "--transaction",
                tx,
                "--reason",
                "r",
                "--json",
            )
            assert r.returncode == 0, (tx, action, r.stderr)
            assert [line["status"] for line in json.loads(r.stdout)["lines"]] == [status], (tx, action)
