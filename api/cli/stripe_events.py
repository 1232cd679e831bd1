"""Stripe-format events as Stripe sends them, signed as Stripe signs them, for `tally stripe
trigger` and `tally demo`.

Each builder returns an object with the fields Stripe's own API fixtures have (its OpenAPI
fixtures; tests/test_cli_stripe.py checks every key against them), in the 2025-03-31 ("basil")
layout or, for an invoice of an older API version, the legacy one (`subscription` and
`subscription_details` at the top). The event envelope is Stripe's, with the Connect `account`
when one is given. Delivery posts the bytes it signed: `Stripe-Signature: t=<unix>,v1=<hex>`,
HMAC-SHA256 of `"{t}.{body}"` with the endpoint's secret (ingest/stripe.py `sign`, the same
function the server verifies with)."""

from __future__ import annotations

import json
import os
import secrets
import string
import time
from typing import Any

import httpx

from ingest.stripe import sign

API_VERSION = "2025-03-31.basil"  # the API version whose invoices carry `parent`
WEBHOOK_PATH = "/webhooks/stripe"  # CONTRACT section 5
USER_AGENT = "Stripe/1.0 (+https://stripe.com/docs/webhooks)"  # what Stripe's deliveries send
_ALPHABET = string.ascii_letters + string.digits


def configured_secret() -> str | None:
    """The signing secret the server is configured with, as this environment has it: the first
    of TALLY_STRIPE_WEBHOOK_SECRETS (comma-separated, so secrets can be rolled)."""
    found = [s.strip() for s in os.environ.get("TALLY_STRIPE_WEBHOOK_SECRETS", "").split(",") if s.strip()]
    return found[0] if found else None


def new_id(prefix: str) -> str:
    """A Stripe-like object id: `pi_` + 24 random letters and digits."""
    return f"{prefix}_{''.join(secrets.choice(_ALPHABET) for _ in range(24))}"


def legacy_layout(api_version: str) -> bool:
    """Whether invoices of this API version name their subscription at the top (before 2025-03-31)."""
    return api_version[:10] < API_VERSION[:10]


def event(
    event_type: str,
    obj: dict[str, Any],
    *,
    created: int,
    livemode: bool = True,
    account: str | None = None,
    event_id: str | None = None,
    api_version: str = API_VERSION,
) -> dict[str, Any]:
    """A Stripe event envelope around `obj` (with the Connect `account` when given)."""
    envelope: dict[str, Any] = {
        "id": event_id or new_id("evt"),
        "object": "event",
        "api_version": api_version,
        "created": created,
        "data": {"object": obj},
        "livemode": livemode,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": event_type,
    }
    if account:
        envelope["account"] = account
    return envelope


def checkout_session(
    *,
    amount: int,
    currency: str,
    customer: str,
    email: str | None,
    metadata: dict[str, str],
    created: int,
    mode: str = "payment",
    session_id: str | None = None,
    payment_intent: str | None = None,
    subscription: str | None = None,
    invoice: str | None = None,
    tax: int = 0,
    livemode: bool = True,
) -> dict[str, Any]:
    """A paid Checkout Session: `mode` payment (names its payment intent) or subscription
    (names its subscription and first invoice)."""
    return {
        "id": session_id or new_id("cs_live" if livemode else "cs_test"),
        "object": "checkout.session",
        "amount_subtotal": amount - tax,
        "amount_total": amount,
        "created": created,
        "currency": currency,
        "customer": customer,
        "customer_details": {"email": email, "name": None, "phone": None, "tax_exempt": "none"},
        "customer_email": email,
        "invoice": invoice,
        "livemode": livemode,
        "metadata": metadata,
        "mode": mode,
        "payment_intent": payment_intent,
        "payment_status": "paid",
        "status": "complete",
        "subscription": subscription,
        "total_details": {"amount_discount": 0, "amount_shipping": 0, "amount_tax": tax},
    }


