"""Refunds of renewals in Stripe API 2025-03-31 and later (CONTRACT section 5), through the real
app on both backends, signed with real HMAC: the invoice names no payment intent or charge and
the `charge.refunded` names only its payment intent, so the `invoice_payment.paid` linking the
two is how the refund finds its sale, whichever of the three arrives first."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import ACCOUNT, deliver, renewal_event
from tests.stripe_fixtures import load_event, with_metadata

INVOICE, INTENT, CHARGE = "in_basil_1", "pi_basil_1", "ch_basil_1"
# 20 % commission and a 5 % platform fee: 2900 earns 580 and a fee of 145. Refunding 1450 (half)
# reverses round_half_even(580 * 1450 / 2900) = 290 and round_half_even(145 * 1450 / 2900) =
# round_half_even(72.5) = 72 (half to even): the sale keeps 290 and a fee of 73.
TERMS = {"commission_bps": 2000, "platform_fee_bps": 500, "holding_days": 0}


def _renewal(click_id: str) -> dict[str, Any]:
    """A basil `invoice.paid` renewal of 2900: its subscription metadata under `parent`, and no
    `payment_intent`, `charge` or `payments` on the invoice."""
    event = renewal_event("evt_basil_invoice", INVOICE, amount_paid=2900)
    event["data"]["object"]["parent"] = {
        "type": "subscription_details",
        "subscription_details": {"subscription": "sub_basil_1", "metadata": {}},
    }
    return with_metadata(event, {"svc_click_id": click_id}, "parent")


def _link() -> dict[str, Any]:
    event = load_event("tally__invoice_payment.paid.basil.json", event_id="evt_basil_link", account=ACCOUNT)
    obj = event["data"]["object"]
    obj["invoice"] = INVOICE
    obj["payment"] = {"type": "payment_intent", "payment_intent": INTENT}
    return event


def _refund(cumulative: int = 1450, event_id: str = "evt_basil_refund") -> dict[str, Any]:
    """A basil `charge.refunded`: the charge names its payment intent, no invoice."""
    event = renewal_event(event_id, CHARGE)
    event["type"] = "charge.refunded"
    event["data"]["object"] = {
        "id": CHARGE,
        "object": "charge",
        "amount": 2900,
        "amount_refunded": cumulative,
        "currency": "usd",
        "customer": "cus_1",
        "payment_intent": INTENT,
        "refunded": cumulative == 2900,
        "livemode": True,
    }
    return event


def _world(client: TestClient) -> tuple[World, str]:
    world = make_world(client, stripe_account_id=ACCOUNT, **TERMS)
    r = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    assert r.status_code == 201, r.text
    return world, str(r.json()["data"]["click_id"])


def _send(world: World, event: dict[str, Any]) -> None:
    r = deliver(world.client, copy.deepcopy(event))
    assert r.status_code == 200, r.text
    assert r.json()["data"]["program_id"] == world.program_id, r.text


def _sale(world: World) -> dict[str, Any]:
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    r = world.client.get(
        f"/api/v1/programs/{world.program_id}/sales", params={"transaction_id": INVOICE}, headers=world.owner
    )
    assert r.status_code == 200, r.text
    [sale] = r.json()["data"]
    return dict(sale)


def _money(sale: dict[str, Any]) -> tuple[int, int, int]:
    """What was refunded of the sale, and its commission and platform fee net of reversals."""
    return sale["refunded"], sale["commission"], sale["platform_fee"]


def _track_refund(world: World, refund_id: str, amount: int) -> Any:
    body = {"transaction_id": INVOICE, "refund_id": refund_id, "amount": amount}
    return world.client.post("/api/v1/track/refund", json=body, headers=world.key)


ORDERS = list(itertools.permutations(("invoice", "link", "refund")))


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
def test_a_refund_naming_only_its_payment_intent_finds_its_renewal(
    client: TestClient, order: tuple[str, ...]
) -> None:
    world, click = _world(client)
    events = {"invoice": _renewal(click), "link": _link(), "refund": _refund()}
    for name in order:
        _send(world, events[name])

    sale = _sale(world)
    assert (sale["amount"], sale["partner_code"], sale["attribution_rule"]) == (2900, "alice", "click")
    assert _money(sale) == (1450, 290, 73)

    # ingest knows it too: of the 2900 only 1450 is left to refund, whichever order it learnt it in
    r = _track_refund(world, "re_brand_1", 1451)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "refund_exceeds_sale"), r.text
    assert r.json()["error"]["remaining"] == 1450
    r = _track_refund(world, "re_brand_2", 1450)
    assert r.status_code == 200 and r.json()["data"]["sale_found"] is True, r.text


def test_the_refund_grows_and_empties_the_sale_exactly(client: TestClient) -> None:
    world, click = _world(client)
    _send(world, _refund(1000, "evt_basil_refund_1"))
    _send(world, _link())
    _send(world, _refund(1450, "evt_basil_refund_2"))
    _send(world, _renewal(click))
    assert _money(_sale(world)) == (1450, 290, 73)
    _send(world, _refund(2900, "evt_basil_refund_3"))
    assert _money(_sale(world)) == (2900, 0, 0)
    r = _track_refund(world, "re_brand_1", 1)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "refund_exceeds_sale"), r.text


def test_without_the_link_the_refund_stays_unknown(client: TestClient) -> None:
    """The link is what matches: a refund of an intent no `invoice_payment.paid` names is kept as a
    refund of an unknown sale, and ingest, knowing no sale of it, lets a track refund through."""
    world, click = _world(client)
    _send(world, _refund())
    _send(world, _renewal(click))
    assert _money(_sale(world)) == (0, 580, 145)
    r = world.client.post(
        "/api/v1/track/refund",
        json={"transaction_id": INTENT, "refund_id": "re_brand_1", "amount": 5000},
        headers=world.key,
    )
    assert r.status_code == 200 and r.json()["data"]["sale_found"] is False, r.text
    assert [w["code"] for w in r.json()["warnings"]] == ["sale_not_found"]
