"""Verified deliveries whose amounts or times are out of bounds (CONTRACT sections 4 and 5): stored
verbatim as `unusable`, answered 422 naming the payload path with `"stored": true`, no key
claimed, a tracking-log line for their program, and never a sale for the reconciler."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from starlette.testclient import TestClient

from ingest.domain.bounds import LATEST, MAX_AMOUNT
from ingest.stripe import read
from tests.conftest import OP, World, make_world
from tests.helpers import ACCOUNT, LEGACY_INVOICE, LIVE_CHECKOUT, deliver, log_entries, query
from tests.stripe_fixtures import load_event, serialise

BIG = 2**63
LATEST_SECONDS = int(LATEST.timestamp())


@pytest.fixture
def connected(client: TestClient) -> World:
    return make_world(client, stripe_account_id=ACCOUNT)


def invoice(**changes: Any) -> dict[str, Any]:
    """A live `invoice.paid` for `ACCOUNT`, its invoice object changed by `changes`."""
    event = load_event(LEGACY_INVOICE, account=ACCOUNT, livemode=True)
    event["data"]["object"].update(changes)
    return event


def assert_unusable(response: Any, *paths: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error" and error["stored"] is True
    assert [f["field"] for f in error["fields"]] == list(paths)


def raw(client: TestClient) -> list[tuple[Any, ...]]:
    return query(client, "SELECT outcome, program_id, amount, tax, occurred_at FROM raw_events ORDER BY seq")


def keys(client: TestClient) -> list[tuple[Any, ...]]:
    return query(client, "SELECT program_id, key FROM idempotency_keys ORDER BY key")


def test_huge_invoice_amount_is_stored_unusable_and_answered_422(connected: World) -> None:
    client = connected.client
    event = invoice(amount_paid=BIG)
    body = serialise(event)
    r = deliver(client, body)
    assert_unusable(r, "data.object.amount_paid")
    rows = raw(client)
    assert [(o, p, a) for o, p, a, _, _ in rows] == [("unusable", connected.program_id, None)]
    assert rows[0][4] is not None  # the times were in bounds: kept
    assert query(client, "SELECT body FROM raw_events") == [(body.decode(),)]
    assert keys(client) == []
    [entry] = log_entries(connected)
    assert (entry["status"], entry["outcome"]) == (422, "unusable")
    assert "data.object.amount_paid" in entry["detail"]

    # Stripe retries: each retry is stored as unusable again, and answered the same way
    assert_unusable(deliver(client, body), "data.object.amount_paid")
    assert [o for o, *_ in raw(client)] == ["unusable", "unusable"]
    assert keys(client) == []


def test_amounts_at_the_bounds_are_accepted(connected: World) -> None:
    client = connected.client
    assert deliver(client, invoice(amount_paid=MAX_AMOUNT, tax=MAX_AMOUNT)).status_code == 200
    zero = invoice(id="in_zero", amount_paid=0)
    zero["id"] = "evt_zero"
    assert deliver(client, zero).status_code == 200
    assert [(o, a) for o, _, a, _, _ in raw(client)] == [("accepted", MAX_AMOUNT), ("accepted", 0)]


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"amount_paid": MAX_AMOUNT + 1}, "data.object.amount_paid"),
        ({"amount_paid": -1}, "data.object.amount_paid"),
        ({"tax": MAX_AMOUNT + 1}, "data.object.tax"),
        ({"total_taxes": [{"amount": 5}, {"amount": BIG}]}, "data.object.total_taxes.1.amount"),
        ({"total_taxes": [{"amount": MAX_AMOUNT}, {"amount": 1}]}, "data.object.total_taxes"),
        ({"status_transitions": {"paid_at": LATEST_SECONDS + 1}}, "data.object.status_transitions.paid_at"),
        ({"status_transitions": {"paid_at": -1}}, "data.object.status_transitions.paid_at"),
        ({"status_transitions": {"paid_at": 10**20}}, "data.object.status_transitions.paid_at"),
    ],
)
def test_each_out_of_bounds_invoice_value_is_named(
    connected: World, changes: dict[str, Any], path: str
) -> None:
    assert_unusable(deliver(connected.client, invoice(**changes)), path)
    assert [o for o, *_ in raw(connected.client)] == ["unusable"]
    assert keys(connected.client) == []


def test_event_created_out_of_bounds_is_named(connected: World) -> None:
    event = invoice()
    event["created"] = -1
    assert_unusable(deliver(connected.client, event), "created")
    event["created"] = LATEST_SECONDS  # the last second tally holds
    assert deliver(connected.client, event).status_code == 200


def test_checkout_and_refund_amounts_are_bounded_too(connected: World) -> None:
    checkout = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    checkout["data"]["object"]["total_details"]["amount_tax"] = BIG
    assert_unusable(deliver(connected.client, checkout), "data.object.total_details.amount_tax")
    refund = load_event("stripe-sync-engine__charge_refunded.json", account=ACCOUNT, livemode=True)
    refund["data"]["object"]["amount_refunded"] = MAX_AMOUNT + 1
    assert_unusable(deliver(connected.client, refund), "data.object.amount_refunded")


def test_unroutable_unusable_event_is_stored_without_a_program(client: TestClient) -> None:
    event = load_event(LEGACY_INVOICE, account="acct_nobody", livemode=True)
    event["data"]["object"]["amount_paid"] = BIG
    assert_unusable(deliver(client, event), "data.object.amount_paid")
    assert [(o, p) for o, p, *_ in raw(client)] == [("unusable", None)]


def test_reconciler_never_turns_an_unusable_event_into_a_sale(connected: World) -> None:
    client = connected.client
    late = invoice(status_transitions={"paid_at": LATEST_SECONDS + 1})
    assert_unusable(deliver(client, late), "data.object.status_transitions.paid_at")
    good = copy.deepcopy(late)
    good["id"], good["data"]["object"]["id"] = "evt_good", "in_good"
    good["data"]["object"]["status_transitions"] = {"paid_at": 1_700_000_000}
    assert deliver(client, good).status_code == 200
    r = client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text
    sales = client.get(f"/api/v1/programs/{connected.program_id}/sales", headers=connected.owner)
    assert [s["transaction_id"] for s in sales.json()["data"]] == ["in_good"]


def test_read_names_problems_and_leaves_the_fields_null() -> None:
    fields, problems = read(invoice(amount_paid=BIG, tax=3))
    assert fields["amount"] is None and fields["tax"] == 3 and fields["invoice_id"]
    assert [p["field"] for p in problems] == ["data.object.amount_paid"]
    fields, problems = read(invoice(amount_paid="lots"))  # a wrong type is tolerated, not a bound
    assert fields["amount"] is None and problems == []
