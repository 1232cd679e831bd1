"""What the reads say about the ledger, through the real app and a real reconcile: a sale whose
commission line is in a paid batch says `paid` (sales JSON and CSV, explain, the dashboard), and
the finance JSON says whether its month is closed, when and by whom."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import datetime

import pytest
import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import logged_in, payee, program_path


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(at("2026-01-01T09:00:00Z"), tick=True) as traveller:
        yield traveller


def shop(client: TestClient) -> World:
    """30 %, 30 holding days; customer cust_1 came through alice's link; alice has payout details."""
    world = make_world(client)
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    payee(world, "alice")  # a batch pays only partners with payout details
    return world


def sell(world: World, tx: str, amount: int, occurred_at: str) -> None:
    r = world.sale(transaction_id=tx, amount=amount, occurred_at=occurred_at)
    assert r.status_code == 200, r.text


def test_a_sale_whose_line_is_paid_says_paid_in_every_read(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = shop(client)
    path = f"/api/v1/programs/{world.program_id}"
    sell(world, "in_paid", 10_000, "2026-01-05T10:00:00Z")
    sell(world, "in_approved", 5_000, "2026-01-10T10:00:00Z")
    sell(world, "in_pending", 2_000, "2026-02-10T10:00:00Z")
    clock.move_to(at("2026-02-15T09:00:00Z"))
    r = client.post(f"{path}/payouts", json={"up_to": "2026-01-05"}, headers=world.owner)
    assert r.status_code == 201, r.text
    batch = r.json()["data"]
    r = client.post(f"{path}/payouts/{batch['payout_id']}/paid", headers=world.owner)
    assert r.status_code == 200, r.text
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    lines = client.get(f"{path}/commissions", headers=world.owner).json()["data"]
    assert {x["transaction_id"]: x["status"] for x in lines} == {
        "in_paid": "paid",
        "in_approved": "approved",
        "in_pending": "pending",
    }
    expected = {"in_paid": "paid", "in_approved": "approved", "in_pending": "pending"}

    r = client.get(f"{path}/sales", headers=world.owner)
    assert {s["transaction_id"]: s["commission_status"] for s in r.json()["data"]} == expected
    r = client.get(f"{path}/sales?transaction_id=in_paid", headers=world.owner)
    assert [s["commission_status"] for s in r.json()["data"]] == ["paid"]
    r = client.get(f"{path}/sales?format=csv", headers=world.owner)
    rows = csv.DictReader(io.StringIO(r.content.decode("utf-8-sig")))
    assert {row["transaction_id"]: row["commission_status"] for row in rows} == expected
    r = client.get(f"{path}/sales/in_paid/explain", headers=world.owner)
    assert r.json()["data"]["sale"]["commission_status"] == "paid"
    r = client.get(f"{path}/sales/in_approved/explain", headers=world.owner)
    assert r.json()["data"]["sale"]["commission_status"] == "approved"

    logged_in(client, world.account_token)
    page = client.get(program_path(world, "/sales")).text
    shown = dict(re.findall(r'sales/(in_\w+)">.*?data-status="(\w+)"', page, re.DOTALL))
    assert shown == expected
    page = client.get(program_path(world, "/sales/in_paid")).text
    assert re.search(r"<dt>Commission</dt><dd>30\.00 USD \(<span [^>]*>Paid</span>\)", page)


def test_the_finance_json_says_whether_the_month_is_closed(
    client: TestClient, clock: time_machine.Traveller
) -> None:
    world = shop(client)
    path = f"/api/v1/programs/{world.program_id}"
    sell(world, "in_1", 10_000, "2026-01-05T10:00:00Z")
    clock.move_to(at("2026-02-02T09:00:00Z"))
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200

    def report() -> dict[str, object]:
        r = client.get(f"{path}/reports/finance?period=2026-01", headers=world.owner)
        assert r.status_code == 200, r.text
        data: dict[str, object] = r.json()["data"]
        return data

    assert {k: report()[k] for k in ("closed", "closed_at", "closed_by")} == {
        "closed": False,
        "closed_at": None,
        "closed_by": None,
    }
    r = client.post(f"{path}/periods/2026-01/close", headers=world.owner)
    assert r.status_code == 200, r.text
    close = r.json()["data"]
    data = report()
    assert data["closed"] is True
    assert data["closed_at"] == close["closed_at"] and data["closed_by"] == close["closed_by"]
    assert str(data["closed_by"]).startswith("acc")
