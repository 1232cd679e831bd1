"""POST /webhooks/stripe (CONTRACT section 5, SEED section 6): real payloads, real signatures."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import time_machine
from starlette.testclient import TestClient

from ingest.domain.keys import EVENT_KEY_SPACE, processor_sale_keys
from ingest.stripe import STRIPE_FIELDS, extract, sign
from tests.conftest import WEBHOOK_SECRET, World, make_world
from tests.helpers import ACCOUNT, LEGACY_INVOICE, LIVE_CHECKOUT, deliver, log_entries, query
from tests.stripe_fixtures import TEMPLATE_NAME, fixture_names, load_event, serialise, with_metadata

ROLLED_SECRET = "whsec_test_rolled"
CHECKOUT_IDS = (
    "in_1KJqKBJDPojXS6LNJbvLUgEy",
    "pi_1IqxJOJDPojXS6LN9uOebAea",
    "cs_live_9RBjcHiy2i5p99Tf1MYM90c3SHK1grU0E6Ae6pKWR2KPA4ZiuKiB2X1Y3X",
)
ATTRIBUTION = {"svc_click_id": "clk_abc", "svc_customer_key": "user_42"}


@pytest.fixture
def connected(client: TestClient) -> World:
    """The world's program, connected to the processor account `ACCOUNT`."""
    return make_world(client, stripe_account_id=ACCOUNT)


def raw_rows(client: TestClient, *columns: str) -> list[tuple[Any, ...]]:
    return query(client, f"SELECT {', '.join(columns)} FROM raw_events ORDER BY seq")


def checklist(world: World) -> dict[str, bool]:
    r = world.client.get(f"/api/v1/programs/{world.program_id}/checklist", headers=world.owner)
    return {s["key"]: s["done"] for s in r.json()["data"]["steps"]}


def accepted(event: dict[str, Any], program_id: str) -> dict[str, Any]:
    return {
        "received": True,
        "event_id": event["id"],
        "program_id": program_id,
        "duplicate": False,
        "test_mode": event["livemode"] is False,
    }


# -- every public payload, stored verbatim with its typed columns -----------------------------------
@pytest.mark.parametrize("name", fixture_names())
def test_every_fixture_is_verified_routed_and_stored_verbatim(connected: World, name: str) -> None:
    client = connected.client
    event = load_event(name, account=ACCOUNT)
    body = serialise(event)
    r = deliver(client, body)
    assert r.status_code == 200, r.text
    assert r.json() == {"data": accepted(event, connected.program_id)}
    columns = ("source", "kind", "program_id", "outcome", "body", "headers", *STRIPE_FIELDS)
    [row] = raw_rows(client, *columns)
    stored = dict(zip(columns, row, strict=True))
    assert stored["source"] == "stripe" and stored["kind"] == "stripe"
    assert (stored["program_id"], stored["outcome"]) == (connected.program_id, "accepted")
    assert stored["body"] == body.decode()
    headers = json.loads(stored["headers"])
    assert set(headers) == {"stripe-signature", "content-type", "user-agent"}
    assert headers["stripe-signature"].startswith("t=") and headers["user-agent"] == "Stripe/1.0"
    assert {k: stored[k] for k in STRIPE_FIELDS} == extract(event)
    assert stored["test_mode"] is (event["livemode"] is False)
    steps = checklist(connected)
    assert steps["processor_event_received"] is True
    # a live processor sale is a sale received: the checklist does not wait for a track call
    assert steps["sale_received"] is bool(processor_sale_keys(stored))
    [line] = log_entries(connected)
    assert line["status"] == 200 and line["outcome"] == ("test_mode" if stored["test_mode"] else "accepted")
    assert line["detail"].startswith(f"{event['type']} {event['id']}")
    assert line["request_id"] == r.headers["X-Request-Id"]


# -- signatures -------------------------------------------------------------------------------------
def test_wrong_secret_is_refused_and_nothing_is_stored(connected: World) -> None:
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    r = deliver(connected.client, event, secret="whsec_someone_else")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_signature"
    assert r.json()["error"]["doc_url"].endswith("/docs/errors#invalid_signature")
    assert raw_rows(connected.client, "seq") == []
    assert query(connected.client, "SELECT count(*) FROM idempotency_keys WHERE program_id = ?", "*") == [
        (0,)
    ]
    # The program still sees the refusal in its tracking log, without the body.
    [line] = log_entries(connected)
    assert (line["status"], line["outcome"]) == (400, "invalid_signature")
    assert "checkout.session.completed" in line["detail"]
    assert "billz@supabase.io" not in line["detail"] and "cs_live" not in line["detail"]
    assert checklist(connected)["processor_event_received"] is False
    # A refused delivery is not "seen": the properly signed retry is accepted.
    r = deliver(connected.client, event)
    assert r.json() == {"data": accepted(event, connected.program_id)}


