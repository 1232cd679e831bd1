"""The backfill scenario from SEED.md's common mistakes: a subscription sold without
`subscription_data.metadata`, so its renewals are unattributed. A metadata fix plus a backfill
dry run shows exactly those renewals moving to the right partner with the right commission;
applying makes it so; applying again changes nothing; a closed month's report stays
byte-identical while the correction appears as an adjustment in the first open month."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, WEBHOOK_SECRET, World, make_world
from tests.helpers import without_provenance
from tests.stripe_fixtures import signed_delivery

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
ACCOUNT = "acct_backfill_brand"


def _ts(day: str) -> int:
    return int(datetime.fromisoformat(f"{day}T10:00:00+00:00").timestamp())


def _deliver(world: World, event: dict[str, Any]) -> None:
    """Deliver `event`: taken as a new live event of the world's program (routed by account)."""
    body, header = signed_delivery(event, WEBHOOK_SECRET, int(time.time()))
    r = world.client.post("/webhooks/stripe", content=body, headers={"Stripe-Signature": header})
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {
        "received": True,
        "event_id": event["id"],
        "program_id": world.program_id,
        "duplicate": False,
        "test_mode": False,
    }


def _event(eid: str, etype: str, day: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": eid,
        "object": "event",
        "type": etype,
        "created": _ts(day),
        "livemode": True,
        "account": ACCOUNT,
        "data": {"object": obj},
    }


def _renewal(iid: str, day: str) -> dict[str, Any]:
    # 2025-03-31 layout, subscription metadata empty: subscription_data.metadata was never set
    return _event(
        f"evt_{iid}",
        "invoice.paid",
        day,
        {
            "id": iid,
            "object": "invoice",
            "amount_paid": 5000,
            "currency": "usd",
            "customer": "cus_new_each_time",
            "billing_reason": "subscription_cycle",
            "status_transitions": {"paid_at": _ts(day)},
            "parent": {
                "type": "subscription_details",
                "subscription_details": {"subscription": "sub_1", "metadata": {}},
            },
        },
    )


def _setup(client: TestClient) -> tuple[World, str]:
    world = make_world(client, stripe_account_id=ACCOUNT, commission_bps=3000, recurring_months=None)
    click = client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
    ).json()["data"]["click_id"]
    client.post(
        "/api/v1/track/lead", json={"customer_external_id": "u1", "click_id": click}, headers=world.key
    )
    meta = {"svc_click_id": click, "svc_customer_key": "u1", "program_id": world.program_id}
    _deliver(
        world,
        _event(
            "evt_cs_1",
            "checkout.session.completed",
            "2026-09-05",
            {
                "id": "cs_1",
                "object": "checkout.session",
                "mode": "subscription",
                "payment_status": "paid",
                "amount_total": 5000,
                "currency": "usd",
                "customer": None,
                "subscription": "sub_1",
                "invoice": "in_sep",
                "metadata": meta,
            },
        ),
    )
    _deliver(world, _renewal("in_oct", "2026-10-05"))
    _deliver(world, _renewal("in_nov", "2026-11-05"))
    return world, click


def _sales(world: World) -> dict[str, dict[str, Any]]:
    rows = world.client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner).json()["data"]
    return {row["transaction_id"]: row for row in rows}


