"""`tally demo`: a demo workspace, program and partners, then realistic traffic through the real
HTTP endpoints (signed connect webhooks in both invoice layouts, a renewal without subscription
metadata, a self-hosted double count, refunds, test sales), a reconcile run, and where to look.

Idempotent: what it made is remembered in a state file (mode 0600); a re-run reuses the account
and program, re-sends the same fixed ids (the server answers them as duplicates) and reconciles.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from api.cli import stripe_events as stripe
from api.cli.client import BUSY_TRIES, busy_wait
from api.cli.errors import CliError

ACCOUNT = "acct_demo_brand"  # the demo program's Connect account id


@dataclass
class Demo:
    url: str
    operator: str
    secret: str
    client: httpx.Client
    program_id: str = ""
    api_key: str = ""

    def post(
        self,
        path: str,
        body: Any,
        token: str | None = None,
        expect: tuple[int, ...] = (200, 201),
        method: str = "POST",
    ) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = self.client.request(method, self.url + path, json=body, headers=headers)
        for _ in range(BUSY_TRIES):  # the scheduled run holds the lock: nothing was done yet
            wait = busy_wait(r)
            if wait is None:
                break
            time.sleep(wait)
            r = self.client.request(method, self.url + path, json=body, headers=headers)
        if r.status_code not in expect:
            raise CliError(f"demo: {method} {path} -> {r.status_code} {r.text[:200]}")
        return r.json().get("data") if r.content else None

    def webhook(self, event: dict[str, Any]) -> None:
        r = stripe.deliver(self.client, self.url, event, self.secret)
        if r.status_code != 200:
            raise CliError(f"demo: webhook {event['id']} -> {r.status_code} {r.text[:200]}")


def _ts(days_ago: float) -> int:
    return int((datetime.now(UTC) - timedelta(days=days_ago)).timestamp())


def _meta(program_id: str, click: str | None, customer: str) -> dict[str, str]:
    meta = {"svc_customer_key": customer, "program_id": program_id}
    if click:
        meta["svc_click_id"] = click
    return meta


def _event(eid: str, etype: str, obj: dict[str, Any], days_ago: float, live: bool = True) -> dict[str, Any]:
    return stripe.event(etype, obj, created=_ts(days_ago), livemode=live, account=ACCOUNT, event_id=eid)


def _session(
    sid: str,
    mode: str,
    amount: int,
    currency: str,
    customer: str,
    email: str,
    meta: dict[str, str],
    days_ago: float,
    **extra: Any,
) -> dict[str, Any]:
    return stripe.checkout_session(
        session_id=sid,
        mode=mode,
        amount=amount,
        currency=currency,
        customer=customer,
        email=email,
        metadata=meta,
        created=_ts(days_ago),
        **extra,
    )


def _invoice(
    iid: str,
    amount: int,
    customer: str,
    sub: str,
    reason: str,
    days_ago: float,
    sub_meta: dict[str, str] | None,
    legacy: bool = False,
    currency: str = "usd",
) -> dict[str, Any]:
    return stripe.invoice(
        invoice_id=iid,
        amount=amount,
        currency=currency,
        customer=customer,
        email=None,
        subscription=sub,
        billing_reason=reason,
        paid_at=_ts(days_ago),
        metadata=sub_meta,
        legacy=legacy,
    )


def _setup(demo: Demo, state: Path) -> dict[str, Any]:
    if state.exists():
        saved: dict[str, Any] = json.loads(state.read_text())
        r = demo.client.get(
            demo.url + "/api/v1/programs", headers={"Authorization": f"Bearer {saved['token']}"}
        )
        if r.status_code == 200:
            return saved
    acct = demo.post(
        "/api/v1/operator/accounts",
        {"email": "owner@demo-brand.test", "workspace_name": "Demo brand"},
        demo.operator,
    )
    owner = acct["token"]
    program = demo.post(
        "/api/v1/programs",
        {
            "workspace_id": acct["workspace_id"],
            "name": "Demo partner program",
            "commission_type": "percent",
            "commission_bps": 3000,
            "platform_fee_bps": 500,
            "recurring_months": 12,
            "holding_days": 30,
            "stripe_account_id": ACCOUNT,
        },
        owner,
    )
    key = demo.post(f"/api/v1/programs/{program['program_id']}/api-key", None, owner)["api_key"]
    for code, name, method in (("alice", "Alice Partner", "paypal"), ("bob", "Bob Partner", "wise")):
        demo.post(
            f"/api/v1/programs/{program['program_id']}/partners",
            {"code": code, "name": name, "email": f"{code}@partners.test"},
            owner,
        )
        # how each is paid (a batch pays only partners with payout details: CONTRACT 15)
        demo.post(
            f"/api/v1/programs/{program['program_id']}/partners/{code}",
            {
                "payout_method": method,
                "payout_email": f"{code}@partners.test",
                "payout_name": name,
                "payout_currency": "usd",
            },
            owner,
            method="PATCH",
        )
    saved = {
        "url": demo.url,
        "token": owner,
        "workspace_id": acct["workspace_id"],
        "program_id": program["program_id"],
        "api_key": key,
    }
    _save(state, saved)
    return saved


def _save(state: Path, saved: dict[str, Any]) -> None:
    state.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(saved, fh)


def _traffic(demo: Demo, saved: dict[str, Any]) -> None:
    pid, key = saved["program_id"], saved["api_key"]
    clicks = {}
    for customer, partner in (("u_ana", "alice"), ("u_ben", "alice"), ("u_cy", "bob"), ("u_dee", "bob")):
        clicks[customer] = demo.post(
            "/api/v1/track/click",
            {"program_id": pid, "partner_code": partner, "url": f"https://demo-brand.test/?aff={partner}"},
        )["click_id"]
        demo.post(
            "/api/v1/track/lead",
            {
                "customer_external_id": customer,
                "email": f"{customer}@buyers.test",
                "click_id": clicks[customer],
            },
            key,
        )
    # one-time checkout (mode payment), attributed by click id; later partly refunded by the processor
    demo.webhook(
        _event(
            "evt_demo_pay_1",
            "checkout.session.completed",
            _session(
                "cs_demo_pay_1",
                "payment",
                12000,
                "usd",
                "cus_ana",
                "u_ana@buyers.test",
                _meta(pid, clicks["u_ana"], "u_ana"),
                65,
                payment_intent="pi_demo_pay_1",
            ),
            65,
        )
    )
    demo.webhook(
        _event(
            "evt_demo_refund_1",
            "charge.refunded",
            stripe.refunded_charge(
                charge_id="ch_demo_pay_1",
                refund_id="re_demo_1",
                amount=12000,
                refunded=3000,
                currency="usd",
                customer="cus_ana",
                payment_intent="pi_demo_pay_1",
                created=_ts(20),
            ),
            20,
        )
    )
    # subscription with metadata on the session and on the subscription: checkout + first invoice = one sale
    meta_ben = _meta(pid, clicks["u_ben"], "u_ben")
    demo.webhook(
        _event(
            "evt_demo_sub_1",
            "checkout.session.completed",
            _session(
                "cs_demo_sub_1",
                "subscription",
                4900,
                "usd",
                "cus_ben",
                "u_ben@buyers.test",
                meta_ben,
                62,
                subscription="sub_demo_ben",
                invoice="in_demo_ben_1",
            ),
            62,
        )
    )
    demo.webhook(
        _event(
            "evt_demo_sub_1_inv",
            "invoice.paid",
            _invoice("in_demo_ben_1", 4900, "cus_ben", "sub_demo_ben", "subscription_create", 62, meta_ben),
            62,
        )
    )
    # renewals: 2025-03-31 layout, then the legacy layout
    demo.webhook(
        _event(
            "evt_demo_ben_2",
            "invoice.paid",
            _invoice("in_demo_ben_2", 4900, "cus_ben", "sub_demo_ben", "subscription_cycle", 32, meta_ben),
            32,
        )
    )
    demo.webhook(
        _event(
            "evt_demo_ben_3",
            "invoice.payment_succeeded",
            _invoice(
                "in_demo_ben_3",
                4900,
                "cus_ben",
                "sub_demo_ben",
                "subscription_cycle",
                2,
                meta_ben,
                legacy=True,
            ),
            2,
        )
    )
    # subscription sold WITHOUT subscription_data.metadata: renewals carry no attribution metadata
    meta_cy = _meta(pid, clicks["u_cy"], "u_cy")
    demo.webhook(
        _event(
            "evt_demo_sub_2",
            "checkout.session.completed",
            _session(
                "cs_demo_sub_2",
                "subscription",
                2900,
                "usd",
                "cus_cy",
                "u_cy@buyers.test",
                meta_cy,
                50,
                subscription="sub_demo_cy",
                invoice="in_demo_cy_1",
            ),
            50,
        )
    )
    demo.webhook(
        _event(
            "evt_demo_cy_2",
            "invoice.paid",
            _invoice("in_demo_cy_2", 2900, "cus_cy_other", "sub_demo_cy", "subscription_cycle", 20, None),
            20,
        )
    )
    # self-hosted double count: the brand also reports the connect sale with trackSale
    demo.post(
        "/api/v1/track/sale",
        {"invoiceId": "in_demo_dee_1", "customerExternalId": "u_dee", "amount": 9900, "currency": "eur"},
        key,
        expect=(200, 409),
    )
    demo.webhook(
        _event(
            "evt_demo_dee_1",
            "invoice.paid",
            _invoice(
                "in_demo_dee_1",
                9900,
                "cus_dee",
                "sub_demo_dee",
                "subscription_cycle",
                5,
                _meta(pid, clicks["u_dee"], "u_dee"),
                currency="eur",
            ),
            5,
        )
    )
    demo.post(
        "/api/v1/track/sale",
        {"invoiceId": "in_demo_dee_1", "customerExternalId": "u_dee", "amount": 9900},
        key,
        expect=(409,),
    )
    # a self-hosted sale and its refund
    demo.post(
        "/api/v1/track/sale",
        {"invoiceId": "inv_selfhosted_1", "customerExternalId": "u_ana", "amount": 5000},
        key,
        expect=(200, 409),
    )
    demo.post(
        "/api/v1/track/refund",
        {"transaction_id": "inv_selfhosted_1", "refund_id": "rf_demo_1", "amount": 5000},
        key,
        expect=(200, 409),
    )
    # test traffic: a test-mode sale (once: test sales carry no id to deduplicate them by) and a
    # livemode=false processor event; neither is ever commissioned
    if not saved.get("test_sale_sent"):
        demo.post("/api/v1/track/sale", {"additional_data": {"test_mode": True}}, key)
        saved["test_sale_sent"] = True
    demo.webhook(
        _event(
            "evt_demo_test_1",
            "checkout.session.completed",
            _session(
                "cs_demo_test_1",
                "payment",
                100,
                "usd",
                "cus_test",
                "test@buyers.test",
                _meta(pid, None, "u_ana"),
                1,
                livemode=False,
            ),
            1,
            live=False,
        )
    )


def _payouts(demo: Demo, saved: dict[str, Any]) -> dict[str, Any]:
    """Finance pays: a batch of what was approved and dated up to the end of last month, marked
    paid; then a refund of a paid sale, which becomes a clawback line the next batch nets. Run
    again: nothing new to pay for that cut-off, the same batch (paid already)."""
    pid, owner = saved["program_id"], saved["token"]
    up_to = (datetime.now(UTC).date().replace(day=1) - timedelta(days=1)).isoformat()
    batch: dict[str, Any] = demo.post(f"/api/v1/programs/{pid}/payouts", {"up_to": up_to}, owner)
    if batch["payout_id"] and batch["status"] == "open":
        batch = demo.post(f"/api/v1/programs/{pid}/payouts/{batch['payout_id']}/paid", None, owner)
    demo.post(
        "/api/v1/track/refund",
        {"transaction_id": "in_demo_ben_1", "refund_id": "rf_demo_after_payout", "amount": 1000},
        saved["api_key"],
        expect=(200, 409),
    )
    return batch


def run_demo(url: str, operator_token: str, state: Path) -> None:
    secret = stripe.configured_secret()
    if secret is None:
        raise CliError("tally demo signs webhooks: set TALLY_STRIPE_WEBHOOK_SECRETS as the server has it")
    with httpx.Client(timeout=60) as client:
        demo = Demo(url, operator_token, secret, client)
        for _ in range(100):
            try:
                if client.get(url + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        saved = _setup(demo, state)
        _traffic(demo, saved)
        _save(state, saved)
        batch = _payouts(demo, saved)
        summary = demo.post("/api/v1/operator/reconcile", None, operator_token)
    print(
        f"demo: program {saved['program_id']} reconciled ({summary['sales']} sales, "
        f"{summary['commissions']} commission lines)"
    )
    if batch["payout_id"]:
        paid = (
            ", ".join(f"{t['amount_decimal']} {t['currency'].upper()}" for t in batch["totals"]) or "nothing"
        )
        print(f"demo: payout {batch['payout_id']} up to {batch['up_to']} {batch['status']} ({paid})")
    print(f"demo: dashboard {url}/dashboard  (log in with the account token in {state})")
    shop = f"{url}/demo/shop?{urlencode({'program_id': saved['program_id'], 'aff': 'alice'})}"
    print(f"demo: a brand page with the browser script {shop}  (a click for alice, then a sign-up)")
    print(
        f"demo: try `tally login --url {url} --token <token>` then "
        f"`tally explain --program {saved['program_id']} --transaction in_demo_cy_2`"
    )
