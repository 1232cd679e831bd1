"""A `\\u` escape naming a lone surrogate (`"evt_\\ud800_1"`, six ASCII characters in the body)
is not a character: no JSON body holding one gets past the door, on any endpoint (CONTRACT
section 1: 400 `invalid_json`), signed processor deliveries included, and an unsigned one is
refused for its signature as before, never with a 500."""

from __future__ import annotations

import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from ingest.stripe import sign
from tests.conftest import OP, WEBHOOK_SECRET, World, bearer, make_world
from tests.helpers import ACCOUNT, LIVE_CHECKOUT, deliver, log_entries, query
from tests.stripe_fixtures import load_event, serialise

# Where a lone surrogate goes in a delivery (a placeholder swapped for the escape in the body).
MARK = "SURROGATE"
PLACES: dict[str, tuple[str, bytes]] = {
    "event id": ("id", b"\\ud800"),
    "event type": ("type", b"\\udfff"),
    "metadata key": ("metadata key", b"\\udc00\\ud800"),  # a pair in the wrong order is two lone ones
}


@pytest.fixture
def connected(client: TestClient) -> World:
    return make_world(client, stripe_account_id=ACCOUNT)


def _delivery(place: str, n: int) -> bytes:
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT, event_id=f"evt_lone_{n}")
    field, escape = PLACES[place]
    if field == "metadata key":
        event["data"]["object"]["metadata"] = {f"k_{MARK}": "v"}
    else:
        event[field] = f"{event[field]}_{MARK}_1"
    body = serialise(event)
    assert body.count(MARK.encode()) == 1
    return body.replace(MARK.encode(), escape)


def _stored(client: TestClient) -> list[tuple[Any, ...]]:
    return query(client, "SELECT count(*) FROM raw_events")


@pytest.mark.parametrize("place", PLACES)
def test_a_delivery_with_a_lone_surrogate_is_refused_at_the_door(connected: World, place: str) -> None:
    client = connected.client
    body = _delivery(place, 1)
    r = deliver(client, body)  # signed
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json"), r.text
    r = deliver(client, body, secret="whsec_someone_else")  # unsigned, routed by its account
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_signature"), r.text
    assert _stored(client) == [(0,)]
    assert log_entries(connected) == []  # not even a refusal line: the body is not read
    # The same delivery with the escape of a real character (a pair) is accepted.
    fixed = body.replace(PLACES[place][1], b"\\ud83d\\ude00")
    r = deliver(client, fixed)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["duplicate"] is False
    assert _stored(client) == [(1,)]


def _credentials(world: World) -> dict[str, dict[str, str]]:
    r = world.client.post(
        "/api/v1/operator/agent-keys",
        json={"name": "tool", "scopes": ["programs:write"], "workspace_ids": [world.workspace_id]},
        headers=OP,
    )
    assert r.status_code == 201, r.text
    return {
        "programKey": world.key,
        "accountToken": world.owner,
        "operatorToken": OP,
        "agentKey": bearer(r.json()["data"]["agent_key"]),
    }


def test_every_json_endpoint_refuses_a_lone_surrogate(world: World) -> None:
    """Each operation of the API reference that takes a JSON body, with its credential and a
    body whose only fault is the escape: 400 `invalid_json`, nothing stored."""
    client = world.client
    credentials = _credentials(world)
    values = {
        "workspace_id": world.workspace_id,
        "program_id": world.program_id,
        "transaction_id": "tx_1",
        "endpoint_id": "we_1",
        "code": world.partner_code,
        "partner_code": world.partner_code,
        "payout_id": "po_1",
        "currency": "usd",
        "period": "2024-01",
        "delivery_id": "wd_1",
    }
    before = _stored(client)
    tried = []
    for path, operations in client.get("/openapi.json").json()["paths"].items():
        for method, op in operations.items():
            if "application/json" not in op.get("requestBody", {}).get("content", {}):
                continue
            url = path.format(**values)
            body = b'{"name": "x\\ud800", "transaction_id": "in_\\ud800_1"}'
            headers = {"Content-Type": "application/json"}
            schemes = [name for option in op.get("security", []) for name in option]
            if "stripeSignature" in schemes:
                headers["Stripe-Signature"] = sign(body, WEBHOOK_SECRET, int(time.time()))
            elif schemes:
                headers.update(credentials[schemes[0]])
            r = client.request(method.upper(), url, content=body, headers=headers)
            answer = (r.status_code, r.json().get("error", {}).get("code"))
            assert answer == (400, "invalid_json"), (method, url, r.text)
            tried.append(url)
    assert "/webhooks/stripe" in tried and "/api/v1/track/sale" in tried and len(tried) >= 15
    assert _stored(client) == before
