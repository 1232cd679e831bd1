"""CSV injection (hardening, round two): every CSV export shows a cell that would start a
formula as text (OWASP: a leading `'`), and leaves numbers, negative money included, numbers."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal

import httpx
import pytest
import time_machine
from starlette.testclient import TestClient

from reports.csvcells import neutralise
from tests.conftest import OP, World, make_world
from tests.helpers import payee

PROGRAM_NAME = "=SUM(1+1)*cmd|' /C calc'!A0"
PARTNER_NAME = "@cmd|' /C calc'!A0"
TRANSACTION = '=HYPERLINK("http://evil.test/?x=1","see")'
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def test_neutralise_follows_owasp_and_keeps_numbers() -> None:
    for text in ("=1+2", "+1+2", "-1+2", "@SUM(A1)", "\t=1", "\r=1", "-", "+", "-cmd", "- 1", "-1e5", "=-1"):
        assert neutralise(text) == "'" + text
    for kept in ("-12.50", "-3", "0", "12.5", "", "plain", "a=b", "'=already", 7, -1.5, None):
        assert neutralise(kept) == kept


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(datetime.fromisoformat("2026-01-05T09:00:00+00:00"), tick=True) as traveller:
        yield traveller


def rows(r: httpx.Response) -> list[list[str]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(r.content.decode("utf-8-sig"))))


def cells(table: list[list[str]]) -> list[str]:
    return [cell for row in table for cell in row]


def check(table: list[list[str]], *texts: str) -> None:
    """No cell of `table` starts a formula unless it is a plain number; each of `texts` is
    there, neutralised."""
    found = cells(table)
    for cell in found:
        if cell.startswith(FORMULA_START):
            float(cell)  # a number (negative money): left as it is
    for text in texts:
        assert "'" + text in found, (text, found)


@pytest.fixture
def shop(client: TestClient, clock: time_machine.Traveller) -> World:
    """A program and a partner whose names are formulas, one sale whose transaction id is one
    (attributed to that partner), its refused duplicate, approved, paid out, then partly refunded
    (a negative clawback line)."""
    world = make_world(client, name=PROGRAM_NAME, holding_days=0)
    r = client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "mallory", "name": PARTNER_NAME, "email": "m@partner.test"},
        headers=world.owner,
    )
    assert r.status_code == 201, r.text
    payee(world, "mallory")  # a batch pays only partners with payout details (issue 49)
    pid = world.program_id
    click = client.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "mallory"})
    lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    assert world.sale(transaction_id=TRANSACTION, amount=10_000).status_code == 200
    assert world.sale(transaction_id=TRANSACTION, amount=10_000).status_code == 409
    clock.move_to(datetime.fromisoformat("2026-02-10T09:00:00+00:00"))
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    # a batch pays only partners with payout details (a payee's name never starts with a formula)
    payee(world, "mallory", name="Mallory")
    r = client.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": "2026-01-31"}, headers=world.owner)
    assert r.status_code == 201, r.text
    refund = {"transaction_id": TRANSACTION, "refund_id": "re_1", "amount": 5_000}
    assert client.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    return world


EXPORTS = {
    "sales": ("/sales?format=csv", TRANSACTION),
    "commissions": ("/commissions?period=2026-01&format=csv", TRANSACTION),
    "clawbacks": ("/commissions?period=2026-02&format=csv", TRANSACTION),
    "finance": ("/reports/finance?period=2026-01&format=csv", PROGRAM_NAME),
    "double-counting": ("/reports/double-counting?format=csv", TRANSACTION),
    "payout": ("/payouts/{payout_id}?format=csv", PARTNER_NAME),
}


@pytest.mark.parametrize("export", EXPORTS)
def test_every_csv_export_neutralises_formulas(shop: World, export: str) -> None:
    client, base, owner = shop.client, f"/api/v1/programs/{shop.program_id}", shop.owner
    [batch] = client.get(f"{base}/payouts", headers=owner).json()["data"]
    path, text = EXPORTS[export]
    table = rows(client.get(base + path.format(payout_id=batch["payout_id"]), headers=owner))
    check(table, text)
    if export == "clawbacks":  # negative money stays a number
        [clawback] = [dict(zip(table[0], row, strict=True)) for row in table[1:]]
        assert clawback["kind"] == "clawback" and clawback["amount"].startswith("-")
        assert Decimal(clawback["amount"]) < 0


@pytest.mark.parametrize("start", ["=", "+", "-", "@"])
def test_a_payout_email_starting_like_a_formula_is_refused(world: World, start: str) -> None:
    """Issue 48, item 8: an email cannot start so, and the PayPal and Wise files would have to
    carry a different (`'`-prefixed) address; refused at input. (Partner and program names that
    start so stay accepted: their cells are neutralised, above.)"""
    path = f"/api/v1/programs/{world.program_id}/partners/alice"
    body = {"payout_method": "paypal", "payout_name": "Alice", "payout_currency": "usd"}
    r = world.client.patch(
        path, json={**body, "payout_email": f"{start}cmd@paypal.test"}, headers=world.owner
    )
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), r.text
    assert r.json()["error"]["fields"][0]["field"] == "payout_email"
    inside = "a.cmd@paypal.test" if start == "@" else f"a{start}cmd@paypal.test"  # (one @ only)
    r = world.client.patch(path, json={**body, "payout_email": inside}, headers=world.owner)
    assert r.status_code == 200, r.text
