"""Self-hosted renewal handling (SEED section 6.3) for a brand's own Stripe webhook handler.

Only for brands that call `track_sale` themselves: with Tally's connect webhook active, do not
use this too, or renewals are counted twice.

    decision = handle_invoice_paid(event, tally)   # event: the parsed, verified Stripe event
    log.info("renewal %s: %s", decision.action, decision.reason)

Tracked: `invoice.paid` events with `billing_reason == "subscription_cycle"` and a positive
`amount_paid`. Skipped, with a reason and a `code`: other event types, other billing reasons
(the first payment is already counted at `checkout.session.completed`), nothing paid, no
`svc_customer_key` in the subscription metadata, and invoices already recorded (409).
Other API errors propagate, so the handler can answer 5xx and let Stripe redeliver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from tally_sdk._core import TrackResult
from tally_sdk.client import AsyncTally, Tally
from tally_sdk.errors import DuplicateError
from tally_sdk.responses import SaleData

CUSTOMER_KEY = "svc_customer_key"


@dataclass(frozen=True)
class RenewalDecision:
    """What the helper did with one event: `action`, a human `reason`, a stable `code`."""

    action: Literal["tracked", "skipped"]
    reason: str
    code: str
    result: TrackResult[SaleData] | None = None
    sale: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RenewalSale:
    """The `track_sale` keyword arguments planned for a renewal invoice."""

    kwargs: Mapping[str, Any] = field(default_factory=dict)


def plan_renewal(event: Mapping[str, Any]) -> RenewalSale | RenewalDecision:
    """Decide, without I/O, whether an event is a renewal to track (a plan) or a skip."""
    event_type = event.get("type") if isinstance(event, Mapping) else None
    if event_type != "invoice.paid":
        return _skip("not_invoice_paid", f"event type is {event_type!r}, not 'invoice.paid'")
    invoice = _get(event, "data", "object")
    invoice_id = _id(invoice)
    if not isinstance(invoice, Mapping) or invoice_id is None:
        return _skip("not_an_invoice", "the event carries no invoice object with an id")
    reason = invoice.get("billing_reason")
    if reason != "subscription_cycle":
        shown = repr(reason) if reason is not None else "missing"
        return _skip(
            "not_a_renewal",
            f"billing_reason is {shown}, not 'subscription_cycle': only renewals are tracked here "
            "(the first payment is counted at checkout.session.completed)",
        )
    amount = invoice.get("amount_paid")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return _skip(
            "nothing_paid",
            f"amount_paid is {amount!r}: nothing was paid (100% coupon or credit balance), "
            "and the SDK only tracks positive amounts",
        )
    customer_key = _customer_key(invoice)
    if customer_key is None:
        return _skip(
            "customer_key_missing",
            f"invoice {invoice_id}: no svc_customer_key in the subscription metadata "
            "(parent.subscription_details.metadata or subscription_details.metadata); "
            "set subscription_data.metadata when creating the checkout session",
        )
    kwargs: dict[str, Any] = {
        "customer_external_id": customer_key,
        "amount": amount,
        "invoice_id": invoice_id,
        "currency": _text(invoice.get("currency"), "usd").lower(),
        "is_recurring": True,
        "sale_type": "subscription",
        "subscription_id": _id(_get(invoice, "parent", "subscription_details", "subscription"))
        or _id(invoice.get("subscription")),
        "occurred_at": _paid_at(invoice),
    }
    return RenewalSale({k: v for k, v in kwargs.items() if v is not None})


def handle_invoice_paid(event: Mapping[str, Any], client: Tally) -> RenewalDecision:
    """Track a renewal with `client.track_sale`, or skip it and say why."""
    plan = plan_renewal(event)
    if isinstance(plan, RenewalDecision):
        return plan
    try:
        result = client.track_sale(**plan.kwargs)
    except DuplicateError as exc:
        return _already(plan, exc)
    return _tracked(plan, result)


async def handle_invoice_paid_async(event: Mapping[str, Any], client: AsyncTally) -> RenewalDecision:
    """`handle_invoice_paid` for `AsyncTally`."""
    plan = plan_renewal(event)
    if isinstance(plan, RenewalDecision):
        return plan
    try:
        result = await client.track_sale(**plan.kwargs)
    except DuplicateError as exc:
        return _already(plan, exc)
    return _tracked(plan, result)


def _tracked(plan: RenewalSale, result: TrackResult[SaleData]) -> RenewalDecision:
    sale = plan.kwargs
    reason = f"renewal invoice {sale['invoice_id']} tracked: {sale['amount']} {sale['currency']}"
    return RenewalDecision("tracked", reason, "tracked", result, plan.kwargs)


def _already(plan: RenewalSale, exc: DuplicateError) -> RenewalDecision:
    reason = f"invoice {plan.kwargs['invoice_id']} is already recorded ({exc.code})"
    return RenewalDecision("skipped", reason, "already_tracked", None, plan.kwargs)


def _skip(code: str, reason: str) -> RenewalDecision:
    return RenewalDecision("skipped", reason, code)


def _customer_key(invoice: Mapping[str, Any]) -> str | None:
    for path in (("parent", "subscription_details", "metadata"), ("subscription_details", "metadata")):
        value = _get(invoice, *path, CUSTOMER_KEY)
        if isinstance(value, str) and value:
            return value
    return None


def _paid_at(invoice: Mapping[str, Any]) -> datetime | None:
    paid_at = _get(invoice, "status_transitions", "paid_at")
    if isinstance(paid_at, bool) or not isinstance(paid_at, int):
        return None
    try:
        return datetime.fromtimestamp(paid_at, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def _id(value: Any) -> str | None:
    value = value.get("id") if isinstance(value, Mapping) else value
    return value if isinstance(value, str) and value else None


def _text(value: Any, default: str) -> str:
    return value if isinstance(value, str) and value else default
