"""CONTRACT 14 and 15, paying: a partner whose balance is below the program's `payout_minimum`
gets no row (their lines stay approved and unpaid, in no batch, until a later batch pays them),
and a batch comes as the files PayPal Payouts and Wise batch payments import, one row per partner
whose payout method is that service, everyone the batch cannot pay listed apart with the reason
(below the minimum, no payout details, a currency their details do not take).

The files are checked against the services' published templates:

- PayPal Payouts, "Send payouts from Payouts Web" (developer.paypal.com/docs/payouts/standard/
  payouts-web/) and "Use Web UI" (docs.paypal.ai/send/use-web-ui): no header row; columns
  recipient identifier (email), payment amount (a decimal number), currency (ISO 4217, one per
  file), customer id (optional, at most 30 characters), note to recipient (optional, at most
  400), recipient wallet (PAYPAL); at most 5,000 rows.
- Wise batch payments, "What's a batch payment template?" (wise.com/help/articles/2663296) and
  "How do I fill in my batch template?" (wise.com/help/articles/2663302), the "Send by email"
  template: header `name,recipientEmail,paymentReference,receiverType,amountCurrency,amount,
  sourceCurrency,targetCurrency`; receiverType PERSON; amountCurrency `source` or `target`;
  amounts numerical characters only.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import logged_in, payee

WISE_HEADER = [
    "name",
    "recipientEmail",
    "paymentReference",
    "receiverType",
    "amountCurrency",
    "amount",
    "sourceCurrency",
    "targetCurrency",
]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(at("2026-01-05T09:00:00Z"), tick=True) as traveller:
        yield traveller


def partner(world: World, code: str, **payout: str) -> None:
    client = world.client
    r = client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": code, "name": code.title(), "email": f"{code}@partner.test"},
        headers=world.owner,
    )
    assert r.status_code in (201, 409), r.text
    if payout:
        r = client.patch(
            f"/api/v1/programs/{world.program_id}/partners/{code}", json=payout, headers=world.owner
        )
        assert r.status_code == 200, r.text


def referred_sale(world: World, code: str, tx: str, amount: int, currency: str = "usd") -> None:
    """A sale by a customer who came through `code`'s link (30 % commission)."""
    client = world.client
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": code})
    customer = f"cust_{tx}"
    lead = {"customer_external_id": customer, "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    r = world.sale(transaction_id=tx, customer_external_id=customer, amount=amount, currency=currency)
    assert r.status_code == 200, r.text


def make_batch(world: World, up_to: str) -> dict[str, Any]:
    r = world.client.post(
        f"/api/v1/programs/{world.program_id}/payouts", json={"up_to": up_to}, headers=world.owner
    )
    assert r.status_code == 201, r.text
    batch: dict[str, Any] = r.json()["data"]
    return batch


def rows_of(batch: dict[str, Any]) -> dict[tuple[str, str], tuple[int, int, int]]:
    return {
        (r["partner_code"], r["currency"]): (r["amount"], r["carried_in"], r["carried_forward"])
        for r in batch["rows"]
    }


def download(world: World, payout_id: str, fmt: str, currency: str | None = None) -> Any:
    query = f"?format={fmt}" + (f"&currency={currency}" if currency else "")
    return world.client.get(
        f"/api/v1/programs/{world.program_id}/payouts/{payout_id}{query}", headers=world.owner
    )


def test_a_balance_below_the_minimum_waits_for_a_later_batch(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = make_world(client, holding_days=0, payout_minimum=5_000)
    assert (
        client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"][
            "payout_minimum"
        ]
        == 5_000
    )
    partner(world, "bob")
    payee(world, "alice")  # a batch pays only partners with payout details
    payee(world, "bob")
    referred_sale(world, "alice", "tx_1", 10_000)  # 30.00 commission: below 50.00
    referred_sale(world, "bob", "tx_2", 30_000)  # 90.00
    clock.move_to(at("2026-01-20T09:00:00Z"))
    first = make_batch(world, "2026-01-31")
    assert first["payout_minimum"] == 5_000
    assert rows_of(first) == {("bob", "usd"): (9_000, 0, 0)}  # alice gets no row (issue 49)
    assert [(n["partner_code"], n["balance"], n["lines"], n["reason"]) for n in first["not_paid"]] == [
        ("alice", 3_000, 1, "below_minimum"),
    ]
    r = client.post(
        f"/api/v1/programs/{world.program_id}/payouts/{first['payout_id']}/paid", headers=world.owner
    )
    assert r.status_code == 200
    # only money sent is paid: alice's line stays approved, unpaid and in no batch
    lines = client.get(f"/api/v1/programs/{world.program_id}/commissions", headers=world.owner).json()["data"]
    assert {(line["transaction_id"], line["payout_id"], line["status"]) for line in lines} == {
        ("tx_1", None, "approved"),
        ("tx_2", first["payout_id"], "paid"),
    }

    referred_sale(world, "alice", "tx_3", 10_000)
    clock.move_to(at("2026-02-20T09:00:00Z"))
    second = make_batch(world, "2026-02-28")
    assert rows_of(second) == {("alice", "usd"): (6_000, 0, 0)}  # 30.00 now + the 30.00 still owed
    assert [(r["partner_code"], r["lines"]) for r in second["rows"]] == [("alice", 2)]
    assert second["not_paid"] == []
    # a batch keeps the minimum it was made with, whatever the program says later
    r = client.patch(f"/api/v1/programs/{world.program_id}", json={"payout_minimum": 0}, headers=world.owner)
    assert r.status_code == 200
    again = client.get(
        f"/api/v1/programs/{world.program_id}/payouts/{first['payout_id']}", headers=world.owner
    )
    assert rows_of(again.json()["data"]) == rows_of(first) and again.json()["data"]["payout_minimum"] == 5_000
    for bad in (-1, 10**12 + 1, "50.00", True):
        r = client.patch(
            f"/api/v1/programs/{world.program_id}", json={"payout_minimum": bad}, headers=world.owner
        )
        assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), bad


