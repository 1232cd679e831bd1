"""Operations from the CLI against a live server: reconcile (progress), explain, backfill, report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from ingest.stripe import sign
from tests.conftest import OP, OPERATOR_TOKEN, ROOT, WEBHOOK_SECRET, LiveServer
from tests.helpers import renewal_event
from tests.stripe_fixtures import serialise


def tally(home: Path, *args: str, operator: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env["XDG_CONFIG_HOME"] = str(home)
    if operator:
        env["TALLY_OPERATOR_TOKEN"] = OPERATOR_TOKEN
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_reconcile_explain_backfill_report(live_server: LiveServer, tmp_path: Path) -> None:
    url = live_server.url
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "P"}, headers=owner
        ).json()["data"]["program_id"]
        key = {
            "Authorization": "Bearer "
            + c.post(f"/api/v1/programs/{pid}/api-key", headers=owner).json()["data"]["api_key"]
        }
        c.post(f"/api/v1/programs/{pid}/partners", json={"code": "alice", "name": "A"}, headers=owner)
        click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"}).json()[
            "data"
        ]
        c.post(
            "/api/v1/track/lead",
            json={"customer_external_id": "u1", "click_id": click["click_id"]},
            headers=key,
        )
        sale = c.post(
            "/api/v1/track/sale",
            json={
                "transaction_id": "in_cli",
                "customer_external_id": "u1",
                "amount": 2000,
                "occurred_at": "2026-11-02T10:00:00Z",
            },
            headers=key,
        )
        assert sale.status_code == 200
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0

    r = tally(home, "reconcile", operator=True)
    assert r.returncode == 0, r.stderr
    assert "1 sales" in r.stdout and r.stderr == ""  # no progress: stderr is not a terminal here
    r = tally(home, "reconcile")
    assert r.returncode != 0 and "TALLY_OPERATOR_TOKEN" in r.stderr

    r = tally(home, "explain", "--program", pid, "--transaction", "in_cli")
    assert r.returncode == 0, r.stderr
    assert "answer: attributed to alice by rule customer_key" in r.stdout

    r = tally(home, "backfill", "--program", pid, "--from", "2026-11-01", "--to", "2026-11-30")
    assert r.returncode == 0, r.stderr
    assert "0 sale(s) would change" in r.stdout and "dry run" in r.stdout

    out = tmp_path / "finance.json"
    r = tally(
        home, "report", "finance", "--program", pid, "--period", "2026-11", "--format", "json", "-o", str(out)
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())["data"]
    assert report["summary"][0]["gross_sales"] == 2000
    xlsx = tmp_path / "finance.xlsx"
    r = tally(
        home,
        "report",
        "finance",
        "--program",
        pid,
        "--period",
        "2026-11",
        "--format",
        "xlsx",
        "-o",
        str(xlsx),
    )
    assert r.returncode == 0 and xlsx.read_bytes()[:2] == b"PK"
    r = tally(
        home, "report", "finance", "--program", pid, "--period", "11-2026", "--format", "csv", "-o", str(out)
    )
    assert r.returncode != 0 and "validation_error" in r.stderr
    assert "period" in r.stderr and len(r.stderr.strip().splitlines()) == 1  # the field reaches the user

    # --period is optional where the help says so; --json on show commands
    r = tally(home, "report", "double-counting", "--program", pid, "--format", "json", "-o", "-")
    assert r.returncode == 0, r.stderr
    assert "data" in json.loads(r.stdout)
    r = tally(home, "explain", "--program", pid, "--transaction", "in_cli", "--json")
    assert r.returncode == 0, r.stderr
    assert "in_cli" in json.dumps(json.loads(r.stdout))
    # `-o -` into a pipe its reader closes early: a quiet exit, no traceback
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env["XDG_CONFIG_HOME"] = str(home)
    report = ["report", "finance", "--program", pid, "--format", "csv", "-o", "-"]
    reader = subprocess.Popen(
        [sys.executable, "-m", "api.cli", *report],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # the reader is gone before the report arrives (as with `| head -c 0`)
    assert reader.wait(120) == 141  # 128 + SIGPIPE, what a shell pipeline expects
    assert reader.stderr.read() == b""
    reader.stderr.close()


def test_backfill_apply(live_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tally backfill --apply` prints the diff it applied, and the sale is attributed after it;
    a second --apply changes nothing."""
    monkeypatch.setenv("COLUMNS", "160")  # the tables' rows on one line each
    url = live_server.url
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs",
            json={"workspace_id": acct["workspace_id"], "name": "P", "commission_bps": 2500},
            headers=owner,
        ).json()["data"]["program_id"]
        key = {
            "Authorization": "Bearer "
            + c.post(f"/api/v1/programs/{pid}/api-key", headers=owner).json()["data"]["api_key"]
        }
        c.post(f"/api/v1/programs/{pid}/partners", json={"code": "alice", "name": "A"}, headers=owner)
        click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"}).json()[
            "data"
        ]["click_id"]
        # sold to a customer no lead names: unattributed until a fix is backfilled
        body = {"transaction_id": "in_fixme", "customer_external_id": "u_unknown", "amount": 4000}
        sale = c.post("/api/v1/track/sale", json={**body, "occurred_at": "2026-10-15T23:59:59Z"}, headers=key)
        assert sale.status_code == 200, sale.text
        r = c.post(
            f"/api/v1/programs/{pid}/metadata-fixes",
            json={"fixes": [{"transaction_id": "in_fixme", "svc_click_id": click}]},
            headers=owner,
        )
        assert r.status_code == 201, r.text
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0

    def sales() -> list[tuple[str, str | None, int]]:
        rows = httpx.get(f"{url}/api/v1/programs/{pid}/sales", headers=owner, timeout=30).json()["data"]
        return [(s["transaction_id"], s["partner_code"], s["commission"]) for s in rows]

    assert tally(home, "reconcile", operator=True).returncode == 0
    assert sales() == [("in_fixme", None, 0)]

    backfill = ("backfill", "--program", pid, "--from", "2026-10-15", "--to", "2026-10-15")
    r = tally(home, *backfill)
    assert r.returncode == 0, r.stderr
    assert "1 sale(s) would change" in r.stdout and "dry run: nothing changed" in r.stdout
    assert sales() == [("in_fixme", None, 0)]

    r = tally(home, *backfill, "--apply")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "applied changes" in r.stdout and "dry run" not in r.stdout
    [changed] = [line for line in lines if "in_fixme" in line]
    assert "2026-10-15" in changed and "- -> alice" in changed and "0.00 usd -> 10.00 usd" in changed
    [total] = [line for line in lines if "alice" in line and "+10.00 usd" in line]
    assert "0.00 usd" in total and "10.00 usd" in total
    assert f"applied by {acct['account_id']}" in r.stdout
    assert sales() == [("in_fixme", "alice", 1_000)]

    r = tally(home, *backfill, "--apply")
    assert r.returncode == 0, r.stderr
    assert "in_fixme" not in r.stdout and "applied by" in r.stdout
    assert sales() == [("in_fixme", "alice", 1_000)]


