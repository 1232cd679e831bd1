"""`tally programs create` with every setting, `tally periods close` and `tally fixes add`, and what
`tally explain` says of a paid sale: the CLI against a live server (CONTRACT section 10)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import httpx
import pytest

from api.cli.options import PER_CURRENCY
from tests.conftest import OP, LiveServer
from tests.test_cli_ops import tally


def alices_sale(url: str, owner: dict[str, str], pid: str, sale: dict[str, str]) -> None:
    """Through the live server: a key, partner alice (paid by PayPal), her click and u1's lead,
    then u1's sale of 100.00 (`sale` gives its transaction id and, if any, its time)."""
    with httpx.Client(base_url=url, timeout=30) as c:
        key = {
            "Authorization": "Bearer "
            + c.post(f"/api/v1/programs/{pid}/api-key", headers=owner).json()["data"]["api_key"]
        }
        c.post(f"/api/v1/programs/{pid}/partners", json={"code": "alice", "name": "A"}, headers=owner)
        details = {  # a batch pays only partners with payout details (CONTRACT 15)
            "payout_method": "paypal",
            "payout_email": "alice@paypal.test",
            "payout_name": "A",
            "payout_currency": "usd",
        }
        assert (
            c.patch(f"/api/v1/programs/{pid}/partners/alice", json=details, headers=owner).status_code == 200
        )
        click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"}).json()[
            "data"
        ]
        lead = {"customer_external_id": "u1", "click_id": click["click_id"]}
        assert c.post("/api/v1/track/lead", json=lead, headers=key).status_code == 200
        body = {"customer_external_id": "u1", "amount": 10_000, **sale}
        assert c.post("/api/v1/track/sale", json=body, headers=key).status_code == 200


