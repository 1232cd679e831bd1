"""`tally demo` drives realistic traffic through the real endpoints, reconciles, and is idempotent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import OPERATOR_TOKEN, ROOT, WEBHOOK_SECRET, LiveServer


def _demo(server: LiveServer, state: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN,
        "TALLY_STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET,
    }
    return subprocess.run(
        [sys.executable, "-m", "api.cli", "demo", "--url", server.url, "--state", str(state)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_demo_is_realistic_and_idempotent(live_server: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "demo.json"
    first = _demo(live_server, state)
    assert first.returncode == 0, first.stderr
    assert "/dashboard" in first.stdout
    saved = json.loads(state.read_text())
    # the brand page with the browser script, for this program (tests/browser/test_pages.py clicks it)
    assert f"{live_server.url}/demo/shop?program_id={saved['program_id']}&aff=alice" in first.stdout
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    auth = {"Authorization": f"Bearer {saved['token']}"}
    sales = httpx.get(
        f"{live_server.url}/api/v1/programs/{saved['program_id']}/sales?limit=1000", headers=auth
    ).json()["data"]
    by_txn = {s["transaction_id"]: s for s in sales}
    # one-time payment by click, subscription renewals in both layouts, the renewal without metadata
    assert by_txn["pi_demo_pay_1"]["partner_code"] == "alice"
    assert by_txn["in_demo_ben_2"]["partner_code"] == "alice"
    assert by_txn["in_demo_ben_3"]["partner_code"] == "alice"
    assert by_txn["in_demo_cy_2"]["unattributed_reason"] == "subscription_metadata_missing"
    assert by_txn["in_demo_dee_1"]["source"] == "connect"  # the processor's record wins the double count
    assert any(s["test_mode"] for s in sales)
    doubles = httpx.get(
        f"{live_server.url}/api/v1/programs/{saved['program_id']}/reports/double-counting", headers=auth
    )
    assert doubles.status_code == 200 and "in_demo_dee_1" in doubles.text

    # finance pays: a batch up to last month's end, marked paid; a refund after payment is a
    # clawback; the finance report's checks (paid + unpaid + clawbacks = commissions among them)
    # hold in every month the demo touched
    base = f"{live_server.url}/api/v1/programs/{saved['program_id']}"
    (batch,) = httpx.get(f"{base}/payouts", headers=auth).json()["data"]
    assert (
        batch["status"] == "paid" and batch["lines"] >= 2 and "payout " + batch["payout_id"] in first.stdout
    )
    lines = httpx.get(f"{base}/commissions?limit=1000", headers=auth).json()["data"]
    assert any(r["kind"] == "clawback" and r["adjusts"] == "in_demo_ben_1" for r in lines)
    assert {r["status"] for r in lines if r["payout_id"] == batch["payout_id"]} == {"paid"}
    for period in sorted({r["period"] for r in lines} | {s["occurred_at"][:7] for s in sales}):
        report = httpx.get(f"{base}/reports/finance?period={period}", headers=auth).json()["data"]
        assert report["reconciled"] is True, (period, [c for c in report["checks"] if not c["ok"]])
        assert any(c["name"] == "payouts_commissions" for c in report["checks"]) or not report["summary"]

    second = _demo(live_server, state)
    assert second.returncode == 0, second.stderr
    again = httpx.get(
        f"{live_server.url}/api/v1/programs/{saved['program_id']}/sales?limit=1000", headers=auth
    ).json()["data"]
    assert json.loads(state.read_text()) == saved  # same account, program and key
    assert sorted(s["sale_id"] for s in again) == sorted(s["sale_id"] for s in sales)
    assert [b["payout_id"] for b in httpx.get(f"{base}/payouts", headers=auth).json()["data"]] == [
        batch["payout_id"]
    ]
