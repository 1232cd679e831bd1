"""sdk.renewals: SEED 6.3 decisions on real invoice payloads (both layouts), tracked into the
real app (`RealApp`); the skipped ones never reach it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tally_sdk.renewals import (
    RenewalDecision,
    RenewalSale,
    handle_invoice_paid,
    handle_invoice_paid_async,
    plan_renewal,
)
from tests.conftest import World
from tests.sdk.helpers import (
    KEY,
    LEGACY_SALE,
    RealApp,
    legacy_cycle,
    real_async_client,
    real_client,
    settled_lead,
)
from tests.stripe_fixtures import TEMPLATE_NAME, load_event, with_metadata


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
def test_subscription_cycle_is_tracked(world: World, make: Any, body: dict[str, Any]) -> None:
    settled_lead(world, "user_42")
    app = RealApp(world)
    decision = handle_invoice_paid(make(), real_client(app))
    assert (decision.action, decision.code) == ("tracked", "tracked")
    assert decision.result is not None
    assert decision.result.data == {
        "sale_id": decision.result.data["sale_id"],
        "transaction_id": body["invoiceId"],
        "test_mode": False,
        "attributed": True,
        "partner_code": "alice",
        "customer_external_id": "user_42",
        "amount": body["amount"],
        "currency": "usd",
    }
    assert app.bodies == [body]
    assert str(app.requests[0].url).endswith("/api/v1/track/sale")
    assert decision.reason == (f"renewal invoice {body['invoiceId']} tracked: {body['amount']} usd")


@pytest.mark.parametrize(
    "reason",
    ["subscription_create", "subscription_update", "subscription_threshold", "manual", "upcoming", None],
)
@pytest.mark.parametrize("make", [legacy_cycle, new_cycle])
def test_other_billing_reasons_are_skipped(world: World, reason: str | None, make: Any) -> None:
    event = make()
    event["data"]["object"]["billing_reason"] = reason
    app = RealApp(world)
    decision = handle_invoice_paid(event, real_client(app))
    assert (decision.action, decision.code, decision.result) == ("skipped", "not_a_renewal", None)
    shown = repr(reason) if reason else "missing"
    assert decision.reason.startswith(f"billing_reason is {shown}, not 'subscription_cycle'")
    assert app.requests == []


@pytest.mark.parametrize("amount", [0, None, -100, 49.0, True, "4900"])
@pytest.mark.parametrize("make", [legacy_cycle, new_cycle])
def test_nothing_paid_is_skipped(world: World, amount: Any, make: Any) -> None:
    event = make(amount)
    app = RealApp(world)
    decision = handle_invoice_paid(event, real_client(app))
    assert (decision.action, decision.code) == ("skipped", "nothing_paid")
    assert decision.reason.startswith(f"amount_paid is {amount!r}")
    assert app.requests == []


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


def test_missing_customer_key_is_skipped_with_a_hint(world: World) -> None:
    event = load_event("stripe-sync-engine__invoice_paid.json")
    event["data"]["object"]["amount_paid"] = 100
    app = RealApp(world)
    decision = handle_invoice_paid(event, real_client(app))
    assert (decision.action, decision.code) == ("skipped", "customer_key_missing")
    assert "subscription_data.metadata" in decision.reason
    assert "in_1KJqKBJDPojXS6LNJbvLUgEy" in decision.reason
    assert app.requests == []


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


def test_already_recorded_invoice_is_skipped_not_raised(world: World) -> None:
    invoice = LEGACY_SALE["invoiceId"]
    assert world.sale(transaction_id=invoice, customer_external_id="user_42").status_code == 200
    app = RealApp(world)
    decision = handle_invoice_paid(legacy_cycle(), real_client(app))
    assert (decision.action, decision.code) == ("skipped", "already_tracked")
    assert decision.reason == f"invoice {invoice} is already recorded (duplicate_transaction)"
    assert len(app.requests) == 1


def test_async_variant_shares_the_decisions(world: World) -> None:
    app = RealApp(world)

    async def run() -> list[RenewalDecision]:
        tally = real_async_client(app)
        skipped = new_cycle()
        skipped["data"]["object"]["billing_reason"] = "subscription_create"
        return [
            await handle_invoice_paid_async(new_cycle(), tally),
            await handle_invoice_paid_async(skipped, tally),
        ]

    tracked, skipped = asyncio.run(run())
    assert (tracked.action, skipped.action, skipped.code) == ("tracked", "skipped", "not_a_renewal")
    assert app.bodies == [NEW_SALE]
    assert tracked.result is not None
    assert tracked.result.data["transaction_id"] == NEW_SALE["invoiceId"]
    assert [w["code"] for w in tracked.result.warnings] == ["customer_not_attributed"]  # no lead