def test_missing_or_garbled_signature_header(connected: World) -> None:
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    body = serialise(event)
    r = connected.client.post("/webhooks/stripe", content=body, headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_signature")
    for header in ("v1=abc", "t=notanumber,v1=abc", f"t={int(time.time())}", "garbage"):
        r = deliver(connected.client, body, signature=header)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_signature"), header
    assert raw_rows(connected.client, "seq") == []
    assert [e["outcome"] for e in log_entries(connected)] == ["invalid_signature"] * 5


def test_refused_delivery_for_no_program_leaves_no_log_line(connected: World) -> None:
    event = load_event(LIVE_CHECKOUT, account="acct_unknown")
    r = deliver(connected.client, event, secret="whsec_wrong")
    assert r.status_code == 400
    assert log_entries(connected) == []
    r = deliver(connected.client, b"not json at all", secret="whsec_wrong")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_signature")
    assert log_entries(connected) == []


def test_rolled_second_secret_is_accepted(connected: World) -> None:
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    r = deliver(connected.client, event, secret=ROLLED_SECRET)
    assert r.status_code == 200
    assert r.json()["data"] == accepted(event, connected.program_id)


def test_any_of_several_v1_signatures_may_match(connected: World) -> None:
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    body = serialise(event)
    now = int(time.time())
    good = sign(body, WEBHOOK_SECRET, now).split("v1=")[1]
    bad = sign(body, "whsec_old", now).split("v1=")[1]
    r = deliver(connected.client, body, signature=f"t={now},v1={bad},v0=ignored,v1={good}")
    assert r.status_code == 200
    r = deliver(connected.client, body, signature=f"t={now},v1={bad},v1={'0' * 64}")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_signature")


def test_stale_and_future_timestamps_are_refused(connected: World) -> None:
    now = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    t = int(now.timestamp())
    client = connected.client
    with time_machine.travel(now, tick=False):
        for offset, status in ((-301, 400), (301, 400), (-300, 200), (299, 200)):
            event = load_event(LIVE_CHECKOUT, account=ACCOUNT, event_id=f"evt_offset_{offset}")
            r = deliver(client, event, timestamp=t + offset)
            assert r.status_code == status, (offset, r.text)
            if status == 400:
                assert r.json()["error"]["code"] == "invalid_signature"
                assert f"t={t + offset}" in r.json()["error"]["message"]
    assert raw_rows(client, "event_id") == [("evt_offset_-300",), ("evt_offset_299",)]


# -- body problems ----------------------------------------------------------------------------------
def test_oversize_body_is_413_before_anything_else(connected: World) -> None:
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    event["padding"] = "x" * (1024 * 1024)
    r = deliver(connected.client, event)
    assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")
    assert raw_rows(connected.client, "seq") == []


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"', b"\xff\xfe{}", b""])
def test_signed_body_that_is_not_a_json_object_is_400(connected: World, body: bytes) -> None:
    r = deliver(connected.client, body)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")
    assert raw_rows(connected.client, "seq") == []


# -- duplicates -------------------------------------------------------------------------------------
def test_replayed_event_id_is_stored_as_duplicate_and_answered_200(connected: World) -> None:
    client = connected.client
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    first = deliver(client, event)
    assert first.json()["data"]["duplicate"] is False
    again = deliver(client, event)
    assert again.status_code == 200
    assert again.json() == {"data": {"received": True, "duplicate": True}}
    rows = raw_rows(client, "seq", "outcome", "program_id", "event_id")
    assert rows == [
        (1, "accepted", connected.program_id, event["id"]),
        (2, "duplicate", connected.program_id, event["id"]),
    ]
    keys = query(
        client, "SELECT raw_seq FROM idempotency_keys WHERE program_id = ? AND key = ?", "*", event["id"]
    )
    assert keys == [(1,)]
    assert [e["outcome"] for e in log_entries(connected)] == ["duplicate", "accepted"]


def test_concurrent_deliveries_of_one_event_accept_exactly_one(connected: World) -> None:
    client = connected.client
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    body = serialise(event)
    header = sign(body, WEBHOOK_SECRET, int(time.time()))

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await asyncio.gather(
                *(
                    http.post("/webhooks/stripe", content=body, headers={"Stripe-Signature": header})
                    for _ in range(12)
                )
            )

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 12
    assert sorted(r.json()["data"]["duplicate"] for r in responses) == [False] + [True] * 11
    outcomes = [o for (o,) in raw_rows(client, "outcome")]
    assert sorted(outcomes) == ["accepted"] + ["duplicate"] * 11


def test_unroutable_event_id_is_remembered_too(client: TestClient) -> None:
    event = load_event(LIVE_CHECKOUT)
    assert deliver(client, event).json() == {"data": {"received": True, "routed": False}}
    assert deliver(client, event).json() == {"data": {"received": True, "duplicate": True}}
    assert raw_rows(client, "outcome", "program_id") == [("unroutable", None), ("duplicate", None)]


# -- routing ----------------------------------------------------------------------------------------
def test_unknown_account_is_stored_unroutable_and_answered_200(connected: World) -> None:
    client = connected.client
    event = load_event(LIVE_CHECKOUT, account="acct_nobody")
    # metadata naming a program does not override the account the event came from
    event = with_metadata(event, {"program_id": connected.program_id})
    r = deliver(client, event)
    assert r.status_code == 200
    assert r.json() == {"data": {"received": True, "routed": False}}
    assert raw_rows(client, "program_id", "outcome", "stripe_account", "meta_program_id") == [
        (None, "unroutable", "acct_nobody", connected.program_id)
    ]
    assert log_entries(connected) == []
    assert checklist(connected)["processor_event_received"] is False
    # an unroutable sale claims no sale ids: nothing blocks the brand's own track call
    assert connected.sale(transaction_id=CHECKOUT_IDS[0]).status_code == 200


def test_event_without_account_routes_by_metadata_program_id(connected: World) -> None:
    event = with_metadata(load_event(LIVE_CHECKOUT), {**ATTRIBUTION, "program_id": connected.program_id})
    r = deliver(connected.client, event)
    assert r.json()["data"] == accepted(event, connected.program_id)
    other = with_metadata(load_event(LIVE_CHECKOUT, event_id="evt_2"), {"program_id": "prog_missing"})
    assert deliver(connected.client, other).json()["data"] == {"received": True, "routed": False}
    assert raw_rows(connected.client, "program_id", "outcome") == [
        (connected.program_id, "accepted"),
        (None, "unroutable"),
    ]


def test_two_programs_on_one_account_are_told_apart_by_metadata(connected: World) -> None:
    client = connected.client
    r = client.post(
        "/api/v1/programs",
        json={"workspace_id": connected.workspace_id, "name": "Second", "stripe_account_id": ACCOUNT},
        headers=connected.owner,
    )
    assert r.status_code == 201
    second = r.json()["data"]["program_id"]
    base = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    picks = {
        "evt_second": {"program_id": second},
        "evt_first": {"program_id": connected.program_id},
        "evt_stranger": {"program_id": "prog_elsewhere"},
        "evt_none": {},
    }
    answers = {}
    for event_id, meta in picks.items():
        event = with_metadata({**base, "id": event_id}, meta)
        answers[event_id] = deliver(client, event).json()["data"]
    assert answers["evt_second"]["program_id"] == second
    assert answers["evt_first"]["program_id"] == connected.program_id
    assert answers["evt_stranger"] == answers["evt_none"] == {"received": True, "routed": False}
    assert raw_rows(client, "event_id", "program_id", "outcome") == [
        ("evt_second", second, "accepted"),
        ("evt_first", connected.program_id, "accepted"),
        ("evt_stranger", None, "unroutable"),
        ("evt_none", None, "unroutable"),
    ]


# -- attribution metadata and the two invoice layouts -------------------------------------------------
def test_checkout_session_metadata_is_extracted(connected: World) -> None:
    event = with_metadata(load_event(LIVE_CHECKOUT, account=ACCOUNT), {**ATTRIBUTION, "program_id": "prog_x"})
    deliver(connected.client, event)
    assert raw_rows(
        connected.client,
        "click_id",
        "customer_key",
        "meta_program_id",
        "sub_metadata_present",
        "checkout_mode",
    ) == [("clk_abc", "user_42", "prog_x", True, "payment")]


@pytest.mark.parametrize("where", ["parent", "legacy"])
def test_invoice_subscription_metadata_in_either_layout(connected: World, where: Any) -> None:
    event = load_event(TEMPLATE_NAME, account=ACCOUNT, livemode=True)
    if where == "legacy":
        obj = event["data"]["object"]
        obj["parent"] = None
        obj["subscription"] = "sub_legacy_1"
    event = with_metadata(event, ATTRIBUTION, where=where)
    r = deliver(connected.client, event)
    assert r.json()["data"] == accepted(event, connected.program_id)
    expected_sub = "sub_foks_0000000000000001" if where == "parent" else "sub_legacy_1"
    assert raw_rows(
        connected.client,
        "event_type",
        "invoice_id",
        "subscription_id",
        "billing_reason",
        "customer_key",
        "click_id",
        "sub_metadata_present",
        "amount",
        "currency",
    ) == [
        (
            "invoice.payment_succeeded",
            "in_foks_0000000000000001",
            expected_sub,
            "subscription_create",
            "user_42",
            "clk_abc",
            True,
            190,
            "usd",
        )
    ]


@pytest.mark.parametrize(
    "subscription",
    ["sub_as_string", {"id": "sub_as_object", "object": "subscription", "metadata": {}}],
)
def test_legacy_invoice_subscription_as_string_or_object(connected: World, subscription: Any) -> None:
    event = load_event(LEGACY_INVOICE, account=ACCOUNT)
    event["data"]["object"]["subscription"] = subscription
    event = with_metadata(event, {"svc_customer_key": "user_7"}, where="legacy")
    deliver(connected.client, event)
    expected = subscription if isinstance(subscription, str) else subscription["id"]
    assert raw_rows(connected.client, "subscription_id", "customer_key", "test_mode") == [
        (expected, "user_7", True)
    ]


# -- test mode --------------------------------------------------------------------------------------
def test_test_mode_event_is_stored_but_claims_no_sale(connected: World) -> None:
    event = load_event(LEGACY_INVOICE, account=ACCOUNT)
    assert event["livemode"] is False
    r = deliver(connected.client, event)
    assert r.json()["data"]["test_mode"] is True
    assert raw_rows(connected.client, "test_mode", "livemode", "outcome") == [(True, False, "accepted")]
    assert (
        query(connected.client, "SELECT key FROM idempotency_keys WHERE program_id = ?", connected.program_id)
        == []
    )
    # a test event is never a sale, so the same invoice id is free for a real track call
    assert checklist(connected)["sale_received"] is False  # a test event is no sale
    assert connected.sale(transaction_id="in_000000000000000000000000").status_code == 200
    assert checklist(connected)["processor_event_received"] is True


# -- the connect webhook and self-hosted track/sale ---------------------------------------------------
def test_connect_sale_then_track_sale_with_any_of_its_ids_is_409(connected: World) -> None:
    client = connected.client
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    assert deliver(client, event).json()["data"]["test_mode"] is False
    keys = query(
        client,
        "SELECT key, raw_seq FROM idempotency_keys WHERE program_id = ? ORDER BY key",
        connected.program_id,
    )
    assert keys == sorted((f"sale:{k}", 1) for k in CHECKOUT_IDS)
    assert query(client, "SELECT key FROM idempotency_keys WHERE program_id = ?", EVENT_KEY_SPACE) == [
        (event["id"],)
    ]
    for txn in CHECKOUT_IDS:
        r = connected.sale(transaction_id=txn)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "duplicate_transaction"), txn
    outcomes = raw_rows(client, "kind", "outcome")
    assert outcomes == [("stripe", "accepted")] + [("sale", "duplicate")] * 3


