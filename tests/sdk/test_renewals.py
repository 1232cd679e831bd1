"""sdk.renewals: SEED 6.3 decisions on real invoice payloads (both layouts)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sdk.renewals import (
    RenewalDecision,
    RenewalSale,
    handle_invoice_paid,
    handle_invoice_paid_async,
    plan_renewal,
)
from tests.sdk.helpers import KEY, LEGACY_SALE, Script, async_client, client, err, legacy_cycle, ok
from tests.stripe_fixtures import TEMPLATE_NAME, load_event, with_metadata

SALE = {"sale_id": "sale_1", "transaction_id": "x", "test_mode": False, "attributed": True}


def new_cycle(amount: Any = 190) -> dict[str, Any]:
    """2025-03-31 layout: `parent.subscription_details` (go-foks template, made a renewal)."""
    event = load_event(TEMPLATE_NAME, event_type="invoice.paid")
    event = with_metadata(event, KEY, "parent")
    event["data"]["object"]["billing_reason"] = "subscription_cycle"
    event["data"]["object"]["amount_paid"] = amount
    return event


NEW_SALE = {
    "customerExternalId": "user_42",
    "invoiceId": "in_foks_0000000000000001",
    "amount": 190,
    "currency": "usd",
    "isRecurring": True,
    "saleType": "subscription",
    "subscriptionId": "sub_foks_0000000000000001",
    "occurred_at": "2025-04-18T18:13:20Z",
}


@pytest.mark.parametrize(("make", "body"), [(legacy_cycle, LEGACY_SALE), (new_cycle, NEW_SALE)])
def test_subscription_cycle_is_tracked(make: Any, body: dict[str, Any]) -> None:
    script = Script(ok(SALE))
    decision = handle_invoice_paid(make(), client(script))
    assert (decision.action, decision.code) == ("tracked", "tracked")
    assert decision.result is not None
    assert decision.result.data == SALE
    assert script.bodies == [body]
    assert str(script.requests[0].url).endswith("/api/v1/track/sale")
    assert decision.reason == (f"renewal invoice {body['invoiceId']} tracked: {body['amount']} usd")


@pytest.mark.parametrize(
    "reason",
    ["subscription_create", "subscription_update", "subscription_threshold", "manual", "upcoming", None],
)
@pytest.mark.parametrize("make", [legacy_cycle, new_cycle])
def test_other_billing_reasons_are_skipped(reason: str | None, make: Any) -> None:
    event = make()
    event["data"]["object"]["billing_reason"] = reason
    script = Script()
    decision = handle_invoice_paid(event, client(script))
    assert (decision.action, decision.code, decision.result) == ("skipped", "not_a_renewal", None)
    shown = repr(reason) if reason else "missing"
    assert decision.reason.startswith(f"billing_reason is {shown}, not 'subscription_cycle'")
    assert script.requests == []


@pytest.mark.parametrize("amount", [0, None, -100, 49.0, True, "4900"])
@pytest.mark.parametrize("make", [legacy_cycle, new_cycle])
def test_nothing_paid_is_skipped(amount: Any, make: Any) -> None:
    event = make(amount)
    script = Script()
    decision = handle_invoice_paid(event, client(script))
    assert (decision.action, decision.code) == ("skipped", "nothing_paid")
    assert decision.reason.startswith(f"amount_paid is {amount!r}")
    assert script.requests == []


def test_missing_amount_paid_key_is_skipped() -> None:
    event = legacy_cycle()
    del event["data"]["object"]["amount_paid"]
    assert plan_renewal(event) == RenewalDecision(
        "skipped",
        "amount_paid is None: nothing was paid (100% coupon or credit balance), "
        "and the SDK only tracks positive amounts",
        "nothing_paid",
    )


def test_only_invoice_paid_events() -> None:
    event = new_cycle()
    event["type"] = "invoice.payment_succeeded"
    decision = plan_renewal(event)
    assert decision == RenewalDecision(
        "skipped", "event type is 'invoice.payment_succeeded', not 'invoice.paid'", "not_invoice_paid"
    )
    assert isinstance(plan_renewal({"type": "invoice.paid", "data": {}}), RenewalDecision)


def test_missing_customer_key_is_skipped_with_a_hint() -> None:
    event = load_event("stripe-sync-engine__invoice_paid.json")
    event["data"]["object"]["amount_paid"] = 100
    script = Script()
    decision = handle_invoice_paid(event, client(script))
    assert (decision.action, decision.code) == ("skipped", "customer_key_missing")
    assert "subscription_data.metadata" in decision.reason
    assert "in_1KJqKBJDPojXS6LNJbvLUgEy" in decision.reason
    assert script.requests == []


def test_new_metadata_path_wins_and_legacy_is_the_fallback() -> None:
    event = with_metadata(new_cycle(), {"svc_customer_key": "legacy_user"}, "legacy")
    plan = plan_renewal(event)
    assert isinstance(plan, RenewalSale)
    assert plan.kwargs["customer_external_id"] == "user_42"
    event["data"]["object"]["parent"]["subscription_details"]["metadata"] = {}
    plan = plan_renewal(event)
    assert isinstance(plan, RenewalSale)
    assert plan.kwargs["customer_external_id"] == "legacy_user"


@pytest.mark.parametrize(
    ("parent_sub", "top_sub", "expected"),
    [
        ("sub_parent", "sub_top", "sub_parent"),
        ({"id": "sub_parent_obj"}, None, "sub_parent_obj"),
        (None, "sub_top", "sub_top"),
        (None, {"id": "sub_top_obj", "object": "subscription"}, "sub_top_obj"),
        (None, None, None),
    ],
)
def test_subscription_id_new_path_then_top_level(parent_sub: Any, top_sub: Any, expected: str | None) -> None:
    event = new_cycle()
    invoice = event["data"]["object"]
    invoice["parent"]["subscription_details"]["subscription"] = parent_sub
    invoice["subscription"] = top_sub
    plan = plan_renewal(event)
    assert isinstance(plan, RenewalSale)
    assert plan.kwargs.get("subscription_id") == expected


def test_already_recorded_invoice_is_skipped_not_raised() -> None:
    script = Script(err(409, "duplicate_transaction"))
    decision = handle_invoice_paid(legacy_cycle(), client(script))
    assert (decision.action, decision.code) == ("skipped", "already_tracked")
    assert decision.reason == (
        "invoice in_1KJqKBJDPojXS6LNJbvLUgEy is already recorded (duplicate_transaction)"
    )
    assert len(script.requests) == 1


def test_async_variant_shares_the_decisions() -> None:
    script = Script(ok(SALE))

    async def run() -> list[RenewalDecision]:
        tally = async_client(script)
        skipped = new_cycle()
        skipped["data"]["object"]["billing_reason"] = "subscription_create"
        return [
            await handle_invoice_paid_async(new_cycle(), tally),
            await handle_invoice_paid_async(skipped, tally),
        ]

    tracked, skipped = asyncio.run(run())
    assert (tracked.action, skipped.action, skipped.code) == ("tracked", "skipped", "not_a_renewal")
    assert script.bodies == [NEW_SALE]
