"""Unroutable processor events (CONTRACT section 5) through the real app: listed for the operator
with their reason, newest first in keyed pages; counted in the reconcile summary; picked up by the
next backfill once a program gets the account."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, World, bearer, make_world
from tests.helpers import deliver, query, renewal_event
from tests.stripe_fixtures import with_metadata

URL = "/api/v1/operator/unroutable"
NEW = "acct_1NewlyConnected"
SHARED = "acct_1SharedByTwo"


def stray(event_id: str, invoice_id: str, account: str | None = NEW, **meta: str) -> dict[str, Any]:
    """A live invoice.paid renewal of 50.00 USD for `account` (None: no account), with the
    subscription metadata `meta` (`svc_click_id`, `program_id`...)."""
    event = renewal_event(event_id, invoice_id, account=account or "")
    if account is None:
        del event["account"]
    return with_metadata(event, meta, where="parent") if meta else event


def delivered(client: TestClient, event: dict[str, Any]) -> None:
    r = deliver(client, event)
    assert r.status_code == 200, r.text
    assert r.json()["data"].get("routed") is False, r.text


def reconcile(client: TestClient) -> dict[str, Any]:
    r = client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def listing(client: TestClient, **params: Any) -> dict[str, Any]:
    r = client.get(URL, params=params, headers=OP)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def every_event(client: TestClient) -> list[dict[str, Any]]:
    return listing(client)["events"]


def click(world: World) -> str:
    r = world.client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
    )
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["click_id"])


# -- the operator credential -----------------------------------------------------------------------
def test_only_the_operator_token_lists_them(world: World) -> None:
    r = world.client.post(
        "/api/v1/operator/agent-keys",
        json={"name": "tool", "scopes": ["programs:read"], "workspace_ids": [world.workspace_id]},
        headers=OP,
    )
    agent = bearer(r.json()["data"]["agent_key"])
    refusals = [
        ({}, "missing_credentials"),
        ({"Authorization": "Basic b3A6b3A="}, "malformed_authorization"),
        (world.owner, "operator_token_required"),
        (world.key, "operator_token_required"),
        (agent, "operator_token_required"),
        (bearer("op-test-token-0123456789abcdeX"), "operator_token_required"),
    ]
    for headers, code in refusals:
        r = world.client.get(URL, headers=headers)
        assert r.status_code == 401, (code, r.text)
        assert r.json()["error"]["code"] == code
    assert world.client.get(URL, headers=OP).json() == {"data": {"events": [], "next_cursor": None}}


# -- what is listed, and why ------------------------------------------------------------------------
def test_each_event_is_listed_once_with_why_as_the_programs_are_now(world: World) -> None:
    client = world.client
    programs = []
    for name in ("Shop EU", "Shop US"):
        r = client.post(
            "/api/v1/programs",
            json={"workspace_id": world.workspace_id, "name": name, "stripe_account_id": SHARED},
            headers=world.owner,
        )
        assert r.status_code == 201, r.text
        programs.append(r.json()["data"]["program_id"])
    start = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
    sent = [
        stray("evt_nobody", "in_nobody", "acct_1Nobody"),
        stray("evt_shared", "in_shared", SHARED),
        stray("evt_shared_other", "in_shared_other", SHARED, program_id=world.program_id),
        stray("evt_no_account", "in_no_account", None),
    ]
    for n, event in enumerate(sent):
        with time_machine.travel(start + timedelta(minutes=n), tick=False):
            delivered(client, {**event, "created": int((start + timedelta(minutes=n)).timestamp())})
    with time_machine.travel(start + timedelta(minutes=9), tick=False):
        assert deliver(client, sent[0]).json() == {"data": {"received": True, "duplicate": True}}
    assert every_event(client) == []  # nothing reconciled yet
    assert reconcile(client)["unroutable"] == 4
    got = every_event(client)
    assert [(e["event_id"], e["reason"], e["routes_to"]) for e in got] == [
        ("evt_no_account", "no_account", None),
        ("evt_shared_other", "account_shared", None),
        ("evt_shared", "account_shared", None),
        ("evt_nobody", "account_not_connected", None),
    ]
    assert got[-1] == {
        "event_id": "evt_nobody",
        "type": "invoice.paid",
        "account": "acct_1Nobody",
        "reason": "account_not_connected",
        "received_at": "2026-11-20T09:00:00Z",
        "routes_to": None,
        "metadata_program_id": None,
        "object_id": "in_nobody",
        "amount": 5000,
        "currency": "usd",
        "test_mode": False,
        "occurred_at": "2026-11-20T09:00:00Z",
    }
    assert got[1]["metadata_program_id"] == world.program_id
    # the program gets the account: the event now waits for that program's backfill
    r = client.patch(
        f"/api/v1/programs/{world.program_id}",
        json={"stripe_account_id": "acct_1Nobody"},
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    assert reconcile(client)["unroutable"] == 4
    assert (got := every_event(client))[-1]["reason"] == "awaiting_backfill"
    assert got[-1]["routes_to"] == world.program_id


def test_pages_are_keyed_newest_first_and_bad_parameters_are_refused(world: World) -> None:
    client = world.client
    start = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
    for n in range(5):
        with time_machine.travel(start + timedelta(seconds=n), tick=False):
            delivered(client, stray(f"evt_{n}", f"in_{n}"))
    reconcile(client)
    first = listing(client, limit=2)
    assert [e["event_id"] for e in first["events"]] == ["evt_4", "evt_3"]
    assert isinstance(first["next_cursor"], str)
    # an event received meanwhile does not shift the pages after the first
    with time_machine.travel(start + timedelta(minutes=5), tick=False):
        delivered(client, stray("evt_late", "in_late"))
    assert reconcile(client)["unroutable"] == 6
    second = listing(client, limit=2, cursor=first["next_cursor"])
    assert [e["event_id"] for e in second["events"]] == ["evt_2", "evt_1"]
    third = listing(client, limit=2, cursor=second["next_cursor"])
    assert [e["event_id"] for e in third["events"]] == ["evt_0"]
    assert third["next_cursor"] is None
    assert [e["event_id"] for e in listing(client)["events"]][:2] == ["evt_late", "evt_4"]
    assert len(listing(client, limit=6)["events"]) == 6 and listing(client, limit=6)["next_cursor"] is None
    for params, field in [
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "two"}, "limit"),
        ({"limit": "²"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "eyJyIjogMX0"}, "cursor"),  # JSON, but not ours
    ]:
        r = client.get(URL, params=params, headers=OP)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["error"]["code"] == "validation_error"
        assert [f["field"] for f in r.json()["error"]["fields"]] == [field]


# -- picked up by a backfill -------------------------------------------------------------------------
def _backfill(world: World, start: str, end: str, dry_run: bool) -> dict[str, Any]:
    r = world.client.post(
        f"/api/v1/programs/{world.program_id}/backfill",
        json={"from": start, "to": end, "dry_run": dry_run},
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def _around_today() -> tuple[str, str]:
    """A backfill range around the events made now (a day either side: midnight cannot split it)."""
    today = datetime.now(UTC).date()
    return (today - timedelta(days=1)).isoformat(), (today + timedelta(days=1)).isoformat()


def _sales(world: World) -> list[tuple[Any, ...]]:
    r = world.client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner)
    return [(s["transaction_id"], s["source"], s["partner_code"], s["commission"]) for s in r.json()["data"]]


def test_a_backfill_picks_up_the_events_once_the_program_has_the_account(client: TestClient) -> None:
    world = make_world(client, commission_bps=3000)  # not connected to any processor account yet
    clicked = click(world)
    start, end = _around_today()
    old = stray("evt_old", "in_old", svc_click_id=clicked)
    old["created"] = int((datetime.now(UTC) - timedelta(days=40)).timestamp())  # outside the range
    delivered(client, stray("evt_sale", "in_sale", svc_click_id=clicked))
    delivered(client, old)
    assert reconcile(client)["unroutable"] == 2
    assert {e["reason"] for e in every_event(client)} == {"account_not_connected"}
    assert _sales(world) == []

    r = client.patch(
        f"/api/v1/programs/{world.program_id}", json={"stripe_account_id": NEW}, headers=world.owner
    )
    assert r.status_code == 200, r.text
    assert reconcile(client)["unroutable"] == 2
    assert {(e["reason"], e["routes_to"]) for e in every_event(client)} == {
        ("awaiting_backfill", world.program_id)
    }

    # the dry run shows the sale it would bring in, and changes nothing
    rows_before = query(client, "SELECT count(*) FROM raw_events")
    preview = _backfill(world, start, end, dry_run=True)
    assert [e["event_id"] for e in preview["picked_up"]] == ["evt_sale"]
    assert preview["picked_up"][0]["account"] == NEW and preview["picked_up"][0]["type"] == "invoice.paid"
    [changed] = preview["changed_sales"]
    assert changed["transaction_id"] == "in_sale" and changed["currency"] == "usd"
    assert (changed["before_partner_code"], changed["before_commission"]) == (None, None)
    assert (
        changed["after_partner_code"],
        changed["after_attribution_rule"],
        changed["after_commission"],
    ) == (
        "alice",
        "click",
        1_500,
    )
    assert preview["partner_totals"] == [
        {"partner_code": "alice", "currency": "usd", "before": 0, "after": 1_500, "delta": 1_500}
    ]
    assert query(client, "SELECT count(*) FROM raw_events") == rows_before
    assert _sales(world) == []

    # applied: the event is the program's sale, attributed and commissioned, and leaves the list
    applied = _backfill(world, start, end, dry_run=False)
    assert [e["event_id"] for e in applied["picked_up"]] == ["evt_sale"] and applied["applied"] is True
    assert _sales(world) == [("in_sale", "connect", "alice", 1_500)]
    assert [e["event_id"] for e in every_event(client)] == ["evt_old"]  # its date is 40 days back
    assert reconcile(client)["unroutable"] == 1
    copies = query(
        client,
        "SELECT program_id, outcome, source, actor FROM raw_events WHERE event_id = 'evt_sale' ORDER BY seq",
    )
    assert copies[0] == (None, "unroutable", "stripe", None)
    assert (
        copies[1][:3] == (world.program_id, "accepted", "backfill") and copies[1][3] == applied["applied_by"]
    )
    # as a delivery routed to the program would: checklist, tracking log, its ids claimed
    r = client.get(f"/api/v1/programs/{world.program_id}/checklist", headers=world.owner)
    done = {s["key"]: s["done"] for s in r.json()["data"]["steps"]}
    assert done["processor_event_received"] and done["sale_received"]
    r = client.get(f"/api/v1/programs/{world.program_id}/tracking-log", headers=world.owner)
    [line] = [e for e in r.json()["data"]["entries"] if e["outcome"] == "picked_up"]
    assert (
        line["endpoint"] == "backfill"
        and "evt_sale" in line["detail"]
        and applied["backfill_id"] in line["detail"]
    )
    assert world.sale(transaction_id="in_sale").json()["error"]["code"] == "duplicate_transaction"

    # picked up once: the same backfill again brings nothing; a wider one takes the older event
    again = _backfill(world, start, end, dry_run=False)
    assert again["picked_up"] == [] and again["changes"] == 0
    wider = _backfill(world, (datetime.now(UTC) - timedelta(days=60)).date().isoformat(), end, dry_run=False)
    assert [e["event_id"] for e in wider["picked_up"]] == ["evt_old"]
    assert sorted(_sales(world)) == [
        ("in_old", "connect", "alice", 1_500),
        ("in_sale", "connect", "alice", 1_500),
    ]
    assert every_event(client) == []
    assert reconcile(client)["unroutable"] == 0


def test_a_shared_account_is_picked_up_only_by_the_program_the_metadata_names(world: World) -> None:
    client = world.client
    sharing = []
    for name in ("Shop EU", "Shop US"):
        r = client.post(
            "/api/v1/programs",
            json={"workspace_id": world.workspace_id, "name": name, "stripe_account_id": SHARED},
            headers=world.owner,
        )
        sharing.append(r.json()["data"]["program_id"])
    # metadata naming a program that does not share the account yet: unroutable
    delivered(client, stray("evt_named", "in_named", SHARED, program_id=world.program_id))
    delivered(client, stray("evt_unnamed", "in_unnamed", SHARED))
    r = client.patch(
        f"/api/v1/programs/{world.program_id}", json={"stripe_account_id": SHARED}, headers=world.owner
    )
    assert r.status_code == 200, r.text
    start, end = _around_today()
    for other in sharing:
        r = client.post(
            f"/api/v1/programs/{other}/backfill",
            json={"from": start, "to": end, "dry_run": False},
            headers=OP,
        )
        assert r.status_code == 200 and r.json()["data"]["picked_up"] == [], r.text
    mine = _backfill(world, start, end, dry_run=False)
    assert [e["event_id"] for e in mine["picked_up"]] == ["evt_named"]
    assert [(e["event_id"], e["reason"]) for e in every_event(client)] == [("evt_unnamed", "account_shared")]
