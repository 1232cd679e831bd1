"""`tally stripe trigger`: Stripe-format events with the fields Stripe's own fixtures have, signed
as Stripe signs them, posted to a live server's webhook, and the sales they make once reconciled."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from api.cli import stripe_events as events
from ingest.stripe import extract, parse_event, verify_signature
from tests.conftest import OP, OPERATOR_TOKEN, WEBHOOK_SECRET, LiveServer
from tests.stripe_fixtures import load_raw
from tests.test_cli import tally

NOW = 1_790_000_000


def _object(name: str) -> dict[str, Any]:
    """A public fixture's Stripe object (an event's data.object, or the object itself)."""
    raw: dict[str, Any] = load_raw(name)
    return raw["data"]["object"] if raw.get("object") == "event" else raw


def _extra_keys(built: dict[str, Any], stripes: dict[str, Any]) -> set[str]:
    """Keys of `built` (and of its nested objects) that Stripe's own object does not have."""
    extra = set(built) - set(stripes)
    for key, value in built.items():
        if isinstance(value, dict) and isinstance(stripes.get(key), dict):
            extra |= {f"{key}.{k}" for k in _extra_keys(value, stripes[key])}
    return extra


def test_every_field_of_a_built_object_is_one_stripe_sends() -> None:
    session = events.checkout_session(
        amount=4900, currency="usd", customer="cus_1", email="a@b.test", metadata={}, created=NOW
    )
    assert _extra_keys(session, _object("openapi__fixtures3.checkout.session.json")) == set()
    basil = events.invoice(
        invoice_id="in_1",
        amount=2900,
        currency="usd",
        customer="cus_1",
        email=None,
        subscription="sub_1",
        billing_reason="subscription_cycle",
        paid_at=NOW,
        metadata={"svc_customer_key": "u_1"},
        tax=100,
    )
    stripes_invoice = _object("openapi__fixtures3.invoice.json")
    assert _extra_keys(basil, stripes_invoice) == set()
    assert set(basil["parent"]) <= set(stripes_invoice["parent"])
    assert set(basil["parent"]["subscription_details"]) == set(
        stripes_invoice["parent"]["subscription_details"]
    )
    legacy = events.invoice(**{**_invoice_args(), "legacy": True, "tax": 100})
    # an invoice of 2020 had no subscription_details yet (2023 API versions have it: pay's fixture)
    assert _extra_keys(legacy, _object("stripe-sync-engine__invoice_paid.json")) == {"subscription_details"}
    assert set(legacy["subscription_details"]) == set(_object("pay__invoice.json")["subscription_details"])
    assert set(legacy["total_tax_amounts"][0]) <= set(_object("pay__invoice.json")["total_tax_amounts"][0])
    charge = events.refunded_charge(
        amount=4900, refunded=1000, currency="usd", customer="cus_1", payment_intent="pi_1", created=NOW
    )
    assert _extra_keys(charge, _object("openapi__fixtures3.charge.json")) == set()
    assert _extra_keys(charge["refunds"]["data"][0], _object("openapi__fixtures3.refund.json")) == set()
    subscription = events.subscription(
        subscription_id="sub_1", customer="cus_1", currency="usd", metadata={}, created=NOW
    )
    assert _extra_keys(subscription, _object("openapi__fixtures3.subscription.json")) == set()
    link = events.invoice_payment(
        invoice_id="in_1", payment_intent="pi_1", amount=2900, currency="usd", paid_at=NOW
    )
    assert _extra_keys(link, _object("tally__invoice_payment.paid.basil.json")) == set()
    envelope = events.event("invoice.paid", basil, created=NOW, account="acct_1")
    stripes_event = load_raw("openapi__fixtures3.event.json")
    assert set(envelope) - set(stripes_event) == {"account"}  # a Connect event names its account
    assert set(envelope["data"]) <= set(stripes_event["data"])
    assert set(envelope["request"]) == set(stripes_event["request"])


def _invoice_args() -> dict[str, Any]:
    return {
        "invoice_id": "in_1",
        "amount": 2900,
        "currency": "usd",
        "customer": "cus_1",
        "email": None,
        "subscription": "sub_1",
        "billing_reason": "subscription_cycle",
        "paid_at": NOW,
        "metadata": {"svc_customer_key": "u_1"},
    }