def test_paypal_and_wise_files_follow_the_published_templates(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = make_world(client, holding_days=0)
    partner(
        world,
        "alice",
        payout_method="wise",
        payout_email="alice@wise.test",
        payout_name="Alice Example",
        payout_currency="eur",
    )
    partner(
        world,
        "bob",
        payout_method="paypal",
        payout_email="bob@paypal.test",
        payout_name="Bob B",
        payout_currency="usd",
    )
    partner(
        world,
        "wendy",
        payout_method="wise",
        payout_email="wendy@wise.test",
        payout_name="Wendy W",
        payout_currency="usd",
    )
    partner(world, "carol")  # no payout details
    partner(
        world,
        "a-partner-code-longer-than-thirty-chars",
        payout_method="paypal",
        payout_email="long@paypal.test",
        payout_name="Long",
        payout_currency="usd",
    )
    referred_sale(world, "alice", "tx_a", 10_000)  # usd: alice is paid in eur, never converted
    referred_sale(world, "alice", "tx_a_eur", 10_000, "eur")
    referred_sale(world, "bob", "tx_b", 12_345)
    referred_sale(world, "wendy", "tx_w", 1_000)
    referred_sale(world, "carol", "tx_c", 20_000)
    referred_sale(world, "a-partner-code-longer-than-thirty-chars", "tx_l", 100)
    clock.move_to(at("2026-01-20T09:00:00Z"))
    batch = make_batch(world, "2026-01-31")
    payout_id = batch["payout_id"]

    paypal = download(world, payout_id, "paypal")
    assert paypal.status_code == 200, paypal.text
    assert paypal.headers["content-type"].startswith("text/csv")
    assert f"payout-{payout_id}-paypal-usd.csv" in paypal.headers["content-disposition"]
    assert not paypal.content.startswith(b"\xef\xbb\xbf")  # no BOM: the first cell is an email
    assert paypal.content.endswith(b"\r\n")
    rows = list(csv.reader(io.StringIO(paypal.content.decode())))
    note = "Brand partners: commissions, payout 1"
    assert rows == [  # no header row; one row per PayPal partner the batch pays
        ["long@paypal.test", "0.30", "USD", "", note, "PAYPAL"],  # a code over 30 characters: no customer id
        ["bob@paypal.test", "37.04", "USD", "bob", note, "PAYPAL"],  # 30 % of 123.45 = 37.035 -> 37.04
    ]
    assert all(len(r) == 6 and r[5] == "PAYPAL" for r in rows)
    assert paypal.headers["x-tally-not-paid"] == (
        "alice:usd:currency_not_supported,carol:usd:no_payout_details"
    )

    wise = download(world, payout_id, "wise")
    assert wise.status_code == 200 and f"payout-{payout_id}-wise.csv" in wise.headers["content-disposition"]
    table = list(csv.reader(io.StringIO(wise.content.decode())))
    assert table[0] == WISE_HEADER
    assert table[1:] == [
        # each paid in the lines' currency, the amount the partner gets (no silent conversion)
        ["Alice Example", "alice@wise.test", "Payout 1", "PERSON", "target", "30.00", "EUR", "EUR"],
        ["Wendy W", "wendy@wise.test", "Payout 1", "PERSON", "target", "3.00", "USD", "USD"],
    ]
    assert all(len(row[2]) <= 18 for row in table[1:])

    listed = client.get(
        f"/api/v1/programs/{world.program_id}/payouts/{payout_id}", headers=world.owner
    ).json()["data"]
    assert listed["not_paid"] == [
        {
            "partner_code": "alice",
            "partner_name": "Alice",
            "currency": "usd",
            "balance": 3_000,
            "lines": 1,
            "reason": "currency_not_supported",
        },
        {
            "partner_code": "carol",
            "partner_name": "Carol",
            "currency": "usd",
            "balance": 6_000,
            "lines": 1,
            "reason": "no_payout_details",
        },
    ]


def test_paypal_takes_one_currency_per_file(client: TestClient, clock: time_machine.Traveller) -> None:
    world = make_world(client, holding_days=0)
    partner(
        world,
        "bob",
        payout_method="paypal",
        payout_email="bob@paypal.test",
        payout_name="Bob",
        payout_currency="usd",
    )
    partner(
        world,
        "eve",
        payout_method="paypal",
        payout_email="eve@paypal.test",
        payout_name="Eve",
        payout_currency="eur",
    )
    partner(
        world,
        "yuki",
        payout_method="paypal",
        payout_email="yuki@paypal.test",
        payout_name="Yuki",
        payout_currency="jpy",
    )
    referred_sale(world, "bob", "tx_1", 10_000, "usd")
    referred_sale(world, "eve", "tx_2", 10_000, "eur")
    referred_sale(world, "eve", "tx_3", 1_000, "jpy")  # eve is paid in eur: not in yen
    referred_sale(world, "yuki", "tx_4", 1_000, "jpy")
    clock.move_to(at("2026-01-20T09:00:00Z"))
    batch = make_batch(world, "2026-01-31")
    payout_id = batch["payout_id"]
    assert [(n["partner_code"], n["currency"], n["reason"]) for n in batch["not_paid"]] == [
        ("eve", "jpy", "currency_not_supported")
    ]
    r = download(world, payout_id, "paypal")
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error")
    assert r.json()["error"]["fields"] == [{"field": "currency", "message": "one of eur, jpy, usd"}]
    eur = download(world, payout_id, "paypal", "EUR")
    assert list(csv.reader(io.StringIO(eur.content.decode()))) == [
        ["eve@paypal.test", "30.00", "EUR", "eve", "Brand partners: commissions, payout 1", "PAYPAL"]
    ]
    jpy = download(world, payout_id, "paypal", "jpy")
    assert list(csv.reader(io.StringIO(jpy.content.decode()))) == [  # yen have no decimals
        ["yuki@paypal.test", "300", "JPY", "yuki", "Brand partners: commissions, payout 1", "PAYPAL"]
    ]
    assert download(world, payout_id, "paypal", "gbp").content == b""  # no PayPal row in GBP
    assert download(world, payout_id, "paypal", "dollars").status_code == 422
    assert download(world, "po_nope", "wise").status_code == 404
    r = client.get(
        f"/api/v1/programs/{world.program_id}/payouts/{payout_id}?format=wise", headers=world.member()
    )
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200


def test_the_dashboards_batch_says_who_cannot_be_paid_and_why(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = make_world(client, holding_days=0, payout_minimum=5_000)
    partner(
        world,
        "bob",
        payout_method="paypal",
        payout_email="bob@paypal.test",
        payout_name="Bob",
        payout_currency="usd",
    )
    partner(world, "carol")
    referred_sale(world, "alice", "tx_1", 10_000)  # 30.00: below the minimum
    referred_sale(world, "bob", "tx_2", 30_000)  # 90.00 by PayPal
    referred_sale(world, "carol", "tx_3", 30_000)  # 90.00, no payout details
    clock.move_to(at("2026-01-20T09:00:00Z"))
    payout_id = make_batch(world, "2026-01-31")["payout_id"]
    logged_in(client, world.account_token)
    page = client.get(f"/dashboard/programs/{world.program_id}/payouts").text
    box = re.search(rf'<div class="not-paid" id="not-paid-{payout_id}">(.*?)</div>', page, re.S)
    assert box is not None
    reasons = dict(re.findall(r'data-partner="([^"]+)" data-reason="([^"]+)"', box.group(1)))
    assert reasons == {"alice": "below_minimum", "carol": "no_payout_details"}
    assert "below the payout minimum: carried to the next batch" in box.group(1)
    assert f"/payouts/{payout_id}/export?format=paypal&amp;currency=usd" in page
    assert f"/payouts/{payout_id}/export?format=wise" in page
    paypal = client.get(
        f"/dashboard/programs/{world.program_id}/payouts/{payout_id}/export?format=paypal&currency=usd"
    )
    assert paypal.status_code == 200 and paypal.content.startswith(b"bob@paypal.test,90.00,USD,bob,")
    settings_page = client.get(f"/dashboard/programs/{world.program_id}").text
    # the minimum as set: 5000 minor units in every currency (CONTRACT 15)
    assert 'id="s-payout_minimum" name="payout_minimum" inputmode="decimal" value="5000"' in settings_page
