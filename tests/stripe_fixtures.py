"""Public Stripe payloads from `tests/fixtures/stripe-public/` (provenance and licences in its
README), as event envelopes for tests.

Reused by the webhook endpoint, reconciler and SDK tests:

- `fixture_names()` lists every payload file; `load_event(name)` returns it as an event envelope
  (data blocks and bare objects are wrapped; the go-foks Go template is rendered first);
- `with_metadata(event, metadata, where=...)` returns a copy with attribution metadata added on
  the object (`"object"`), on `parent.subscription_details.metadata` (`"parent"`, API 2025-03-31+)
  or on legacy top-level `subscription_details.metadata` (`"legacy"`);
- `serialise(event)` gives the bytes to POST; `signed_delivery(...)` adds a Stripe-Signature header.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ingest.stripe import sign

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures" / "stripe-public"

TEMPLATE_NAME = "go-foks__paymentSuccessWebhookJson.invoice.payment_succeeded.json.tmpl"

# Plausible values for the go-foks template's `{{ .X }}` placeholders (numbers are unquoted there).
TEMPLATE_VALUES: dict[str, str | int] = {
    "EventID": "evt_foks_0000000000000001",
    "InvoiceID": "in_foks_0000000000000001",
    "CustomerID": "cus_foks00000000001",
    "Email": "renewal@example.com",
    "IlID": "il_foks_0000000000000001",
    "SubscriptionID": "sub_foks_0000000000000001",
    "SubscriptionItemID": "si_foks00000000001",
    "PriceID": "price_foks_0000000000000001",
    "PlanID": "prod_foks00000000001",
    "AmountDecimal": "190",
    "Amount": 190,
    "TimeCreated": 1745000000,
    "PeriodStart": 1745000000,
    "PeriodEnd": 1745086400,
}

# Event types for the files that hold only a data block or a bare object.
WRAPPED_EVENT_TYPES: dict[str, str] = {
    "pay__charge.refunded.json": "charge.refunded",
    "pay__checkout.session.completed.json": "checkout.session.completed",
    "pay__subscription.updated.json": "customer.subscription.updated",
    "pay__invoice.json": "invoice.paid",
    "dj-stripe__invoice_in_fakefakefakefakefake0001.json": "invoice.paid",
    "openapi__fixtures3.invoice.json": "invoice.paid",
    "openapi__fixtures3.checkout.session.json": "checkout.session.completed",
    "openapi__fixtures3.charge.json": "charge.succeeded",
    "openapi__fixtures3.refund.json": "refund.created",
    "openapi__fixtures3.subscription.json": "customer.subscription.updated",
}

DEFAULT_CREATED = 1_700_000_000
_PLACEHOLDER = re.compile(r"\{\{\s*\.(\w+)\s*\}\}")


def fixture_names() -> list[str]:
    """Every payload file in the fixtures directory (the README excluded), sorted."""
    return sorted(p.name for p in FIXTURES_DIR.iterdir() if p.name != "README.md")


def render_template(text: str, values: Mapping[str, str | int] | None = None) -> str:
    """Substitute the go-foks template's `{{ .X }}` placeholders; unknown names raise KeyError."""
    chosen = {**TEMPLATE_VALUES, **(values or {})}
    return _PLACEHOLDER.sub(lambda m: str(chosen[m.group(1)]), text)


def load_raw(name: str) -> Any:
    """The fixture file parsed as JSON (templates rendered with `TEMPLATE_VALUES`)."""
    text = (FIXTURES_DIR / name).read_text(encoding="utf-8")
    if name.endswith(".tmpl"):
        text = render_template(text)
    return json.loads(text)


def load_event(
    name: str,
    *,
    event_type: str | None = None,
    event_id: str | None = None,
    created: int | None = None,
    livemode: bool | None = None,
    account: str | None = None,
) -> dict[str, Any]:
    """The fixture as an event envelope; keyword arguments override the envelope's fields."""
    raw = load_raw(name)
    if raw.get("object") == "event":
        event: dict[str, Any] = raw
    else:
        data = raw if isinstance(raw.get("object"), dict) else {"object": raw}
        obj = data["object"]
        stem = re.sub(r"[^a-zA-Z0-9]+", "_", name.removesuffix(".json"))
        event = {
            "id": f"evt_fixture_{stem}",
            "object": "event",
            "api_version": "2020-08-27",
            "created": obj.get("created") if isinstance(obj.get("created"), int) else None,
            "data": data,
            "livemode": obj.get("livemode") is True,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": WRAPPED_EVENT_TYPES[name],
        }
        event["created"] = event["created"] or DEFAULT_CREATED
    overrides = {
        "type": event_type,
        "id": event_id,
        "created": created,
        "livemode": livemode,
        "account": account,
    }
    event.update({k: v for k, v in overrides.items() if v is not None})
    return event


def with_metadata(
    event: Mapping[str, Any],
    metadata: Mapping[str, str],
    where: Literal["object", "parent", "legacy"] = "object",
) -> dict[str, Any]:
    """A deep copy of `event` with `metadata` merged in at the chosen place of `data.object`."""
    out: dict[str, Any] = copy.deepcopy(dict(event))
    obj = out["data"]["object"]
    if where == "object":
        target = obj
    elif where == "parent":
        if not isinstance(obj.get("parent"), dict):
            obj["parent"] = {"type": "subscription_details", "quote_details": None}
        parent = obj["parent"]
        if not isinstance(parent.get("subscription_details"), dict):
            parent["subscription_details"] = {"metadata": None, "subscription": None}
        target = parent["subscription_details"]
    else:
        if not isinstance(obj.get("subscription_details"), dict):
            obj["subscription_details"] = {"metadata": None}
        target = obj["subscription_details"]
    target["metadata"] = {**(target.get("metadata") or {}), **metadata}
    return out


def serialise(event: Mapping[str, Any]) -> bytes:
    """The event as a compact JSON body, as Stripe would POST it."""
    return json.dumps(event, separators=(",", ":")).encode("utf-8")


def signed_delivery(event: Mapping[str, Any], secret: str, timestamp: int) -> tuple[bytes, str]:
    """`(body, Stripe-Signature header)` of a delivery signed with `secret` at `timestamp`."""
    body = serialise(event)
    return body, sign(body, secret, timestamp)
