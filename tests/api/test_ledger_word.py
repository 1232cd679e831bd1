"""The ledger keeps its word through the real HTTP API (both backends): a paid batch never
grows, a refund logged after payment is a clawback whatever its stamp, and finance holds,
releases and voids a sale's lines. Program: 30 % commission, 0 holding days, 10 % fee."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import time_machine
from starlette.testclient import TestClient

from tests.api.test_ledger_api import at, lines, make_batch, pay, reconcile, refund, sale, shop
from tests.api.test_reports_api import ACCOUNT, CHECKOUT, CHECKOUT_PI, deliver
from tests.conftest import World
from tests.helpers import logged_in, payee, program_path
from tests.stripe_fixtures import load_event, with_metadata


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(at("2026-11-01T09:00:00Z"), tick=True) as traveller:
        yield traveller


def world_of(client: TestClient) -> World:
    return shop(client, holding_days=0, platform_fee_bps=1000)


def act(world: World, tx: str, action: str, expected: int = 200) -> dict[str, Any]:
    r = world.client.post(
        f"/api/v1/programs/{world.program_id}/commissions/{tx}/{action}",
        json={"reason": f"{action} by finance"},
        headers=world.owner,
    )
    assert r.status_code == expected, r.text
    body: dict[str, Any] = r.json()
    return body


def brief(world: World) -> list[tuple[Any, ...]]:
    return sorted(
        (
            r["transaction_id"],
            r["kind"],
            r["amount"],
            r["platform_fee"],
            r["status"],
            r["payout_id"] is not None,
        )
        for r in lines(world)
    )


def test_a_paid_batch_never_grows_when_a_sale_dated_inside_it_is_reported_later(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = world_of(client)
    sale(world, "tx_1", 10_000, "2026-10-10T00:00:00Z", customer_external_id="cust_1")
    batch = make_batch(world, "2026-10-31")
    pay(world, batch["payout_id"])
    sale(world, "tx_2", 4_000, "2026-10-22T00:00:00Z", customer_external_id="cust_1")
    reconcile(client)
    again = client.get(
        f"/api/v1/programs/{world.program_id}/payouts/{batch['payout_id']}", headers=world.owner
    ).json()["data"]
    assert [(r["partner_code"], r["amount"], r["lines"]) for r in again["rows"]] == [("alice", 3_000, 1)]
    assert brief(world) == [
        ("tx_1", "commission", 3_000, 1_000, "paid", True),
        ("tx_2", "commission", 1_200, 400, "approved", False),
    ]


def test_a_refund_after_payment_is_a_clawback_and_the_paid_line_stays(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = world_of(client)
    sale(world, "tx_1", 10_000, "2026-10-10T00:00:00Z", customer_external_id="cust_1")
    pay(world, make_batch(world, "2026-10-31")["payout_id"])
    refund(world, "tx_1", "re_1", 5_000)
    reconcile(client)
    assert brief(world) == [
        ("tx_1", "clawback", -1_500, -500, "approved", False),
        ("tx_1", "commission", 3_000, 1_000, "paid", True),
    ]


def test_hold_release_void(client: TestClient, clock: time_machine.Traveller) -> None:
    world = world_of(client)
    sale(world, "tx_1", 10_000, "2026-10-10T00:00:00Z", customer_external_id="cust_1")
    sale(world, "tx_2", 20_000, "2026-10-11T00:00:00Z", customer_external_id="cust_1")
    held = act(world, "tx_1", "hold")["data"]
    assert held["transaction_id"] == "tx_1"
    assert [(x["status"], x["status_reason"]) for x in held["lines"]] == [("held", "hold by finance")]
    act(world, "tx_1", "hold", 409)
    act(world, "tx_2", "release", 409)
    batch = make_batch(world, "2026-10-31")
    assert [(r["amount"], r["lines"]) for r in batch["rows"]] == [(6_000, 1)]  # tx_2 only
    released = act(world, "tx_1", "release")["data"]
    assert [x["status"] for x in released["lines"]] == ["approved"]
    voided = act(world, "tx_1", "void")["data"]
    assert [x["status"] for x in voided["lines"]] == ["void"]
    act(world, "tx_1", "release", 409)

    def void_tx_2() -> dict[str, Any]:
        r = client.post(
            f"/api/v1/programs/{world.program_id}/commissions/tx_2/void",
            json={"reason": "x"},
            headers=world.owner,
        )
        assert r.status_code == 409, r.text
        error: dict[str, Any] = r.json()["error"]
        return error

    # tx_2's line is in the open batch: cancel the batch first (issue 49); once paid, never
    refused = void_tx_2()
    assert (refused["code"], refused["payout_id"]) == ("line_in_batch", batch["payout_id"]), refused
    assert make_batch(world, "2026-10-31", 200)["payout_id"] == batch["payout_id"]
    pay(world, batch["payout_id"])
    assert void_tx_2()["code"] == "line_paid"
    r = client.post(
        f"/api/v1/programs/{world.program_id}/commissions/tx_9/hold",
        json={"reason": "x"},
        headers=world.owner,
    )
    assert r.status_code == 404, r.text
    r = client.post(
        f"/api/v1/programs/{world.program_id}/commissions/tx_1/hold",
        json={"reason": " "},
        headers=world.owner,
    )
    assert r.status_code in (400, 422), r.text


def test_the_explain_page_shows_the_lines_and_holds_with_a_reason(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = world_of(client)
    sale(world, "tx_1", 10_000, "2026-10-10T00:00:00Z", customer_external_id="cust_1")
    reconcile(client)
    token = logged_in(client, world.account_token)
    page = client.get(program_path(world, "/sales/tx_1"))
    assert page.status_code == 200 and 'id="lines"' in page.text and 'id="finance-action"' in page.text
    action = program_path(world, "/commissions/tx_1")
    refused = client.post(action, data={"action": "hold", "reason": "x"}, follow_redirects=False)
    assert refused.status_code == 403
    r = client.post(
        action,
        data={"csrf_token": token, "action": "hold", "reason": "chargeback open"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    shown = client.get(r.headers["location"]).text
    assert "Hold recorded." in shown and "chargeback open" in shown
    data = client.get(f"/api/v1/programs/{world.program_id}/sales/tx_1/explain", headers=world.owner).json()[
        "data"
    ]
    (line,) = data["lines"]
    assert (line["status"], line["status_reason"], line["booking_id"] is not None) == (
        "held",
        "chargeback open",
        True,
    )


def test_a_refund_dated_into_a_closed_month_shows_in_the_month_it_is_booked_in(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = world_of(client)
    sale(world, "tx_1", 10_000, "2026-10-10T00:00:00Z", customer_external_id="cust_1")
    r = client.post(f"/api/v1/programs/{world.program_id}/periods/2026-10/close", headers=world.owner)
    assert r.status_code in (200, 201), r.text

    def refunds(period: str) -> tuple[int, int]:
        got = client.get(
            f"/api/v1/programs/{world.program_id}/reports/finance?period={period}", headers=world.owner
        ).json()["data"]
        (usd,) = [row for row in got["summary"] if row["currency"] == "usd"] or [
            {"refunds": 0, "refunds_count": 0}
        ]
        return usd["refunds"], usd["refunds_count"]

    october = refunds("2026-10")
    body = {
        "transaction_id": "tx_1",
        "refund_id": "re_1",
        "amount": 4_000,
        "occurred_at": "2026-10-15T00:00:00Z",
    }
    assert client.post("/api/v1/track/refund", json=body, headers=world.key).status_code == 200
    reconcile(client)
    assert refunds("2026-10") == october == (0, 0)
    assert refunds("2026-11") == (4_000, 1)


def test_a_late_lead_moves_a_paid_line_by_adjustments_in_the_month_it_was_logged(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """The sale is alice's by customer key when it is paid; a lead logged later binds its email
    to bob (email outranks the customer key): the paid batch keeps alice's 30.00, and November
    holds -30.00 for alice and +30.00 for bob, caused by that lead."""
    world = world_of(client)
    sale(world, "tx_1", 10_000, "2026-10-10T00:00:00Z", customer_external_id="cust_1", email="buyer@x.test")
    batch = make_batch(world, "2026-10-31")
    pay(world, batch["payout_id"])
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "bob"})
    lead = {
        "customer_external_id": "cust_9",
        "email": "buyer@x.test",
        "click_id": click.json()["data"]["click_id"],
    }
    r = client.post("/api/v1/track/lead", json=lead, headers=world.key)
    assert r.status_code == 200, r.text
    reconcile(client)
    got = sorted(
        (x["kind"], x["partner_code"], x["period"], x["amount"], x["status"], x["payout_id"] is not None)
        for x in lines(world)
    )
    assert got == [
        ("adjustment", "alice", "2026-11", -3_000, "approved", False),
        ("adjustment", "bob", "2026-11", 3_000, "approved", False),
        ("commission", "alice", "2026-10", 3_000, "paid", True),
    ]
    assert {x["cause"] for x in lines(world) if x["kind"] == "adjustment"} == {r.json()["data"]["lead_id"]}
    again = client.get(
        f"/api/v1/programs/{world.program_id}/payouts/{batch['payout_id']}", headers=world.owner
    )
    assert [(x["partner_code"], x["amount"]) for x in again.json()["data"]["rows"]] == [("alice", 3_000)]


def test_a_refund_logged_after_payment_but_stamped_before_it_is_a_clawback(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """Defect 3: the refund arrives after the batch was paid, on a server whose clock runs a day
    behind (its `received_at` is before the batch's): later in the log is what counts."""
    world = world_of(client)
    sale(world, "tx_1", 10_000, "2026-10-10T00:00:00Z", customer_external_id="cust_1")
    pay(world, make_batch(world, "2026-10-31")["payout_id"])
    clock.shift(-86_400)  # another replica's clock, a day behind
    refund(world, "tx_1", "re_1", 5_000)
    reconcile(client)
    assert brief(world) == [
        ("tx_1", "clawback", -1_500, -500, "approved", False),
        ("tx_1", "commission", 3_000, 1_000, "paid", True),
    ]


def test_the_connect_record_of_a_paid_self_hosted_sale_adjusts_it_in_the_month_it_was_logged(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """Defect 2, the processor's side: the brand reported the sale with `track/sale` (alice's
    customer), it was paid; the connect webhook of the same payment intent then arrives naming
    bob's click, and the connect record counts (9.99 EUR incl. 0.65 tax: 9.34 net). The paid
    line and the batch stay; November holds -3.00 for alice and +2.80 for bob, caused by that
    webhook, on the same sale (its id does not change under the booked line)."""
    world = shop(client, holding_days=0, platform_fee_bps=1000, stripe_account_id=ACCOUNT)
    sale(world, CHECKOUT_PI, 999, "2026-10-10T00:00:00Z", currency="eur", customer_external_id="cust_1")
    payee(world, "alice", currency="eur")  # a batch pays a partner only in their payout currency
    batch = make_batch(world, "2026-10-31")
    pay(world, batch["payout_id"])
    (booked,) = lines(world)
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "bob"})
    created = int(datetime(2026, 10, 10, tzinfo=UTC).timestamp())
    event = with_metadata(
        load_event(CHECKOUT, account=ACCOUNT, created=created),
        {"svc_click_id": click.json()["data"]["click_id"]},
    )
    r = deliver(client, event)
    assert r.status_code == 200, r.text
    reconcile(client)
    got = sorted(
        (
            x["kind"],
            x["partner_code"],
            x["period"],
            x["amount"],
            x["platform_fee"],
            x["status"],
            x["payout_id"],
        )
        for x in lines(world)
    )
    assert got == [
        ("adjustment", "alice", "2026-11", -300, -100, "approved", None),
        ("adjustment", "bob", "2026-11", 280, 93, "approved", None),
        ("commission", "alice", "2026-10", 300, 100, "paid", batch["payout_id"]),
    ]
    assert {(x["sale_id"], x["transaction_id"]) for x in lines(world)} == {(booked["sale_id"], CHECKOUT_PI)}
    assert {x["cause"] for x in lines(world) if x["kind"] == "adjustment"} == {event["id"]}
    again = client.get(
        f"/api/v1/programs/{world.program_id}/payouts/{batch['payout_id']}", headers=world.owner
    )
    assert [(x["partner_code"], x["amount"]) for x in again.json()["data"]["rows"]] == [("alice", 300)]