def _report(world: World, period: str, fmt: str = "json") -> bytes:
    r = world.client.get(
        f"/api/v1/programs/{world.program_id}/reports/finance?period={period}&format={fmt}",
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    return r.content


def test_metadata_fix_and_backfill(client: TestClient) -> None:
    with time_machine.travel(NOW, tick=False):
        world, click = _setup(client)
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        sales = _sales(world)
        assert sales["in_sep"]["partner_code"] == "alice" and sales["in_sep"]["commission"] == 1500
        for renewal in ("in_oct", "in_nov"):
            assert sales[renewal]["partner_code"] is None
            assert sales[renewal]["unattributed_reason"] == "subscription_metadata_missing"

        # October is closed before anyone notices
        r = client.post(f"/api/v1/programs/{world.program_id}/periods/2026-10/close", headers=world.owner)
        assert r.status_code == 200, r.text
        october_json, october_html = _report(world, "2026-10"), _report(world, "2026-10", "html")

        r = client.post(
            f"/api/v1/programs/{world.program_id}/metadata-fixes",
            headers=world.owner,
            json={"fixes": [{"subscription_id": "sub_1", "svc_customer_key": "u1", "svc_click_id": click}]},
        )
        assert r.status_code == 201, r.text
        # a fix alone changes nothing: reconcile runs before the backfill ignore it
        client.post("/api/v1/operator/reconcile", headers=OP)
        assert _sales(world)["in_oct"]["partner_code"] is None

        body = {"from": "2026-09-01", "to": "2026-11-30", "dry_run": True}
        dry = client.post(f"/api/v1/programs/{world.program_id}/backfill", json=body, headers=world.owner)
        assert dry.status_code == 200, dry.text
        diff = dry.json()["data"]
        moved = {
            (
                s["transaction_id"],
                s["before_partner_code"],
                s["after_partner_code"],
                s["before_commission"],
                s["after_commission"],
            )
            for s in diff["changed_sales"]
        }
        assert moved == {("in_oct", None, "alice", 0, 1500), ("in_nov", None, "alice", 0, 1500)}
        assert diff["partner_totals"] == [
            {"partner_code": "alice", "currency": "usd", "before": 1500, "after": 4500, "delta": 3000}
        ]
        assert _sales(world)["in_oct"]["partner_code"] is None  # the dry run changed nothing

        applied = client.post(
            f"/api/v1/programs/{world.program_id}/backfill",
            json={**body, "dry_run": False},
            headers=world.owner,
        )
        assert applied.status_code == 200, applied.text
        assert applied.json()["data"]["applied"] is True
        assert applied.json()["data"]["applied_by"]
        sales = _sales(world)
        for renewal in ("in_oct", "in_nov"):
            assert (sales[renewal]["partner_code"], sales[renewal]["commission"]) == ("alice", 1500)

        again = client.post(
            f"/api/v1/programs/{world.program_id}/backfill",
            json={**body, "dry_run": False},
            headers=world.owner,
        )
        assert again.json()["data"]["changes"] == 0 and again.json()["data"]["changed_sales"] == []

        # the closed month is frozen; its correction lands in the first open month
        assert _report(world, "2026-10") == october_json
        assert without_provenance(_report(world, "2026-10", "html")) == without_provenance(october_html)
        assert b'id="month-closed"' in october_html
        lines = client.get(
            f"/api/v1/programs/{world.program_id}/commissions?period=2026-11", headers=world.owner
        ).json()["data"]
        adjustments = [
            (line["transaction_id"], line["amount"]) for line in lines if line["kind"] == "adjustment"
        ]
        assert adjustments == [("in_oct", 1500)]
        october = client.get(
            f"/api/v1/programs/{world.program_id}/commissions?period=2026-10", headers=world.owner
        ).json()["data"]
        assert [line for line in october if line["transaction_id"] == "in_oct"] == []


def test_backfill_needs_owner_or_operator(world: World) -> None:
    member = world.member()
    body = {"from": "2026-01-01", "to": "2026-01-31"}
    r = world.client.post(f"/api/v1/programs/{world.program_id}/backfill", json=body, headers=member)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")
    r = world.client.post(f"/api/v1/programs/{world.program_id}/backfill", json=body, headers=OP)
    assert r.status_code == 200 and r.json()["data"]["dry_run"] is True
    r = world.client.post(
        f"/api/v1/programs/{world.program_id}/backfill",
        json={"from": "2026-02-01", "to": "2026-01-01"},
        headers=OP,
    )
    assert r.status_code == 422
    r = world.client.post(
        f"/api/v1/programs/{world.program_id}/metadata-fixes",
        json={"fixes": [{"svc_customer_key": "u"}]},
        headers=world.owner,
    )
    assert r.status_code == 422
    r = world.client.post(f"/api/v1/programs/{world.program_id}/periods/2099-01/close", headers=world.owner)
    assert r.status_code == 422