def test_a_dry_run_prints_the_event_and_a_signature_the_server_accepts(tmp_path: Path) -> None:
    r = tally(
        tmp_path,
        "stripe",
        "trigger",
        "invoice.paid",
        "--dry-run",
        "--stripe-account",
        "acct_1Dry",
        "--customer-key",
        "u_9",
        "--metadata",
        "program_id=prog_dry",
        "--amount",
        "1250",
        "--currency",
        "kwd",
        "--api-version",
        "2024-06-20",
        TALLY_STRIPE_WEBHOOK_SECRETS=f" {WEBHOOK_SECRET} ,whsec_older",
    )
    assert r.returncode == 0, r.stderr
    [header] = r.stderr.splitlines()
    assert header.startswith("Stripe-Signature: t=")
    body = r.stdout.rstrip("\n").encode()
    signed_at = verify_signature(
        body, header.removeprefix("Stripe-Signature: "), [WEBHOOK_SECRET], 300, datetime.now(UTC)
    )
    assert abs(signed_at - time.time()) < 120
    fields = extract(parse_event(body))
    assert (fields["event_type"], fields["stripe_account"], fields["amount"], fields["currency"]) == (
        "invoice.paid",
        "acct_1Dry",
        1250,
        "kwd",
    )
    assert (fields["customer_key"], fields["meta_program_id"]) == ("u_9", "prog_dry")
    event = json.loads(body)
    assert event["data"]["object"]["subscription_details"]["metadata"]["svc_customer_key"] == "u_9"  # legacy
    assert "parent" not in event["data"]["object"]

    r = tally(tmp_path, "stripe", "trigger", "invoice.paid", "--dry-run")
    assert r.returncode == 4 and "TALLY_STRIPE_WEBHOOK_SECRETS" in r.stderr  # no secret: nothing to sign with
    r = tally(tmp_path, "stripe", "trigger", "invoice.created", "--dry-run", "--secret", "s")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1


def test_trigger_makes_sales_the_reconciler_attributes(live_server: LiveServer, tmp_path: Path) -> None:
    """A checkout by a click recorded with --aff, a renewal attributed by its customer key (in
    the legacy invoice layout), a partial refund of the checkout, a test-mode event: once
    reconciled, the sales are there, attributed, with the refund; a wrong secret is refused."""
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
        for code in ("alice", "bob"):
            c.post(f"/api/v1/programs/{pid}/partners", json={"code": code, "name": code}, headers=owner)
        click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "bob"}).json()["data"]
        lead = {"customer_external_id": "u_bob", "click_id": click["click_id"]}
        assert c.post("/api/v1/track/lead", json=lead, headers=key).status_code == 200
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0
    secret = {"TALLY_STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET}
    trigger = ("stripe", "trigger")

    r = tally(
        home,
        *trigger,
        "checkout.session.completed",
        "--program",
        pid,
        "--aff",
        "alice",
        "--amount",
        "4900",
        **secret,
    )
    assert r.returncode == 0, r.stderr
    sent, sale = r.stdout.splitlines()
    assert sent.startswith("sent checkout.session.completed evt_") and sent.endswith(
        f"accepted for program {pid}"
    )
    assert sale.startswith("transaction pi_") and "49.00 usd (click_id clk_" in sale
    checkout = sale.split()[1].rstrip(":")
    assert f"tally explain --program {pid} --transaction {checkout}" in r.stderr

    renewal = ("invoice.paid", "--program", pid, "--customer-key", "u_bob", "--amount", "2900", "--json")
    r = tally(home, *trigger, *renewal, "--api-version", "2024-06-20", **secret)
    assert r.returncode == 0, r.stderr
    sent_renewal = json.loads(r.stdout)
    assert sent_renewal["response"] == {
        "received": True,
        "event_id": sent_renewal["event"]["id"],
        "program_id": pid,
        "duplicate": False,
        "test_mode": False,
    }
    invoice = sent_renewal["transaction_id"]
    assert invoice == sent_renewal["event"]["data"]["object"]["id"] and invoice.startswith("in_")

    refund = (
        "charge.refunded",
        "--program",
        pid,
        "--payment-intent",
        checkout,
        "--amount",
        "4900",
        "--refunded",
        "1000",
    )
    r = tally(home, *trigger, *refund, **secret)
    assert r.returncode == 0, r.stderr
    assert f"of transaction {checkout}: 10.00 usd" in r.stdout
    r = tally(home, *trigger, "checkout.session.completed", "--program", pid, "--test-mode", **secret)
    assert r.returncode == 0 and "test mode (livemode: false): stored, never commissioned" in r.stdout
    r = tally(home, *trigger, "invoice.paid", "--program", pid, "--secret", "whsec_not_the_servers")
    assert (
        r.returncode == 4
        and r.stderr.startswith("tally: invalid_signature:")
        and len(r.stderr.splitlines()) == 1
    )

    assert tally(home, "reconcile", "--url", url, TALLY_OPERATOR_TOKEN=OPERATOR_TOKEN).returncode == 0
    sales = httpx.get(f"{url}/api/v1/programs/{pid}/sales", headers=owner, timeout=30).json()["data"]
    live = {s["transaction_id"]: s for s in sales if not s["test_mode"]}
    assert {t: (s["partner_code"], s["attribution_rule"], s["amount"]) for t, s in live.items()} == {
        checkout: ("alice", "click", 4900),
        invoice: ("bob", "customer_key", 2900),
    }
    assert live[checkout]["refunded"] == 1000
    [test_sale] = [s for s in sales if s["test_mode"]]
    assert not test_sale["commission"]  # stored, never commissioned
    r = tally(home, "explain", "--program", pid, "--transaction", checkout)
    assert r.returncode == 0 and "answer: attributed to alice by rule click" in r.stdout, r.stderr