def test_the_backfill_diff_prints_money_in_each_currencys_decimals() -> None:
    """The diff's tables show money as money (the currency's decimals), never minor units."""
    from rich.console import Console

    from api.cli.books import diff_listing, partner_listing

    def sale(tx: str, currency: str, before: int | None, after: int) -> dict[str, object]:
        return {
            "transaction_id": tx,
            "occurred_at": "2026-10-15T10:00:00Z",
            "currency": currency,
            "before_partner_code": None,
            "after_partner_code": "alice",
            "before_attribution_rule": None,
            "after_attribution_rule": "click",
            "before_unattributed_reason": "click_not_found",
            "after_unattributed_reason": None,
            "before_commission": before,
            "after_commission": after,
        }

    data = {
        "dry_run": True,
        "changes": 3,
        "changed_sales": [
            sale("in_usd", "usd", 0, 780),
            sale("in_kwd", "kwd", 0, 1_250),
            sale("in_jpy", "jpy", None, 500),
        ],
        "partner_totals": [
            {"partner_code": "alice", "currency": "usd", "before": 0, "after": 780, "delta": 780},
            {"partner_code": "bob", "currency": "kwd", "before": 1_250, "after": 0, "delta": -1_250},
        ],
    }
    console = Console(width=200, record=True)
    console.print(diff_listing(data))
    console.print(partner_listing(data))
    text = console.export_text()
    rows = {line.split()[1]: line for line in text.splitlines() if line.split()[1:2] != []}
    assert "0.00 usd -> 7.80 usd" in rows["in_usd"]
    assert "0.000 kwd -> 1.250 kwd" in rows["in_kwd"]
    assert "- -> 500 jpy" in rows["in_jpy"]
    assert "0.00 usd" in rows["alice"] and "7.80 usd" in rows["alice"] and "+7.80 usd" in rows["alice"]
    assert "1.250 kwd" in rows["bob"] and "-1.250 kwd" in rows["bob"]


