"""The double-counting report through the real app (issue 13): a sale seen by the processor and
by the brand's server, retried twice, counts its money once; a column says when the processor's
record and the self-hosted call named different partners; json and csv agree."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import ACCOUNT, deliver, renewal_event
from tests.stripe_fixtures import with_metadata


def _click(world: World, code: str) -> str:
    r = world.client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": code})
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["click_id"])


def _processor_sale(world: World, invoice_id: str, click_id: str) -> None:
    event = with_metadata(
        renewal_event(f"evt_{invoice_id}", invoice_id), {"svc_click_id": click_id}, "parent"
    )
    r = deliver(world.client, event)
    assert r.status_code == 200 and r.json()["data"]["program_id"] == world.program_id, r.text


def _brand_sale(world: World, invoice_id: str, customer: str) -> int:
    return world.sale(transaction_id=invoice_id, customer_external_id=customer, amount=5000).status_code


def _report(world: World, fmt: str = "json") -> Any:
    r = world.client.get(
        f"/api/v1/programs/{world.program_id}/reports/double-counting",
        params={"format": fmt},
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    return r.json()["data"] if fmt == "json" else r.text


# mid-month, so the sales (dated when received) and the finance report's month are the same month
# however long the test takes on a loaded machine
NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


@time_machine.travel(NOW, tick=True)
def test_a_retried_duplicate_adds_no_money_and_a_partner_mismatch_shows(client: TestClient) -> None:
    world = make_world(client, stripe_account_id=ACCOUNT)
    r = client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "bob", "name": "Bob"},
        headers=world.owner,
    )
    assert r.status_code == 201, r.text
    alice, bob = _click(world, "alice"), _click(world, "bob")
    r = client.post(
        "/api/v1/track/lead", json={"customer_external_id": "u1", "click_id": bob}, headers=world.key
    )
    assert r.status_code == 200, r.text

    # in_dc1: the brand's server records it first (its lead names bob); the processor's record
    # (its metadata's click names alice) arrives and wins; the brand retries twice, refused
    assert _brand_sale(world, "in_dc1", "u1") == 200
    _processor_sale(world, "in_dc1", alice)
    assert _brand_sale(world, "in_dc1", "u1") == 409
    assert _brand_sale(world, "in_dc1", "u1") == 409
    # in_dc2: the processor first (alice), then the brand's call for a customer no lead names
    _processor_sale(world, "in_dc2", alice)
    assert _brand_sale(world, "in_dc2", "u_nobody") == 409
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200

    data = _report(world)
    rows = [
        (
            d["kind"],
            d["transaction_id"],
            d["amount"],
            d["distinct_amount"],
            d["partner_code"],
            d["duplicate_partner_code"],
            d["partner_mismatch"],
        )
        for d in data["double_counts"]
    ]
    assert sorted(rows) == [
        ("connect_and_self_hosted", "in_dc1", 5000, 5000, "alice", "bob", True),
        ("ingest_refused", "in_dc1", 5000, 0, "alice", "bob", True),
        ("ingest_refused", "in_dc1", 5000, 0, "alice", "bob", True),
        ("ingest_refused", "in_dc2", 5000, 5000, "alice", None, False),
    ]
    # four lines, two sales: 100.00 seen twice, not 200.00
    assert data["totals"] == [
        {"currency": "usd", "lines": 4, "sales": 2, "amount": 10_000, "partner_mismatches": 3}
    ]
    assert sum(s["amount"] for s in data["summary"]) == 10_000
    assert {(s["kind"], s["count"]) for s in data["summary"]} == {
        ("connect_and_self_hosted", 1),
        ("ingest_refused", 3),
    }

    table = list(csv.DictReader(io.StringIO(_report(world, "csv"))))
    assert len(table) == 4
    assert sum(int(row["distinct_amount"]) for row in table) == 10_000
    assert sorted(
        (row["transaction_id"], row["duplicate_partner_code"], row["partner_mismatch"]) for row in table
    ) == [
        ("in_dc1", "bob", "true"),
        ("in_dc1", "bob", "true"),
        ("in_dc1", "bob", "true"),
        ("in_dc2", "", "false"),
    ]

    # the finance report counts the same money once
    period = NOW.strftime("%Y-%m")
    r = client.get(
        f"/api/v1/programs/{world.program_id}/reports/finance", params={"period": period}, headers=world.owner
    )
    finance = r.json()["data"]
    assert (finance["summary"][0]["double_counts_count"], finance["summary"][0]["double_counts_amount"]) == (
        4,
        10_000,
    )
    assert finance["reconciled"] is True
