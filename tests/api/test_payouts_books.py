"""CONTRACT 15, paying partners keeps books, through the real HTTP API and real reconciles, on
both backends, exact to the cent:

1. a paid batch's files never change (carol adds her details later; erin changes her Wise email
   and currency): the batch is a snapshot;
2. only money sent is `paid`: a partner below the minimum, without details or in a currency
   their service cannot pay gets no row, their lines stay approved and unpaid, and no report,
   statement or portal page counts them paid out;
4. a batch can be cancelled (its lines due again), a paid one cannot (`batch_paid`); a paid row
   can fail (its lines owed again, a `payout_failed` entry); a line in an open batch cannot be
   held or voided (`line_in_batch`, naming the batch);

and statements (opening, entries with running balances, closing = what the next batch pays),
balances, manual entries, PayPal's whole-unit currencies and the minimum's edge.

Programs here: 30 % commission, 30 holding days; time moves with time-machine.
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
from tests.helpers import payee


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(at("2026-01-02T09:00:00Z"), tick=True) as traveller:
        yield traveller


def program(client: TestClient, *codes: str, **settings: Any) -> World:
    """A program whose partners `codes` (alice first, made by make_world) each brought customer
    `cust_<code>` through a click and a lead."""
    world = make_world(client, **settings)
    for code in codes:
        if code != "alice":
            r = client.post(
                f"/api/v1/programs/{world.program_id}/partners",
                json={"code": code, "name": code.title(), "email": f"{code}@partner.test"},
                headers=world.owner,
            )
            assert r.status_code == 201, r.text
        click = client.post(
            "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": code}
        )
        lead = {"customer_external_id": f"cust_{code}", "click_id": click.json()["data"]["click_id"]}
        assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    return world


def sale(world: World, code: str, tx: str, amount: int, occurred_at: str, currency: str = "usd") -> None:
    r = world.sale(
        transaction_id=tx,
        customer_external_id=f"cust_{code}",
        amount=amount,
        occurred_at=occurred_at,
        currency=currency,
    )
    assert r.status_code == 200, r.text


def path(world: World, suffix: str = "") -> str:
    return f"/api/v1/programs/{world.program_id}{suffix}"


def make_batch(world: World, up_to: str, expected: int = 201) -> dict[str, Any]:
    r = world.client.post(path(world, "/payouts"), json={"up_to": up_to}, headers=world.owner)
    assert r.status_code == expected, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def post(world: World, suffix: str, body: dict[str, Any] | None = None, expected: int = 200) -> Any:
    r = world.client.post(path(world, suffix), json=body, headers=world.owner)
    assert r.status_code == expected, r.text
    return r.json()


def get(world: World, suffix: str) -> Any:
    r = world.client.get(path(world, suffix), headers=world.owner)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def file(world: World, payout_id: str, fmt: str, currency: str | None = None) -> bytes:
    query = f"?format={fmt}" + (f"&currency={currency}" if currency else "")
    r = world.client.get(path(world, f"/payouts/{payout_id}{query}"), headers=world.owner)
    assert r.status_code == 200, r.text
    return r.content


def every_file(world: World, payout_id: str) -> dict[str, bytes]:
    found = {fmt: file(world, payout_id, fmt) for fmt in ("csv", "xlsx", "wise")}
    found["paypal"] = file(world, payout_id, "paypal", "usd")
    found["json"] = world.client.get(path(world, f"/payouts/{payout_id}"), headers=world.owner).content
    return found


def rows(batch: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (r["partner_code"], r["currency"], r["amount"], r["lines"], r["payout_method"]) for r in batch["rows"]
    ]


def not_paid(batch: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(n["partner_code"], n["currency"], n["balance"], n["reason"]) for n in batch["not_paid"]]


def statuses(world: World, code: str) -> list[tuple[str, int, str, str | None]]:
    lines = get(world, "/commissions")
    return sorted(
        (r["transaction_id"], r["amount"], r["status"], r["payout_id"])
        for r in lines
        if r["partner_code"] == code
    )


def statement(world: World, code: str, query: str = "?currency=usd") -> dict[str, Any]:
    data: dict[str, Any] = get(world, f"/partners/{code}/statement{query}")
    return data


def balances(world: World, code: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get(world, f"/partners/{code}")["balances"]
    return found


# -- 1 and 2: snapshots; only money sent is paid -------------------------------------------------


def test_a_paid_batch_is_a_snapshot_and_only_money_sent_is_paid(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """Batch #1: alice (PayPal) is paid 34.00; carol has no details (36.00), erin's 15.00 EUR is
    below the 20.00 minimum: neither gets a row, their lines stay approved, nobody's report or
    portal counts them paid. Carol then adds details, erin changes her Wise email and currency:
    every byte of the paid batch stays, and batch #2 pays carol 36.00 (her lines once) and erin
    what she is now due."""
    world = program(client, "alice", "carol", "erin", payout_minimum=2_000)
    payee(world, "alice", "paypal", "usd")
    payee(world, "erin", "wise", "eur", email="erin@old.test")
    sale(world, "alice", "in_a1", 11_333, "2026-01-05T10:00:00Z")  # 34.00 (33.999 half-even)
    sale(world, "carol", "in_c1", 12_000, "2026-01-06T10:00:00Z")  # 36.00
    sale(world, "erin", "in_e1", 5_000, "2026-01-07T10:00:00Z", currency="eur")  # 15.00 EUR
    clock.move_to(at("2026-02-15T09:00:00Z"))
    first = make_batch(world, "2026-01-31")
    assert rows(first) == [("alice", "usd", 3_400, 1, "paypal")]
    assert not_paid(first) == [
        ("carol", "usd", 3_600, "no_payout_details"),
        ("erin", "eur", 1_500, "below_minimum"),
    ]
    before = every_file(world, first["payout_id"])
    assert (
        before["paypal"].decode()
        == 'alice@paypal.test,34.00,USD,alice,"Brand partners: commissions, payout 1",PAYPAL\r\n'
    )
    post(world, f"/payouts/{first['payout_id']}/paid")
    paid_json = world.client.get(path(world, f"/payouts/{first['payout_id']}"), headers=world.owner).content
    assert statuses(world, "carol") == [("in_c1", 3_600, "approved", None)]
    assert statuses(world, "erin") == [("in_e1", 1_500, "approved", None)]
    assert statuses(world, "alice") == [("in_a1", 3_400, "paid", first["payout_id"])]
    january = {r["currency"]: r for r in get(world, "/reports/finance?period=2026-01")["summary"]}
    assert (january["usd"]["paid"], january["usd"]["unpaid"]) == (3_400, 3_600)
    assert (january["eur"]["paid"], january["eur"]["unpaid"]) == (0, 1_500)
    assert balances(world, "erin") == [{"currency": "eur", "approved_unpaid": 1_500, "pending": 0, "held": 0}]

    payee(world, "carol", "paypal", "usd")
    payee(world, "erin", "wise", "usd", email="erin@new.test")  # another email and currency
    payee(world, "alice", "wise", "usd", email="alice@moved.test")
    r = world.client.patch(
        path(world), json={"name": "Renamed brand", "commission_bps": 5000}, headers=world.owner
    )
    assert r.status_code == 200, r.text
    after = every_file(world, first["payout_id"])
    assert {fmt: after[fmt] for fmt in before if fmt != "json"} == {
        fmt: before[fmt] for fmt in before if fmt != "json"
    }
    assert (
        world.client.get(path(world, f"/payouts/{first['payout_id']}"), headers=world.owner).content
        == paid_json
    )

    sale(world, "erin", "in_e2", 2_000, "2026-02-01T10:00:00Z", currency="eur")  # 6.00 EUR more
    clock.move_to(at("2026-03-10T09:00:00Z"))
    second = make_batch(world, "2026-02-28")
    assert rows(second) == [("carol", "usd", 3_600, 1, "paypal")]
    # erin's 21.00 EUR is over the minimum now, but her details say USD: not converted, not paid
    assert not_paid(second) == [("erin", "eur", 2_100, "currency_not_supported")]
    assert (
        file(world, second["payout_id"], "paypal", "usd").decode().startswith("carol@paypal.test,36.00,USD,")
    )
    assert file(world, first["payout_id"], "paypal", "usd") == before["paypal"]


def test_the_minimum_at_its_edge_and_per_currency(client: TestClient, clock: time_machine.Traveller) -> None:
    """A balance exactly at the minimum is paid; one minor unit less is not (and stays owed).
    A minimum per currency applies to its currency only: ¥499 is below ¥500, EUR has none."""
    world = program(client, "alice", "bob", "carl", "dora", payout_minimum={"usd": 3_000, "jpy": 500})
    payee(world, "alice")
    payee(world, "bob")
    payee(world, "carl", "paypal", "jpy")
    payee(world, "dora", "wise", "eur")
    sale(world, "alice", "in_a", 10_000, "2026-01-05T10:00:00Z")  # 30.00: exactly the minimum
    sale(world, "bob", "in_b", 9_997, "2026-01-05T10:00:00Z")  # 29.99 (29.991)
    sale(world, "carl", "in_c", 1_663, "2026-01-05T10:00:00Z", currency="jpy")  # ¥499 (498.9)
    sale(world, "dora", "in_d", 4, "2026-01-05T10:00:00Z", currency="eur")  # 0.01 EUR (0.012)
    clock.move_to(at("2026-02-15T09:00:00Z"))
    batch = make_batch(world, "2026-01-31")
    assert batch["payout_minimum"] == {"usd": 3_000, "jpy": 500}
    assert rows(batch) == [("alice", "usd", 3_000, 1, "paypal"), ("dora", "eur", 1, 1, "wise")]
    assert not_paid(batch) == [("bob", "usd", 2_999, "below_minimum"), ("carl", "jpy", 499, "below_minimum")]
    assert statement(world, "bob")["closing_balance"] == 2_999
    sale(world, "carl", "in_c2", 4, "2026-01-06T10:00:00Z", currency="jpy")  # ¥1 more: ¥500
    clock.move_to(at("2026-02-16T09:00:00Z"))
    again = make_batch(world, "2026-01-31")
    assert rows(again) == [("carl", "jpy", 500, 2, "paypal")]


# -- 4: undoing ------------------------------------------------------------------------------


def test_cancel_an_open_batch_and_a_failed_row_of_a_paid_one(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """An open batch cancelled: its lines are due again and the next batch takes them; the
    cancelled one stays listed. A paid batch cannot be cancelled (409 batch_paid, nothing
    appended). A paid row that bounced is marked failed: its lines are owed again (statement:
    payout_failed), the batch's other rows and files do not change, and a later batch pays
    them. Holding a sale while an open batch holds its line: 409 line_in_batch naming it."""
    world = program(client, "alice", "bob")
    payee(world, "alice")
    payee(world, "bob")
    sale(world, "alice", "in_a", 10_000, "2026-01-05T10:00:00Z")
    sale(world, "bob", "in_b", 20_000, "2026-01-05T10:00:00Z")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    wrong = make_batch(world, "2026-01-31")
    r = world.client.post(
        path(world, "/commissions/in_a/hold"), json={"reason": "dispute"}, headers=world.owner
    )
    assert (r.status_code, r.json()["error"]["code"]) == (409, "line_in_batch")
    assert wrong["payout_id"] in r.json()["error"]["message"]
    cancelled = post(world, f"/payouts/{wrong['payout_id']}/cancel", {"reason": "wrong cut-off"})["data"]
    assert (cancelled["status"], cancelled["cancel_reason"]) == ("cancelled", "wrong cut-off")
    assert [o for o in (r["outcome"] for r in cancelled["rows"])] == ["cancelled", "cancelled"]
    assert statuses(world, "alice") == [("in_a", 3_000, "approved", None)]
    r = world.client.post(path(world, f"/payouts/{wrong['payout_id']}/paid"), headers=world.owner)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "invalid_transition")

    batch = make_batch(world, "2026-01-31")
    assert rows(batch) == [("alice", "usd", 3_000, 1, "paypal"), ("bob", "usd", 6_000, 1, "paypal")]
    assert [b["status"] for b in get(world, "/payouts")] == ["open", "cancelled"]
    post(world, f"/payouts/{batch['payout_id']}/paid")
    r = world.client.post(
        path(world, f"/payouts/{batch['payout_id']}/cancel"), json={"reason": "too late"}, headers=world.owner
    )
    assert (r.status_code, r.json()["error"]["code"]) == (409, "batch_paid")
    files = every_file(world, batch["payout_id"])

    clock.move_to(at("2026-02-20T09:00:00Z"))
    failed = post(
        world,
        f"/payouts/{batch['payout_id']}/rows/bob/usd/failed",
        {"reason": "PayPal returned it: account closed"},
    )["data"]
    outcomes = {r["partner_code"]: (r["outcome"], (r["failure"] or {}).get("reason")) for r in failed["rows"]}
    assert outcomes == {"alice": ("paid", None), "bob": ("failed", "PayPal returned it: account closed")}
    assert failed["totals"] == [{"currency": "usd", "amount": 3_000, "amount_decimal": "30.00", "lines": 1}]
    assert {k: v for k, v in every_file(world, batch["payout_id"]).items() if k != "json"} == {
        k: v for k, v in files.items() if k != "json"
    }
    assert statuses(world, "bob") == [("in_b", 6_000, "approved", None)]
    assert statuses(world, "alice") == [("in_a", 3_000, "paid", batch["payout_id"])]
    bob = statement(world, "bob")
    assert [(e["kind"], e["amount"], e["balance"]) for e in bob["entries"]] == [
        ("commission", 6_000, 6_000),
        ("payout", -6_000, 0),
        ("payout_failed", 6_000, 6_000),
    ]
    assert bob["closing_balance"] == 6_000 == balances(world, "bob")[0]["approved_unpaid"]
    again = post(world, f"/payouts/{batch['payout_id']}/rows/bob/usd/failed", {"reason": "again"})["data"]
    assert again == failed  # once: marking it again changes nothing
    r = world.client.post(
        path(world, f"/payouts/{batch['payout_id']}/rows/carol/usd/failed"),
        json={"reason": "x"},
        headers=world.owner,
    )
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")

    payee(world, "bob", "wise", "usd", email="bob@wise.test")
    clock.move_to(at("2026-03-01T09:00:00Z"))
    retry = make_batch(world, "2026-02-28")
    assert rows(retry) == [("bob", "usd", 6_000, 1, "wise")]
    post(world, f"/payouts/{retry['payout_id']}/paid")
    assert statement(world, "bob")["closing_balance"] == 0


def test_a_cancelled_or_failed_batch_cannot_be_undone_by_a_member(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = program(client, "alice")
    payee(world, "alice")
    sale(world, "alice", "in_a", 10_000, "2026-01-05T10:00:00Z")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    batch = make_batch(world, "2026-01-31")
    member = world.member()
    r = client.post(
        path(world, f"/payouts/{batch['payout_id']}/cancel"), json={"reason": "x"}, headers=member
    )
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")
    r = client.post(path(world, f"/payouts/{batch['payout_id']}/cancel"), json={}, headers=world.owner)
    assert (r.status_code, r.json()["error"]["fields"][0]["field"]) == (422, "reason")
    r = client.post(path(world, "/payouts/po_nope/cancel"), json={"reason": "x"}, headers=world.owner)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    r = client.post(
        path(world, f"/payouts/{batch['payout_id']}/rows/alice/usd/failed"),
        json={"reason": "x"},
        headers=world.owner,
    )
    assert (r.status_code, r.json()["error"]["code"]) == (409, "invalid_transition")  # not paid yet
    other = client.post(
        "/api/v1/operator/accounts", json={"email": "x@other.test", "workspace_name": "Other"}, headers=OP
    ).json()["data"]["token"]
    r = client.post(
        path(world, f"/payouts/{batch['payout_id']}/cancel"),
        json={"reason": "x"},
        headers={"Authorization": f"Bearer {other}"},
    )
    assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found")


# -- statements, balances, manual entries ---------------------------------------------------


def test_statement_entries_and_balances_add_up(client: TestClient, clock: time_machine.Traveller) -> None:
    """Commission, manual bonus, a hold after booking, its release, a refund after payment
    (clawback), a payout: each an entry in log order with its running balance; the closing
    balance is what the next batch pays (before the minimum); `from` gives an opening balance;
    the CSV carries the same."""
    world = program(client, "alice")
    payee(world, "alice")
    sale(world, "alice", "in_1", 10_000, "2026-01-05T10:00:00Z")
    sale(world, "alice", "in_2", 5_000, "2026-01-06T10:00:00Z")
    clock.move_to(at("2026-02-10T09:00:00Z"))
    bonus = post(
        world,
        "/partners/alice/adjustments",
        {"amount": 2_500, "currency": "usd", "reason": "launch bonus"},
        201,
    )["data"]
    assert (bonus["kind"], bonus["amount"], bonus["status"], bonus["status_reason"]) == (
        "manual",
        2_500,
        "approved",
        "launch bonus",
    )
    post(world, "/commissions/in_2/hold", {"reason": "dispute"})
    clock.move_to(at("2026-02-11T09:00:00Z"))
    post(world, "/commissions/in_2/release", {"reason": "resolved"})
    post(world, "/commissions/in_2/hold", {"reason": "second dispute"})
    assert balances(world, "alice") == [
        {"currency": "usd", "approved_unpaid": 5_500, "pending": 0, "held": 1_500}
    ]
    clock.move_to(at("2026-02-15T09:00:00Z"))
    batch = make_batch(world, "2026-02-28")
    assert rows(batch) == [("alice", "usd", 5_500, 2, "paypal")]
    post(world, f"/payouts/{batch['payout_id']}/paid")
    clock.move_to(at("2026-03-01T09:00:00Z"))
    r = world.client.post(
        "/api/v1/track/refund",
        json={"transaction_id": "in_1", "refund_id": "re_1", "amount": 5_000},
        headers=world.key,
    )
    assert r.status_code == 200, r.text
    post(
        world, "/partners/alice/adjustments", {"amount": -500, "currency": "usd", "reason": "correction"}, 201
    )
    found = statement(world, "alice")
    entries = [(e["kind"], e["amount"], e["balance"], e["reason"]) for e in found["entries"]]
    # the two sales were booked by one run: in either order
    assert sorted(entries[:2], key=lambda e: e[1]) in (
        [("commission", 1_500, 1_500, None), ("commission", 3_000, 4_500, None)],
        [("commission", 1_500, 4_500, None), ("commission", 3_000, 3_000, None)],
    )
    assert entries[2:-1] == [
        ("manual", 2_500, 7_000, "launch bonus"),
        ("adjustment", -1_500, 5_500, "held: dispute"),
        ("adjustment", 1_500, 7_000, "released: resolved"),
        ("adjustment", -1_500, 5_500, "held: second dispute"),
        ("payout", -5_500, 0, "payout 1 paid"),
        ("clawback", -1_500, -1_500, entries[-2][3]),
        ("manual", -500, -2_000, "correction"),
    ][:-1] and entries[-1] == ("manual", -500, -2_000, "correction")
    assert str(entries[-2][3]).startswith("caused by ")
    assert found["closing_balance"] == -2_000 == balances(world, "alice")[0]["approved_unpaid"]
    later = statement(world, "alice", "?currency=usd&from=2026-02-15")
    assert later["opening_balance"] == 5_500 and later["entries"][0]["kind"] == "payout"
    assert later["closing_balance"] == found["closing_balance"]
    r = world.client.get(
        path(world, "/partners/alice/statement?currency=usd&format=csv"), headers=world.owner
    )
    table = list(csv.DictReader(io.StringIO(r.content.decode("utf-8-sig"))))
    assert table[0]["kind"] == "opening_balance" and table[-1]["kind"] == "closing_balance"
    assert table[-1]["balance"] == str(found["closing_balance"]) and table[-1]["balance_decimal"] == "-20.00"


def reconcile_now(world: World) -> None:
    r = world.client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text


def test_manual_entries_are_refused_when_wrong(client: TestClient, world: World) -> None:
    for body, field in (
        ({"amount": 0, "currency": "usd", "reason": "x"}, "amount"),
        ({"amount": 1.5, "currency": "usd", "reason": "x"}, "amount"),
        ({"amount": 100, "currency": "dollars", "reason": "x"}, "currency"),
        ({"amount": 100, "currency": "usd"}, "reason"),
        ({"amount": 10**13, "currency": "usd", "reason": "x"}, "amount"),
    ):
        r = client.post(path(world, "/partners/alice/adjustments"), json=body, headers=world.owner)
        assert (r.status_code, r.json()["error"]["fields"][0]["field"]) == (422, field), body
    r = client.post(
        path(world, "/partners/nobody/adjustments"),
        json={"amount": 1, "currency": "usd", "reason": "x"},
        headers=world.owner,
    )
    assert (r.status_code, r.json()["error"]["code"]) == (404, "partner_not_found")
    r = client.post(
        path(world, "/partners/alice/adjustments"),
        json={"amount": 1, "currency": "usd", "reason": "x"},
        headers=world.member(),
    )
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")


# -- money per currency: PayPal's decimals and currencies -------------------------------------


def test_paypal_pays_huf_and_jpy_in_whole_units_and_refuses_what_it_cannot_pay(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """HUF 1,234.57 owed: PayPal takes whole forints, so the batch sends 1,234 and 0.57 stays
    owed (the next batch nets it); JPY is whole already. A PayPal file in KWD: 422
    currency_not_supported naming it; a partner paid in KWD is not paid (currency_not_supported)."""
    world = program(client, "alice", "bob", "dan")
    payee(world, "alice", "paypal", "huf")
    payee(world, "bob", "paypal", "jpy")
    payee(world, "dan", "paypal", "kwd")
    sale(world, "alice", "in_huf", 411_523, "2026-01-05T10:00:00Z", currency="huf")  # 1,234.57 (1234.569)
    sale(world, "bob", "in_jpy", 12_345, "2026-01-05T10:00:00Z", currency="jpy")  # ¥3,704 (3703.5)
    sale(world, "dan", "in_kwd", 12_345, "2026-01-05T10:00:00Z", currency="kwd")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    batch = make_batch(world, "2026-01-31")
    assert [
        (r["partner_code"], r["currency"], r["amount"], r["net"], r["carried_forward"]) for r in batch["rows"]
    ] == [
        ("alice", "huf", 123_400, 123_457, 57),
        ("bob", "jpy", 3_704, 3_704, 0),
    ]
    assert not_paid(batch) == [("dan", "kwd", 3_704, "currency_not_supported")]
    assert file(world, batch["payout_id"], "paypal", "huf").decode().startswith("alice@paypal.test,1234,HUF,")
    assert file(world, batch["payout_id"], "paypal", "jpy").decode().startswith("bob@paypal.test,3704,JPY,")
    r = world.client.get(
        path(world, f"/payouts/{batch['payout_id']}?format=paypal&currency=kwd"), headers=world.owner
    )
    assert (r.status_code, r.json()["error"]["code"]) == (422, "currency_not_supported")
    assert "KWD" in r.json()["error"]["message"]
    post(world, f"/payouts/{batch['payout_id']}/paid")
    alice = statement(world, "alice", "?currency=huf")
    assert alice["closing_balance"] == 57 == balances(world, "alice")[0]["approved_unpaid"]
    assert [(e["kind"], e["amount"]) for e in alice["entries"]][-1] == ("payout", -123_400)


# -- 3: closed months never move ---------------------------------------------------------------


def _report(world: World, period: str) -> bytes:
    r = world.client.get(path(world, f"/reports/finance?period={period}&format=csv"), headers=world.owner)
    assert r.status_code == 200, r.text
    return r.content


def _summary(world: World, period: str) -> dict[str, Any]:
    r = world.client.get(path(world, f"/reports/finance?period={period}"), headers=world.owner)
    assert r.status_code == 200, r.text
    (usd,) = [s for s in r.json()["data"]["summary"] if s["currency"] == "usd"]
    found: dict[str, Any] = usd
    return found


def test_a_hold_or_void_in_a_closed_month_books_an_adjustment_in_the_first_open_one(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """An approved, booked January line, January closed: holding the sale leaves January's report
    byte for byte and books minus 30.00 in February (cause: the hold); releasing it books plus
    30.00; voiding another booked January line books its minus for good. The statement and the
    next batch pay exactly what is owed."""
    world = program(client, "alice")
    payee(world, "alice")
    sale(world, "alice", "in_a", 10_000, "2026-01-05T10:00:00Z")  # 30.00
    sale(world, "alice", "in_b", 5_000, "2026-01-06T10:00:00Z")  # 15.00
    clock.move_to(at("2026-02-10T09:00:00Z"))  # 30 holding days over: approved and booked
    reconcile_now(world)
    assert statuses(world, "alice") == [("in_a", 3000, "approved", None), ("in_b", 1500, "approved", None)]
    post(world, "/periods/2026-01/close")
    january = _report(world, "2026-01")
    assert (_summary(world, "2026-01")["commissions"], _summary(world, "2026-01")["held"]) == (4500, 0)

    clock.move_to(at("2026-02-11T09:00:00Z"))
    post(world, "/commissions/in_a/hold", {"reason": "customer disputes"})
    post(world, "/commissions/in_b/void", {"reason": "fraud"})
    assert _report(world, "2026-01") == january  # the closed month does not move
    lines = [
        (r["transaction_id"], r["kind"], r["period"], r["amount"], r["status"], r["status_reason"])
        for r in get(world, "/commissions")
    ]
    assert sorted(lines) == [
        ("in_a", "adjustment", "2026-02", -3000, "approved", "held: customer disputes"),
        ("in_a", "commission", "2026-01", 3000, "approved", None),
        ("in_b", "adjustment", "2026-02", -1500, "approved", "void: fraud"),
        ("in_b", "commission", "2026-01", 1500, "approved", None),
    ]
    assert _summary(world, "2026-02")["adjustments"] == -4500
    assert statement(world, "alice")["closing_balance"] == 0
    # the sale's state is the log's: held once, released once, a void is final
    post(world, "/commissions/in_a/hold", {"reason": "again"}, expected=409)
    post(world, "/commissions/in_b/release", {"reason": "no"}, expected=409)

    clock.move_to(at("2026-03-02T09:00:00Z"))
    post(world, "/commissions/in_a/release", {"reason": "resolved"})
    assert _report(world, "2026-01") == january
    released = [r for r in get(world, "/commissions") if r["period"] == "2026-03"]
    assert [(r["transaction_id"], r["kind"], r["amount"], r["status_reason"]) for r in released] == [
        ("in_a", "adjustment", 3000, "released: resolved")
    ]
    entries = statement(world, "alice")["entries"]
    # the two commissions were booked in one run, in the order of their sales' ids
    booked = sorted((e["kind"], e["amount"]) for e in entries[:2])
    assert booked == [("commission", 1500), ("commission", 3000)]
    assert [(e["kind"], e["amount"], e["balance"]) for e in entries[1:]] == [
        ("commission", entries[1]["amount"], 4500),
        ("adjustment", -3000, 1500),
        ("adjustment", -1500, 0),
        ("adjustment", 3000, 3000),
    ]
    batch = make_batch(world, "2026-03-31")
    assert rows(batch) == [("alice", "usd", 3000, 5, "paypal")]


# -- the dashboard's and the portal's pages ----------------------------------------------------


def test_the_dashboard_cancels_a_batch_fails_a_row_and_shows_the_statement_the_portal_shows_too(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """Owners cancel an open batch and mark a paid row failed from the Payouts tab (CSRF-checked
    forms); the partner's page and the partner's own portal show the same statement."""
    from tests.api.test_portal_pages import link, sign_in
    from tests.helpers import csrf_of, logged_in

    world = program(client, "alice", "bob")
    payee(world, "alice")
    payee(world, "bob", method="wise")
    sale(world, "alice", "in_a", 10_000, "2026-01-05T10:00:00Z")  # 30.00
    sale(world, "bob", "in_b", 20_000, "2026-01-06T10:00:00Z")  # 60.00
    clock.move_to(at("2026-02-10T09:00:00Z"))
    reconcile_now(world)
    batch = make_batch(world, "2026-01-31")
    base = f"/dashboard/programs/{world.program_id}"
    csrf = logged_in(client, world.account_token)
    page = client.get(f"{base}/payouts")
    assert page.status_code == 200 and f'action="{base}/payouts/{batch["payout_id"]}/cancel"' in page.text
    refused = client.post(f"{base}/payouts/{batch['payout_id']}/cancel", data={"reason": "x"})
    assert refused.status_code == 403  # no CSRF token: nothing happens
    assert get(world, f"/payouts/{batch['payout_id']}")["status"] == "open"
    r = client.post(
        f"{base}/payouts/{batch['payout_id']}/cancel",
        data={"reason": "made by mistake", "csrf_token": csrf},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    cancelled = get(world, f"/payouts/{batch['payout_id']}")
    assert (cancelled["status"], cancelled["cancel_reason"]) == ("cancelled", "made by mistake")
    assert 'id="cancelled"' in client.get(r.headers["location"]).text

    again = make_batch(world, "2026-01-31")
    post(world, f"/payouts/{again['payout_id']}/paid")
    page = client.get(f"{base}/payouts").text
    failing = f"{base}/payouts/{again['payout_id']}/rows/bob/usd/failed"
    assert f'action="{failing}"' in page
    r = client.post(failing, data={"reason": "account closed", "csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303, r.text
    outcomes = {
        row["partner_code"]: row["outcome"] for row in get(world, f"/payouts/{again['payout_id']}")["rows"]
    }
    assert outcomes == {"alice": "paid", "bob": "failed"}

    # bob's page: owed 60.00 again; the statement says why, entry by entry
    mine = client.get(f"{base}/partners/bob")
    assert mine.status_code == 200, mine.text
    assert 'id="statement-usd"' in mine.text and "account closed" in mine.text
    closing = statement(world, "bob")["closing_balance"]
    assert closing == 6000
    shown = re.search(r'class="closing">([^<]+)<', mine.text)
    assert shown is not None and shown.group(1) == "60.00 USD"
    assert client.get(f"{base}/partners/nobody").status_code == 404
    assert csrf_of(mine.text)  # the page is a dashboard page like the others

    # the portal: bob sees the same statement, and its CSV
    sign_in(client, link(world, "bob"))
    own = client.get(f"/partner/programs/{world.program_id}/statement")
    assert own.status_code == 200, own.text
    shown = re.search(r'class="closing">([^<]+)<', own.text)
    assert shown is not None and shown.group(1) == "60.00 USD"
    assert own.text.count('statement-entries"') == 1 and "in_a" not in own.text  # bob's entries only
    rows_csv = client.get(f"/partner/programs/{world.program_id}/statement?format=csv&currency=usd")
    assert rows_csv.status_code == 200 and rows_csv.headers["content-type"].startswith("text/csv")
    assert list(csv.DictReader(io.StringIO(rows_csv.text)))[-1]["balance"] == "6000"