def test_reconcile_counts_and_unroutable_lists_the_events_no_program_takes(
    live_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tally reconcile` says how many processor events are unroutable; `tally unroutable` lists
    them with the reason."""
    monkeypatch.setenv("COLUMNS", "200")
    event = renewal_event("evt_cli_stray", "in_cli_stray", account="acct_1NobodysAccount")
    body = serialise(event)
    headers = {"Stripe-Signature": sign(body, WEBHOOK_SECRET, int(time.time()))}
    r = httpx.post(f"{live_server.url}/webhooks/stripe", content=body, headers=headers, timeout=30)
    assert r.json() == {"data": {"received": True, "routed": False}}
    home = tmp_path / "cfg"
    r = tally(home, "reconcile", "--url", live_server.url, operator=True)
    assert r.returncode == 0, r.stderr
    assert "1 unroutable events" in r.stdout and "tally unroutable" in r.stderr
    r = tally(home, "reconcile", "--url", live_server.url, "--json", operator=True)
    assert json.loads(r.stdout)["unroutable"] == 1
    r = tally(home, "unroutable", "--url", live_server.url, operator=True)
    assert r.returncode == 0, r.stderr
    [line] = [line for line in r.stdout.splitlines() if "evt_cli_stray" in line]
    assert "invoice.paid" in line and "acct_1NobodysAccount" in line and "account_not_connected" in line
    r = tally(home, "unroutable", "--url", live_server.url, "--json", "--limit", "5", operator=True)
    [listed] = json.loads(r.stdout)
    assert (listed["event_id"], listed["reason"], listed["routes_to"]) == (
        "evt_cli_stray",
        "account_not_connected",
        None,
    )
    r = tally(home, "unroutable", "--url", live_server.url)
    assert r.returncode == 4 and "TALLY_OPERATOR_TOKEN" in r.stderr  # no token: an authentication failure
    r = tally(home, "unroutable", "--url", live_server.url, "--limit", "-1", operator=True)
    assert r.returncode == 2

    # the account's owner connects a program to it: `tally backfill` shows, then picks up, the event
    url = live_server.url
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs",
            json={
                "workspace_id": acct["workspace_id"],
                "name": "P",
                "stripe_account_id": "acct_1NobodysAccount",
            },
            headers=owner,
        ).json()["data"]["program_id"]
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0
    today = datetime.now(UTC).date()  # a day either side: midnight cannot split the range
    start, end = (today - timedelta(days=1)).isoformat(), (today + timedelta(days=1)).isoformat()
    backfill = ("backfill", "--program", pid, "--from", start, "--to", end)
    r = tally(home, *backfill)
    assert r.returncode == 0, r.stderr
    assert "would pick up 1 unroutable processor event(s): evt_cli_stray" in r.stdout
    r = tally(home, *backfill, "--apply")
    assert r.returncode == 0, r.stderr
    assert "picked up 1 unroutable processor event(s): evt_cli_stray" in r.stdout
    r = tally(home, "unroutable", "--json", operator=True)
    assert json.loads(r.stdout) == []


def test_payouts_create_list_export_and_mark_paid(live_server: LiveServer, tmp_path: Path) -> None:
    """`tally payouts ...` with an owner's login: a batch of the approved line (a sale 60 days
    old, 30 holding days), the same cut-off again makes nothing new, the CSV export, mark paid."""
    from datetime import UTC, datetime, timedelta

    sold = (datetime.now(UTC) - timedelta(days=60)).replace(microsecond=0)
    up_to = datetime.now(UTC).date().isoformat()
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "p@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "P"}, headers=owner
        ).json()["data"]["program_id"]
        key = {
            "Authorization": "Bearer "
            + c.post(f"/api/v1/programs/{pid}/api-key", headers=owner).json()["data"]["api_key"]
        }
        c.post(
            f"/api/v1/programs/{pid}/partners",
            json={"code": "alice", "name": "Alice Ö", "email": "alice@p.test"},
            headers=owner,
        )
        details = {  # a batch pays only partners with payout details (CONTRACT 15)
            "payout_method": "paypal",
            "payout_email": "alice@paypal.test",
            "payout_name": "Alice Ö",
            "payout_currency": "usd",
        }
        assert (
            c.patch(f"/api/v1/programs/{pid}/partners/alice", json=details, headers=owner).status_code == 200
        )
        click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"}).json()[
            "data"
        ]
        c.post(
            "/api/v1/track/lead",
            json={"customer_external_id": "u1", "click_id": click["click_id"]},
            headers=key,
        )
        body = {
            "transaction_id": "in_pay",
            "customer_external_id": "u1",
            "amount": 2000,
            "occurred_at": sold.isoformat().replace("+00:00", "Z"),
        }
        assert c.post("/api/v1/track/sale", json=body, headers=key).status_code == 200
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", live_server.url, "--token", acct["token"]).returncode == 0

    r = tally(home, "payouts", "create", "--program", pid, "--up-to", up_to, "--json")
    assert r.returncode == 0, r.stderr
    batch = json.loads(r.stdout)
    assert [(x["partner_code"], x["amount"], x["amount_decimal"], x["lines"]) for x in batch["rows"]] == [
        ("alice", 600, "6.00", 1)
    ]
    r = tally(home, "payouts", "create", "--program", pid, "--up-to", up_to)
    assert r.returncode == 0, r.stderr
    assert f"nothing new to pay: batch {batch['payout_id']}" in r.stdout
    r = tally(home, "payouts", "list", "--program", pid)
    assert r.returncode == 0 and batch["payout_id"] in r.stdout and "6.00 USD" in r.stdout
    out = tmp_path / "payout.csv"
    r = tally(home, "payouts", "export", "--program", pid, "--payout", batch["payout_id"], "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_bytes().decode("utf-8")
    assert text.startswith(
        "\ufeffpartner_code,partner_name,partner_email,amount,amount_decimal,currency,lines"
    )
    assert "alice,Alice Ö,alice@p.test,600,6.00,usd,1," in text
    r = tally(home, "payouts", "mark-paid", "--program", pid, "--payout", batch["payout_id"])
    assert r.returncode == 0 and "paid" in r.stdout, r.stderr
    r = tally(home, "payouts", "mark-paid", "--program", pid, "--payout", "po_nope")
    assert r.returncode == 1 and r.stderr.startswith("tally: not_found:") and len(r.stderr.splitlines()) == 1