def test_programs_create_takes_every_setting_as_its_first_terms(
    live_server: LiveServer, tmp_path: Path
) -> None:
    """The settings go in the create call: a sale dated long before (in January) is valued at
    12.5 %, not at the defaults' 30 %; it is approved at once (0 holding days), paid through
    `tally payouts`, and `tally explain` says so. Then the month is closed with `tally periods
    close`, and a fix is recorded with `tally fixes add`."""
    url = live_server.url
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "f@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
    owner = {"Authorization": f"Bearer {acct['token']}"}
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0

    create = ("programs", "create", "--workspace", acct["workspace_id"])
    r = tally(
        home,
        *create,
        "--name",
        "Terms",
        "--commission-percent",
        "12.5",
        "--platform-fee-percent",
        "2",
        "--holding-days",
        "0",
        "--recurring-months",
        "12",
        "--requires-server-side-leads",
        "--stripe-account",
        "acct_1CliSettings",
        "--payout-minimum",
        "10.00 usd",  # below the 12.50 paid later
        "--website",
        "https://brand.test",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    program = json.loads(r.stdout)
    pid = program["program_id"]
    settings = ("commission_type", "commission_bps", "platform_fee_bps", "holding_days", "recurring_months")
    assert [program[k] for k in settings] == ["percent", 1250, 200, 0, 12]
    assert (program["requires_server_side_leads"], program["stripe_account_id"]) == (
        True,
        "acct_1CliSettings",
    )
    # money in one currency is that currency's alone (CONTRACT 15)
    assert (program["payout_minimum"], program["website_url"]) == ({"usd": 1_000}, "https://brand.test")

    r = tally(
        home,
        *create,
        "--name",
        "Flat",
        "--commission-flat",
        "1.250 kwd",
        "--recurring-months",
        "lifetime",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    flat = json.loads(r.stdout)
    assert (flat["commission_type"], flat["commission_flat"], flat["recurring_months"]) == (
        "flat",
        {"kwd": 1250},
        None,
    )
    assert flat["commission_bps"] == 3000  # untouched: the default
    per_currency = ("--commission-flat", "usd=5000,JPY=500", "--payout-minimum", "2500", "--json")
    r = tally(home, *create, "--name", "By currency", *per_currency)
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    assert (made["commission_type"], made["commission_flat"], made["payout_minimum"]) == (
        "flat",
        {"jpy": 500, "usd": 5000},
        2500,
    )
    r = tally(home, *create, "--name", "X", "--commission-flat", "usd=12.50")
    assert r.returncode == 2 and "usd=5000" in r.stderr and len(r.stderr.splitlines()) == 1
    r = tally(home, *create, "--name", "X", "--payout-minimum", "usd=1000000000001")
    assert r.returncode == 1 and "validation_error" in r.stderr and "payout_minimum" in r.stderr
    r = tally(home, *create, "--name", "X", "--commission-flat", "12.5")
    assert r.returncode == 2 and "currency" in r.stderr and len(r.stderr.splitlines()) == 1
    r = tally(home, *create, "--name", "X", "--commission-percent", "10", "--commission-flat", "5 usd")
    assert r.returncode == 1 and "--commission-type" in r.stderr
    r = tally(home, *create, "--name", "X", "--holding-days", "9999")
    assert r.returncode == 1 and "validation_error" in r.stderr and "holding_days" in r.stderr

    alices_sale(url, owner, pid, {"transaction_id": "in_jan", "occurred_at": "2026-01-05T10:00:00Z"})
    assert tally(home, "reconcile", "--url", url, operator=True).returncode == 0
    r = tally(home, "payouts", "create", "--program", pid, "--up-to", "2026-01-31", "--json")
    assert r.returncode == 0, r.stderr
    batch = json.loads(r.stdout)
    assert [(row["partner_code"], row["amount"]) for row in batch["rows"]] == [("alice", 1_250)]
    assert (
        tally(home, "payouts", "mark-paid", "--program", pid, "--payout", batch["payout_id"]).returncode == 0
    )
    r = tally(home, "explain", "--program", pid, "--transaction", "in_jan")
    assert r.returncode == 0, r.stderr
    assert "commission: 12.50 usd (paid)" in r.stdout

    r = tally(home, "periods", "close", "--program", pid, "--period", "2026-01")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("2026-01 closed at ") and f"by {acct['account_id']}" in r.stdout
    r = tally(home, "periods", "close", "--program", pid, "--period", "2026-01", "--json")
    assert r.returncode == 0, r.stderr
    closed = json.loads(r.stdout)
    assert (closed["period"], closed["closed_by"]) == ("2026-01", acct["account_id"])
    r = tally(home, "report", "finance", "--program", pid, "--period", "2026-01", "-o", "-")
    report = json.loads(r.stdout)["data"]
    assert (report["closed"], report["closed_by"]) == (True, acct["account_id"])
    r = tally(home, "periods", "close", "--program", pid, "--period", "2026-13")
    assert r.returncode == 1 and "validation_error" in r.stderr and len(r.stderr.splitlines()) == 1

    r = tally(home, "fixes", "add", "--program", pid, "--transaction-id", "in_jan", "--svc-click-id", "clk_x")
    assert r.returncode == 0, r.stderr
    [row] = [line.split("\t") for line in r.stdout.splitlines() if "\t" in line]  # the recorded fix's row
    assert row[0].startswith("fix") and row[1:] == ["-", "in_jan", "-", "clk_x"] and "backfill" in r.stdout
    fix = ("--subscription-id", "sub_1", "--svc-customer-key", "cust_42", "--json")
    r = tally(home, "fixes", "add", "--program", pid, *fix)
    assert r.returncode == 0, r.stderr
    [recorded] = json.loads(r.stdout)["fixes"]
    assert (recorded["subscription_id"], recorded["svc_customer_key"], recorded["recorded_by"]) == (
        "sub_1",
        "cust_42",
        acct["account_id"],
    )
    r = tally(home, "fixes", "add", "--program", pid, "--transaction-id", "in_jan")
    assert r.returncode == 1 and "validation_error" in r.stderr  # no value to fix: the server says so
    r = tally(home, "fixes", "add", "--program", pid, "--svc-click-id", "clk_x")
    assert r.returncode == 2


def test_commissions_hold_release_void(live_server: LiveServer, tmp_path: Path) -> None:
    """`tally commissions hold|release|void`: the sale's lines after each action, the reason
    kept; an action its state does not allow exits non-zero with invalid_transition."""
    url = live_server.url
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "h@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0
    r = tally(
        home,
        *("programs", "create", "--workspace", acct["workspace_id"], "--name", "P", "--holding-days", "0"),
        "--json",
    )
    pid = json.loads(r.stdout)["program_id"]
    owner = {"Authorization": f"Bearer {acct['token']}"}
    alices_sale(url, owner, pid, {"transaction_id": "tx_1"})
    base = ("--program", pid, "--transaction", "tx_1")
    r = tally(home, "commissions", "hold", *base, "--reason", "dispute", "--json")
    assert r.returncode == 0, r.stderr
    assert [(x["status"], x["status_reason"]) for x in json.loads(r.stdout)["lines"]] == [("held", "dispute")]
    r = tally(home, "commissions", "hold", *base, "--reason", "again")
    assert r.returncode != 0 and "invalid_transition" in r.stderr
    r = tally(home, "commissions", "release", *base, "--reason", "won")
    assert r.returncode == 0 and "approved" in r.stdout, r.stderr
    r = tally(home, "commissions", "void", *base, "--reason", "fraud")
    assert r.returncode == 0 and "void (fraud)" in r.stdout, r.stderr


def test_an_amount_per_currency_is_read_as_the_api_takes_it() -> None:
    """`--commission-flat` and `--payout-minimum` (CONTRACT 15): minor units in every currency,
    minor units by currency, or money in one currency by its decimals."""
    assert PER_CURRENCY.convert("500", None, None) == 500
    assert PER_CURRENCY.convert("usd=5000,jpy=500", None, None) == {"usd": 5000, "jpy": 500}
    assert PER_CURRENCY.convert(" USD=1, eur=0 ", None, None) == {"usd": 1, "eur": 0}
    assert PER_CURRENCY.convert("12.50 usd", None, None) == {"usd": 1250}
    assert PER_CURRENCY.convert("500 JPY", None, None) == {"jpy": 500}
    assert PER_CURRENCY.convert("1,000.000 kwd", None, None) == {"kwd": 1_000_000}
    for text, said in (
        ("12.5", "not an amount"),
        ("-5", "not an amount"),
        ("usd=12.50", "usd=5000"),
        ("usd=1,USD=2", "usd given twice"),
        ("us=5", "not a currency=minor-units pair"),
        ("usd=5,", "not a currency=minor-units pair"),
        ("1.5 jpy", "JPY amounts have no decimals"),
    ):
        with pytest.raises(click.BadParameter, match=said):
            PER_CURRENCY.convert(text, None, None)