def test_connect_invoice_claims_its_charge_id_too(connected: World) -> None:
    event = load_event(LEGACY_INVOICE, account=ACCOUNT, livemode=True)
    deliver(connected.client, event)
    r = connected.sale(transaction_id="ch_000000000000000000000000")
    assert (r.status_code, r.json()["error"]["code"]) == (409, "duplicate_transaction")


def test_zero_amount_or_non_sale_events_claim_nothing(connected: World) -> None:
    paid_nothing = load_event("stripe-sync-engine__invoice_paid.json", account=ACCOUNT, livemode=True)
    refund = load_event("stripe-sync-engine__charge_refunded.json", account=ACCOUNT, livemode=True)
    for event in (paid_nothing, refund):
        assert deliver(connected.client, event).status_code == 200
    assert (
        query(connected.client, "SELECT key FROM idempotency_keys WHERE program_id = ?", connected.program_id)
        == []
    )
    assert connected.sale(transaction_id="in_1KJqKBJDPojXS6LNJbvLUgEy").status_code == 200


def test_track_sale_then_connect_event_is_kept_and_answered_200(connected: World) -> None:
    client = connected.client
    assert connected.sale(transaction_id=CHECKOUT_IDS[0], amount=999, currency="eur").status_code == 200
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    r = deliver(client, event)
    assert r.status_code == 200
    assert r.json()["data"] == accepted(event, connected.program_id)
    assert raw_rows(client, "seq", "kind", "outcome") == [(1, "sale", "accepted"), (2, "stripe", "accepted")]
    keys = query(
        client,
        "SELECT key, raw_seq FROM idempotency_keys WHERE program_id = ? ORDER BY key",
        connected.program_id,
    )
    # the invoice id stays claimed by the track call; the processor's other ids are claimed now
    assert keys == sorted([(f"sale:{CHECKOUT_IDS[0]}", 1), *((f"sale:{k}", 2) for k in CHECKOUT_IDS[1:])])
    # and every one of them now refuses a further track call
    for txn in CHECKOUT_IDS:
        assert connected.sale(transaction_id=txn).status_code == 409
