"""Issue #13's ledger rules, exact to the cent, through the real HTTP API and a real reconcile:
the customer's recurring window, approved lines never rewritten (clawbacks and adjustments), and
payout batches (netting, a negative balance left owed, a batch made twice, mark paid, exports).

Default program here: 30 % commission, 30 holding days, partners alice (cust_1's lead) and bob,
both paid by PayPal in USD.
Time moves with time-machine; every action happens at the time the test sets.
"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from typing import Any

import openpyxl
import pytest
import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import at, logged_in, payee, program_path, query

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def shop(client: TestClient, **settings: Any) -> World:
    """A program with partners alice and bob; customer cust_1 came through alice's link."""
    world = make_world(client, **settings)
    r = client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "bob", "name": "Bob", "email": "bob@partner.test"},
        headers=world.owner,
    )
    assert r.status_code == 201, r.text
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    payee(world, "alice")
    payee(world, "bob")
    return world


def sale(world: World, tx: str, amount: int, occurred_at: str | None = None, **body: Any) -> None:
    fields: dict[str, Any] = {"transaction_id": tx, "amount": amount, **body}
    if occurred_at is not None:
        fields["occurred_at"] = occurred_at
    r = world.sale(**fields)
    assert r.status_code == 200, r.text


def refund(world: World, tx: str, refund_id: str, amount: int) -> None:
    body = {"transaction_id": tx, "refund_id": refund_id, "amount": amount}
    r = world.client.post("/api/v1/track/refund", json=body, headers=world.key)
    assert r.status_code == 200, r.text


def reconcile(client: TestClient) -> None:
    r = client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text


def lines(world: World, period: str | None = None) -> list[dict[str, Any]]:
    query = f"?period={period}" if period else ""
    r = world.client.get(f"/api/v1/programs/{world.program_id}/commissions{query}", headers=world.owner)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["data"]
    return rows


def brief(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            r["transaction_id"],
            r["partner_code"],
            r["kind"],
            r["period"],
            r["amount"],
            r["status"],
            r["adjusts"],
        )
        for r in rows
    )


def finance(world: World, period: str) -> dict[str, Any]:
    """The month's usd figures of the finance report, after checking that every check holds
    (paid + unpaid + clawbacks = commissions among them)."""
    r = world.client.get(
        f"/api/v1/programs/{world.program_id}/reports/finance?period={period}", headers=world.owner
    )
    data = r.json()["data"]
    assert data["reconciled"] is True
    assert any(c["name"] == "payouts_commissions" and c["ok"] for c in data["checks"])
    (usd,) = [row for row in data["summary"] if row["currency"] == "usd"]
    return dict(usd)


def payouts_path(world: World, suffix: str = "") -> str:
    return f"/api/v1/programs/{world.program_id}/payouts{suffix}"


def make_batch(world: World, up_to: str, expected: int = 201) -> dict[str, Any]:
    r = world.client.post(payouts_path(world), json={"up_to": up_to}, headers=world.owner)
    assert r.status_code == expected, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def pay(world: World, payout_id: str) -> dict[str, Any]:
    r = world.client.post(payouts_path(world, f"/{payout_id}/paid"), headers=world.owner)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def rows_of(batch: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (r["partner_code"], r["currency"], r["amount"], r["amount_decimal"], r["lines"], r["carried_forward"])
        for r in batch["rows"]
    ]


# --- the recurring window belongs to the customer --------------------------------------------

# A plan billed on the 31st: on the last day of shorter months.
BILLED = [
    "2025-02-28",
    "2025-03-31",
    "2025-04-30",
    "2025-05-31",
    "2025-06-30",
    "2025-07-31",
    "2025-08-31",
    "2025-09-30",
    "2025-10-31",
    "2025-11-30",
    "2025-12-31",
    "2026-01-31",
]