def invoice(
    *,
    invoice_id: str,
    amount: int,
    currency: str,
    customer: str,
    email: str | None,
    subscription: str | None,
    billing_reason: str,
    paid_at: int,
    metadata: dict[str, str] | None,
    legacy: bool = False,
    tax: int = 0,
    livemode: bool = True,
) -> dict[str, Any]:
    """A paid invoice; a subscription's metadata under `parent.subscription_details` (2025-03-31
    and later) or, `legacy`, under the top-level `subscription_details`."""
    obj: dict[str, Any] = {
        "id": invoice_id,
        "object": "invoice",
        "amount_due": amount,
        "amount_paid": amount,
        "amount_remaining": 0,
        "billing_reason": billing_reason,
        "created": paid_at,
        "currency": currency,
        "customer": customer,
        "customer_email": email,
        "livemode": livemode,
        "metadata": {},
        "status": "paid",
        "status_transitions": {"finalized_at": paid_at, "paid_at": paid_at},
        "subtotal": amount - tax,
        "total": amount,
    }
    details = {"metadata": metadata or {}}
    if legacy:  # tax as `tax` and `total_tax_amounts`, the subscription at the top
        obj["tax"] = tax or None
        obj["total_tax_amounts"] = [{"amount": tax, "inclusive": False}] if tax else []
        obj["subscription"] = subscription
        obj["subscription_details"] = details
        return obj
    obj["total_taxes"] = [{"amount": tax, "tax_behavior": "exclusive"}] if tax else []
    if subscription is not None:
        obj["parent"] = {
            "type": "subscription_details",
            "subscription_details": {"subscription": subscription, **details},
        }
    else:
        obj["parent"] = None
    return obj


def refunded_charge(
    *,
    amount: int,
    refunded: int,
    currency: str,
    customer: str,
    payment_intent: str | None,
    created: int,
    metadata: dict[str, str] | None = None,
    charge_id: str | None = None,
    refund_id: str | None = None,
    livemode: bool = True,
) -> dict[str, Any]:
    """A charge of `amount` with `refunded` of it refunded, its newest refund listed."""
    charge = charge_id or new_id("ch")
    refund = {
        "id": refund_id or new_id("re"),
        "object": "refund",
        "amount": refunded,
        "charge": charge,
        "created": created,
        "currency": currency,
        "metadata": {},
        "payment_intent": payment_intent,
        "reason": None,
        "status": "succeeded",
    }
    return {
        "id": charge,
        "object": "charge",
        "amount": amount,
        "amount_captured": amount,
        "amount_refunded": refunded,
        "captured": True,
        "created": created,
        "currency": currency,
        "customer": customer,
        "livemode": livemode,
        "metadata": metadata or {},
        "paid": True,
        "payment_intent": payment_intent,
        "refunded": refunded >= amount,
        "refunds": {
            "object": "list",
            "data": [refund],
            "has_more": False,
            "url": f"/v1/charges/{charge}/refunds",
        },
        "status": "succeeded",
    }


def subscription(
    *,
    subscription_id: str,
    customer: str,
    currency: str,
    metadata: dict[str, str],
    created: int,
    livemode: bool = True,
) -> dict[str, Any]:
    """An active subscription with its metadata (what backfill reads)."""
    return {
        "id": subscription_id,
        "object": "subscription",
        "created": created,
        "currency": currency,
        "customer": customer,
        "livemode": livemode,
        "metadata": metadata,
        "start_date": created,
        "status": "active",
    }


def invoice_payment(
    *, invoice_id: str, payment_intent: str, amount: int, currency: str, paid_at: int, livemode: bool = True
) -> dict[str, Any]:
    """An `InvoicePayment` (API 2025-03-31+): which payment intent paid an invoice."""
    return {
        "id": new_id("inpay"),
        "object": "invoice_payment",
        "amount_paid": amount,
        "amount_requested": amount,
        "created": paid_at,
        "currency": currency,
        "invoice": invoice_id,
        "is_default": True,
        "livemode": livemode,
        "payment": {"type": "payment_intent", "payment_intent": payment_intent},
        "status": "paid",
        "status_transitions": {"canceled_at": None, "paid_at": paid_at},
    }


def serialise(envelope: dict[str, Any]) -> bytes:
    """The body as Stripe sends it (indented JSON); the signature covers exactly these bytes."""
    return json.dumps(envelope, indent=2).encode()


def deliver(
    client: httpx.Client, url: str, envelope: dict[str, Any], secret: str, now: int | None = None
) -> httpx.Response:
    """POST the event to the server's webhook path, signed with `secret` at `now` (default: the
    current time, which the server's tolerance checks)."""
    body = serialise(envelope)
    header = sign(body, secret, int(time.time()) if now is None else now)
    return client.post(
        url + WEBHOOK_PATH,
        content=body,
        headers={
            "Stripe-Signature": header,
            "Content-Type": "application/json; charset=utf-8",
            "User-Agent": USER_AGENT,
        },
    )
