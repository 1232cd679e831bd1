"""Every CSV tally serves has one format (reports/csvcells.py): the API's sales, commissions,
finance, double-counting and payout CSVs and the dashboard's downloads alike. UTF-8 with a BOM,
CRLF, a header row; money in integer minor units as in the JSON (CONTRACT section 1; a payout
row's `amount`, section 7), and beside each money column its `_decimal` twin in whole units of the
row's currency, with exactly that currency's decimals. No other cell is a decimal fraction."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal

import httpx
import pytest
import time_machine
from starlette.testclient import TestClient

from reports.money import exponent, units
from tests.conftest import OP, World, make_world
from tests.helpers import logged_in, payee

FRACTION = re.compile(r"-?[0-9]+\.[0-9]+")
MINOR = re.compile(r"-?[0-9]+")
# Per CSV: its path (under the program's API path, or the dashboard's) and the money fields it
# must carry with their whole-unit twins.
API_CSVS = {
    "sales": ("/sales?format=csv", ("amount", "commission", "platform_fee", "refunded")),
    "commissions": ("/commissions?period=2026-01&format=csv", ("amount", "platform_fee")),
    "clawbacks": ("/commissions?period=2026-02&format=csv", ("amount", "platform_fee")),
    "finance": ("/reports/finance?period=2026-01&format=csv", ("value",)),
    "double counting": ("/reports/double-counting?format=csv", ("amount", "distinct_amount")),
    "payout": ("/payouts/{payout_id}?format=csv", ("amount", "net", "carried_in", "carried_forward")),
}
DASHBOARD_CSVS = {
    "dashboard sales": ("/sales?currency=usd&format=csv", ("amount", "commission", "refunded")),
    "dashboard finance": ("/finance/export?period=2026-01&format=csv", ("value",)),
    "dashboard payout": ("/payouts/{payout_id}/export?format=csv", ("amount", "net")),
}


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(datetime.fromisoformat("2026-01-05T09:00:00+00:00"), tick=True) as traveller:
        yield traveller


@pytest.fixture
def shop(client: TestClient, clock: time_machine.Traveller) -> World:
    """Attributed sales in usd, jpy and kwd (a zero- and a three-decimal currency), an
    unattributed one, a refused duplicate; approved, paid out, then partly refunded (a negative
    clawback line in February)."""
    world = make_world(client, holding_days=0, commission_bps=2500, platform_fee_bps=500)
    pid = world.program_id
    click = client.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"})
    lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    for txn, amount, currency in (
        ("in_usd", 10_005, "usd"),
        ("in_jpy", 9_000, "jpy"),
        ("in_kwd", 12_345, "kwd"),
    ):
        assert world.sale(transaction_id=txn, amount=amount, currency=currency).status_code == 200
    assert world.sale(transaction_id="in_lone", customer_external_id="nobody", amount=700).status_code == 200
    assert world.sale(transaction_id="in_usd", amount=10_005).status_code == 409
    clock.move_to(datetime.fromisoformat("2026-02-10T09:00:00+00:00"))
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    payee(world, "alice")  # paid in usd: the jpy and kwd lines wait, not_paid
    r = client.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": "2026-01-31"}, headers=world.owner)
    assert r.status_code == 201, r.text
    refund = {"transaction_id": "in_usd", "refund_id": "re_1", "amount": 5_000}
    assert client.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    return world


def check_format(name: str, r: httpx.Response, money: tuple[str, ...]) -> int:
    """`r` is a CSV in the one format carrying `money` with their twins; its number of money cells."""
    assert r.status_code == 200, (name, r.text)
    assert r.headers["content-type"] == "text/csv; charset=utf-8", name
    assert r.headers["content-disposition"].startswith('attachment; filename="'), name
    assert r.content.startswith("\ufeff".encode()), f"{name}: no BOM"
    text = r.content.decode("utf-8")
    assert text.endswith("\r\n") and text.count("\n") == text.count("\r\n"), f"{name}: not CRLF"
    header, *rows = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"))))
    assert rows, f"{name}: no rows"
    assert "currency" in header, name
    for field in money:
        assert field in header and f"{field}_decimal" in header, (name, field, header)
    twins = [c for c in header if c.endswith("_decimal") and c.removesuffix("_decimal") in header]
    assert set(twins) >= {f"{m}_decimal" for m in money}, name
    seen = 0
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        for column, cell in cells.items():
            if not column.endswith("_decimal"):  # money in minor units: never a fraction
                assert not FRACTION.fullmatch(cell), (name, column, cell)
        for twin in twins:
            minor, whole = cells[twin.removesuffix("_decimal")], cells[twin]
            if whole == "":
                continue
            currency = cells["currency"]
            assert MINOR.fullmatch(minor), (name, twin, minor)
            assert Decimal(whole) == units(int(minor), currency), (name, twin, minor, whole)
            places = len(whole.partition(".")[2])
            assert places == exponent(currency), (name, twin, whole, currency)
            seen += 1
    return seen


def test_every_csv_has_the_same_format(shop: World, client: TestClient) -> None:
    base = f"/api/v1/programs/{shop.program_id}"
    [batch] = client.get(f"{base}/payouts", headers=shop.owner).json()["data"]
    money_cells = {}
    for name, (path, money) in API_CSVS.items():
        r = client.get(base + path.format(payout_id=batch["payout_id"]), headers=shop.owner)
        money_cells[name] = check_format(name, r, money)
    logged_in(client, shop.account_token)
    for name, (path, money) in DASHBOARD_CSVS.items():
        r = client.get(f"/dashboard/programs/{shop.program_id}{path.format(payout_id=batch['payout_id'])}")
        money_cells[name] = check_format(name, r, money)
    assert all(money_cells.values()), money_cells  # every CSV had money to check
    # the three currencies' decimals all met: 0 (jpy), 2 (usd) and 3 (kwd)
    r = client.get(f"{base}/sales?format=csv", headers=shop.owner)
    sales = {row["transaction_id"]: row for row in csv.DictReader(io.StringIO(r.content.decode("utf-8-sig")))}
    assert [sales[t]["amount_decimal"] for t in ("in_jpy", "in_usd", "in_kwd")] == [
        "9000",
        "100.05",
        "12.345",
    ]
    assert [sales[t]["amount"] for t in ("in_jpy", "in_usd", "in_kwd")] == ["9000", "10005", "12345"]