def test_one_time_purchase_then_subscription_share_the_customers_twelve_months(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """CONTRACT 7: the window belongs to the referred customer, anchored at the first real
    attributed sale: a one-time purchase on Jan 31 then a subscription share one window.
    recurring_months 12: payments dated before Jan 31 + 12 months (exclusive) earn; the 13th
    month's payment (the subscription's 12th, on Jan 31 2026) earns nothing."""
    clock.move_to(at("2025-01-31T08:00:00Z"))
    world = shop(client, recurring_months=12)
    sale(world, "one_time", 10_000, "2025-01-31T10:00:00Z")
    for n, day in enumerate(BILLED, start=1):
        clock.move_to(at(f"{day}T10:30:00Z"))
        sale(world, f"sub_1_in_{n}", 2_000, f"{day}T10:00:00Z", subscription_id="sub_1", is_recurring=True)
    clock.move_to(at("2026-03-15T12:00:00Z"))
    reconcile(client)
    earned = {r["transaction_id"]: r["amount"] for r in lines(world)}
    assert earned == {"one_time": 3_000, **{f"sub_1_in_{n}": 600 for n in range(1, 12)}}
    r = client.get(
        f"/api/v1/programs/{world.program_id}/sales?transaction_id=sub_1_in_12", headers=world.owner
    )
    last = r.json()["data"][0]
    assert (last["partner_code"], last["commission"], last["occurred_at"]) == (
        "alice",
        0,
        "2026-01-31T10:00:00Z",
    )


# --- approved money is never rewritten -------------------------------------------------------


def test_refund_after_approval_leaves_the_line_and_books_a_clawback_in_the_refunds_month(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """CONTRACT 7: a refund of an approved commission is a negative clawback line dated in the
    refund's month; the approved line is unchanged. (A refund before approval still changes the
    pending line in place.)"""
    world = shop(client)
    sale(world, "in_1", 10_000, "2026-01-05T10:00:00Z")
    sale(world, "in_2", 4_000, "2026-01-20T10:00:00Z")
    clock.move_to(at("2026-01-25T10:00:00Z"))
    refund(world, "in_2", "re_pending", 1_000)  # in_2 is pending until Feb 19: changed in place
    clock.move_to(at("2026-02-10T10:00:00Z"))  # in_1 approved on Feb 4
    refund(world, "in_1", "re_1", 2_500)
    reconcile(client)
    assert brief(lines(world, "2026-01")) == [
        ("in_1", "alice", "commission", "2026-01", 3_000, "approved", None),
        ("in_2", "alice", "commission", "2026-01", 900, "pending", None),
    ]
    assert brief(lines(world, "2026-02")) == [
        ("in_1", "alice", "clawback", "2026-02", -750, "approved", "in_1")
    ]
    r = client.get(f"/api/v1/programs/{world.program_id}/sales?transaction_id=in_1", headers=world.owner)
    assert (r.json()["data"][0]["commission"], r.json()["data"][0]["refunded"]) == (2_250, 2_500)
    finance = client.get(
        f"/api/v1/programs/{world.program_id}/reports/finance?period=2026-02", headers=world.owner
    ).json()["data"]
    assert finance["reconciled"] is True


def test_partner_change_after_approval_books_adjustment_lines_in_the_backfills_month(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """A metadata fix applied by a backfill after approval re-attributes the sale to bob:
    alice's approved line stays; alice gets -30.00 and bob +30.00 as adjustment lines dated in
    the month of the backfill."""
    world = shop(client)
    bob_click = client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "bob"}
    ).json()["data"]["click_id"]
    sale(world, "in_1", 10_000, "2026-01-05T10:00:00Z")
    clock.move_to(at("2026-03-02T10:00:00Z"))
    fixes = {"fixes": [{"transaction_id": "in_1", "svc_click_id": bob_click}]}
    path = f"/api/v1/programs/{world.program_id}"
    assert client.post(f"{path}/metadata-fixes", json=fixes, headers=world.owner).status_code == 201
    preview = client.post(
        f"{path}/backfill",
        json={"from": "2026-01-01", "to": "2026-01-31", "dry_run": True},
        headers=world.owner,
    ).json()["data"]
    assert sorted((a["partner_code"], a["amount"], a["period"]) for a in preview["adjustments"]) == [
        ("alice", -3_000, "2026-03"),
        ("bob", 3_000, "2026-03"),
    ]
    r = client.post(
        f"{path}/backfill",
        json={"from": "2026-01-01", "to": "2026-01-31", "dry_run": False},
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    reconcile(client)
    assert brief(lines(world)) == [
        ("in_1", "alice", "adjustment", "2026-03", -3_000, "approved", "in_1"),
        ("in_1", "alice", "commission", "2026-01", 3_000, "approved", None),
        ("in_1", "bob", "adjustment", "2026-03", 3_000, "approved", "in_1"),
    ]


def test_changed_terms_apply_to_sales_from_the_change_on_and_never_rewrite_a_line(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """A change of the program's rate, fee or holding period (PATCH) applies to sales that occur
    from then on: the paid January line, the pending sale of Feb 1 and the closed month keep
    the terms they were earned under; a sale after the change earns the new rate and is held
    for the new period."""
    world = shop(client, platform_fee_bps=500)
    path = f"/api/v1/programs/{world.program_id}"
    sale(world, "in_1", 10_000, "2026-01-05T10:00:00Z")
    sale(world, "in_2", 10_000, "2026-02-01T10:00:00Z")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    pay(world, make_batch(world, "2026-01-31")["payout_id"])
    assert client.post(f"{path}/periods/2026-01/close", headers=world.owner).status_code == 200
    january = finance(world, "2026-01")

    clock.move_to(at("2026-02-16T09:00:00Z"))
    change = {"commission_bps": 5000, "platform_fee_bps": 1000, "holding_days": 0}
    r = client.patch(path, json=change, headers=world.owner)
    assert r.status_code == 200, r.text
    assert client.patch(path, json={"name": "Renamed"}, headers=world.owner).status_code == 200
    # The change is appended to the raw log once, with both sides (the rename changed no term).
    ((body, actor),) = query(
        client,
        "SELECT body, actor FROM raw_events WHERE kind = 'program_terms' AND program_id = ?",
        world.program_id,
    )
    terms = json.loads(body)
    assert (terms["from"]["commission_bps"], terms["to"]["commission_bps"], terms["to"]["holding_days"]) == (
        3000,
        5000,
        0,
    )
    assert actor == terms["by"] != "operator"
    sale(world, "in_3", 10_000, "2026-02-20T10:00:00Z")
    sale(world, "in_4", 10_000, "2026-02-10T10:00:00Z")  # reported late, occurred before the change
    clock.move_to(at("2026-02-21T09:00:00Z"))
    reconcile(client)
    assert brief(lines(world)) == [
        ("in_1", "alice", "commission", "2026-01", 3_000, "paid", None),
        ("in_2", "alice", "commission", "2026-02", 3_000, "pending", None),
        ("in_3", "alice", "commission", "2026-02", 5_000, "approved", None),
        ("in_4", "alice", "commission", "2026-02", 3_000, "pending", None),
    ]
    fees = {r["transaction_id"]: r["platform_fee"] for r in lines(world)}
    assert fees == {"in_1": 500, "in_2": 500, "in_3": 1_000, "in_4": 500}
    assert finance(world, "2026-01") == january
    # Statuses move on with each sale's own holding period in later (incremental) runs.
    clock.move_to(at("2026-03-04T09:00:00Z"))
    reconcile(client)
    statuses = {r["transaction_id"]: r["status"] for r in lines(world)}
    assert statuses == {"in_1": "paid", "in_2": "approved", "in_3": "approved", "in_4": "pending"}
    r = client.get(f"{path}/sales", headers=world.owner)
    sales = {s["transaction_id"]: (s["commission"], s["commission_status"]) for s in r.json()["data"]}
    assert sales["in_4"] == (3_000, "pending")
    assert sales["in_3"] == (5_000, "approved")


# --- payouts ---------------------------------------------------------------------------------


def test_payout_batch_refund_after_payment_and_a_negative_balance_carried(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """CONTRACT 7 payouts: a batch takes every approved, unpaid line dated up to its cut-off,
    netted per partner; paid lines are frozen; a refund after payment is a clawback the next
    batch nets; a negative net pays nothing, its lines stay unpaid, and the next batch nets them."""
    world = shop(client)
    sale(world, "in_1", 10_000, "2026-01-05T10:00:00Z")
    sale(world, "in_2", 5_000, "2026-01-10T10:00:00Z")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    first = make_batch(world, "2026-01-31")
    assert (first["number"], first["status"], first["lines"]) == (1, "open", 2)
    assert rows_of(first) == [("alice", "usd", 4_500, "45.00", 2, 0)]
    paid = pay(world, first["payout_id"])
    assert (paid["status"], paid["paid_by"]) == ("paid", first["created_by"])
    assert {r["status"] for r in lines(world, "2026-01")} == {"paid"}

    clock.move_to(at("2026-02-20T09:00:00Z"))
    refund(world, "in_1", "re_1", 10_000)  # after payment: a clawback, the paid line unchanged
    sale(world, "in_3", 2_000, "2026-02-01T10:00:00Z")
    clock.move_to(at("2026-03-10T09:00:00Z"))
    second = make_batch(world, "2026-02-28", expected=200)  # pays no one: no batch
    assert (second["status"], second["rows"]) == ("empty", [])
    assert [(n["partner_code"], n["balance"], n["lines"], n["reason"]) for n in second["not_paid"]] == [
        ("alice", -2_400, 2, "below_minimum")  # -30.00 + 6.00
    ]
    assert brief(lines(world, "2026-01")) == [
        ("in_1", "alice", "commission", "2026-01", 3_000, "paid", None),
        ("in_2", "alice", "commission", "2026-01", 1_500, "paid", None),
    ]
    feb = {(r["transaction_id"], r["kind"]): (r["amount"], r["payout_id"]) for r in lines(world, "2026-02")}
    assert feb == {("in_1", "clawback"): (-3_000, None), ("in_3", "commission"): (600, None)}

    january, february = finance(world, "2026-01"), finance(world, "2026-02")
    assert [january[k] for k in ("commissions", "paid", "unpaid", "clawbacks")] == [4_500, 4_500, 0, 0]
    assert [february[k] for k in ("commissions", "paid", "unpaid", "clawbacks")] == [-2_400, 0, 600, -3_000]

    sale(world, "in_4", 20_000, "2026-03-01T10:00:00Z")
    clock.move_to(at("2026-04-05T09:00:00Z"))
    third = make_batch(world, "2026-03-31")
    assert rows_of(third) == [("alice", "usd", 3_600, "36.00", 3, 0)]  # 60.00 - 30.00 + 6.00
    assert third["rows"][0]["net"] == 3_600
    feb = {(r["transaction_id"], r["kind"]): (r["amount"], r["payout_id"]) for r in lines(world, "2026-02")}
    assert feb == {
        ("in_1", "clawback"): (-3_000, third["payout_id"]),
        ("in_3", "commission"): (600, third["payout_id"]),
    }


def test_making_a_batch_twice_for_one_cut_off_never_pays_a_line_twice(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """Creating a batch when nothing new is payable: 200 with the existing batch of that
    cut-off (or an empty one); never a second payment of the same line."""
    world = shop(client)
    assert make_batch(world, "2026-01-31", expected=200)["status"] == "empty"
    sale(world, "in_1", 10_000, "2026-01-05T10:00:00Z")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    first = make_batch(world, "2026-01-31")
    again = make_batch(world, "2026-01-31", expected=200)
    assert again["payout_id"] == first["payout_id"]
    assert rows_of(again) == rows_of(first) == [("alice", "usd", 3_000, "30.00", 1, 0)]
    listed = client.get(payouts_path(world), headers=world.owner).json()["data"]
    assert [b["payout_id"] for b in listed] == [first["payout_id"]]
    paid = pay(world, first["payout_id"])
    assert pay(world, first["payout_id"])["paid_at"] == paid["paid_at"]  # paying again changes nothing
    assert make_batch(world, "2026-12-31", expected=200)["status"] == "empty"
    assert [(r["amount"], r["payout_id"]) for r in lines(world)] == [(3_000, first["payout_id"])]


def test_a_payout_exports_as_csv_and_xlsx_with_money_as_numbers(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """The payout CSV: UTF-8 with a BOM, one row per partner and currency, money as plain
    decimal numbers beside the currency; the xlsx: the same rows, each money cell in a number
    format of its own row's currency. Alice is paid in JPY (no decimals), Bob in USD."""
    world = shop(client)
    payee(world, "alice", "wise", "jpy")
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "bob"})
    lead = {"customer_external_id": "cust_2", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    sale(world, "in_usd", 10_005, "2026-01-05T10:00:00Z", customer_external_id="cust_2")
    sale(world, "in_jpy", 12_345, "2026-01-06T10:00:00Z", currency="jpy")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    batch = make_batch(world, "2026-01-31")
    path = payouts_path(world, f"/{batch['payout_id']}")
    r = client.get(f"{path}?format=csv", headers=world.owner)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    assert r.content.startswith("\ufeff".encode())
    table = list(csv.DictReader(io.StringIO(r.content.decode("utf-8-sig"))))
    assert [
        (t["partner_code"], t["partner_name"], t["currency"], t["amount"], t["lines"]) for t in table
    ] == [
        ("alice", "Alice", "jpy", "3704", "1"),
        ("bob", "Bob", "usd", "3002", "1"),
    ]
    assert [Decimal(t["amount_decimal"]) for t in table] == [Decimal("3704"), Decimal("30.02")]
    # the JSON row's fields in its order (money in minor units), then the other money's twins
    assert list(table[0]) == [
        *("partner_code", "partner_name", "partner_email", "amount", "amount_decimal", "currency", "lines"),
        *("net", "carried_in", "carried_forward", "payout_method", "payout_email"),
        *("net_decimal", "carried_in_decimal", "carried_forward_decimal"),
    ]
    assert [(t["net"], t["net_decimal"]) for t in table] == [("3704", "3704"), ("3002", "30.02")]
    assert [(t["payout_method"], t["payout_email"]) for t in table] == [
        ("wise", "alice@wise.test"),
        ("paypal", "bob@paypal.test"),
    ]
    r = client.get(f"{path}?format=xlsx", headers=world.owner)
    assert r.headers["content-type"] == XLSX
    sheet = openpyxl.load_workbook(io.BytesIO(r.content)).active
    assert sheet is not None
    header = [c.value for c in sheet[4]]
    col = header.index("amount_decimal") + 1
    cells = {sheet.cell(row, header.index("currency") + 1).value: sheet.cell(row, col) for row in (5, 6)}
    assert cells["jpy"].value == pytest.approx(3704) and '#,##0 "JPY"' in cells["jpy"].number_format
    assert cells["usd"].value == pytest.approx(30.02) and '0.00 "USD"' in cells["usd"].number_format
    assert sheet.freeze_panes == "A5"


def test_payout_errors_follow_the_contract(client: TestClient, clock: time_machine.Traveller) -> None:
    world = shop(client)
    member = world.member()
    r = client.post(payouts_path(world), json={"up_to": "2026-01-31"}, headers=member)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")
    r = client.get(payouts_path(world), headers=member)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")
    r = client.post(payouts_path(world), json={"up_to": "31/01/2026"}, headers=world.owner)
    assert (r.status_code, r.json()["error"]["fields"][0]["field"]) == (422, "up_to")
    r = client.post(payouts_path(world), json={"up_to": "2026-01-31", "extra": 1}, headers=world.owner)
    assert r.status_code == 422
    for method, suffix in (("GET", "/po_nope"), ("POST", "/po_nope/paid")):
        r = client.request(method, payouts_path(world, suffix), headers=world.owner)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    r = client.get(payouts_path(world, "/po_nope?format=pdf"), headers=world.owner)
    assert r.status_code == 422
    other = client.post(
        "/api/v1/operator/accounts", json={"email": "x@other.test", "workspace_name": "Other"}, headers=OP
    ).json()["data"]["token"]
    r = client.get(payouts_path(world), headers={"Authorization": f"Bearer {other}"})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found")


# --- the dashboard's Payouts tab -------------------------------------------------------------


def test_dashboard_payouts_tab_shows_whats_due_makes_a_batch_exports_and_marks_it_paid(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    """Owners get a Payouts tab: what is due per partner, a form that makes a batch (CSRF
    checked), its rows and downloads, a button that marks it paid. Members see no tab and are
    refused the page."""
    world = shop(client)
    sale(world, "in_1", 10_000, "2026-01-05T10:00:00Z")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    reconcile(client)
    token = logged_in(client, world.account_token)
    page = client.get(program_path(world, "/payouts"))
    assert page.status_code == 200
    assert 'href="/dashboard/programs/' + world.program_id + '/payouts" class="current"' in page.text
    assert '<tr data-partner="alice" data-currency="usd">' in page.text and "30.00 USD" in page.text
    assert 'value="2026-01-31"' in page.text  # the cut-off proposed: the end of last month
    refused = client.post(
        program_path(world, "/payouts"), data={"up_to": "2026-01-31"}, follow_redirects=False
    )
    assert refused.status_code == 403 and "csrf_refused" in refused.text
    r = client.post(
        program_path(world, "/payouts"),
        data={"up_to": "2026-01-31", "csrf_token": token},
        follow_redirects=False,
    )
    assert r.status_code == 303 and "made=po_" in r.headers["location"]
    (batch,) = client.get(payouts_path(world), headers=world.owner).json()["data"]
    page = client.get(r.headers["location"])
    assert f'id="payout-{batch["payout_id"]}"' in page.text and 'id="nothing-due"' in page.text
    download = client.get(program_path(world, f"/payouts/{batch['payout_id']}/export?format=xlsx"))
    assert download.status_code == 200 and download.content[:2] == b"PK"
    r = client.post(
        program_path(world, f"/payouts/{batch['payout_id']}/paid"),
        data={"csrf_token": token},
        follow_redirects=False,
    )
    assert r.status_code == 303
    page = client.get(r.headers["location"])
    assert 'id="marked"' in page.text and "Mark paid" not in page.text
    assert client.get(payouts_path(world), headers=world.owner).json()["data"][0]["status"] == "paid"
    r = client.post(
        program_path(world, "/payouts"),
        data={"up_to": "2026-01-31", "csrf_token": token},
        follow_redirects=False,
    )
    assert "nothing=2026-01-31" in r.headers["location"]

    member = world.member()["Authorization"].removeprefix("Bearer ")
    client.cookies.clear()
    logged_in(client, member)
    assert "/payouts" not in client.get(program_path(world, "/finance")).text
    refused = client.get(program_path(world, "/payouts"))
    assert refused.status_code == 403 and "owner_required" in refused.text


def test_settings_say_the_window_belongs_to_the_customer(client: TestClient, world: World) -> None:
    logged_in(client, world.account_token)
    page = client.get(program_path(world))
    assert "The window belongs to the referred customer" in page.text


def test_settings_say_a_change_applies_to_sales_from_then_on(client: TestClient, world: World) -> None:
    logged_in(client, world.account_token)
    page = client.get(program_path(world))
    assert "applies to sales that occur\n  from the moment you save it" in page.text
