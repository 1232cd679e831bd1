"""Webhooks to brand servers (CONTRACT section 13), on both backends, with a real receiver (a
local HTTP server, tests/receiver.py) and the real app: every event type is derived from the
reconciler's tables, delivered, and verified with the `standardwebhooks` package; nothing is sent
twice across re-runs and backfills; retries keep the `webhook-id`; a rotation signs with both
secrets; the endpoints' API refuses what it must.

The app's own worker is off (`TALLY_WEBHOOKS_DELIVERY=0`): each test sends what is due with
`Deliverer.deliver_due()`, and moves the clock with time-machine to reach the next retry.
"""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.testclient import TestClient

from api.outbound.worker import Deliverer
from tests.conftest import OP, World, make_world
from tests.helpers import payee
from tests.receiver import Receiver

ALL = [
    "sale.created",
    "sale.attributed",
    "sale.refunded",
    "commission.created",
    "commission.approved",
    "commission.adjusted",
    "commission.voided",
    "payout.created",
    "payout.paid",
    "api_key.rotation_required",
    "ping",
]


def _path(world: World, suffix: str = "") -> str:
    return f"/api/v1/programs/{world.program_id}/webhook-endpoints{suffix}"


def _endpoint(world: World, url: str, events: list[str] = ALL) -> dict[str, Any]:
    r = world.client.post(_path(world), json={"url": url, "events": events}, headers=world.owner)
    assert r.status_code == 201, r.text
    found: dict[str, Any] = r.json()["data"]
    return found


def _deliverer(client: TestClient) -> Deliverer:
    found: Deliverer = client.app.state.webhooks  # type: ignore[attr-defined]
    return found


def _reconcile(client: TestClient) -> None:
    r = client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text


def _verified(secret: str, received: Any) -> dict[str, Any]:
    event: dict[str, Any] = Webhook(secret).verify(received.body, received.headers)
    return event


def _deliveries(world: World, endpoint_id: str, **query: str) -> list[dict[str, Any]]:
    r = world.client.get(_path(world, f"/{endpoint_id}/deliveries"), params=query, headers=world.owner)
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["data"]
    return found


def _click(world: World, partner: str) -> str:
    r = world.client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": partner}
    )
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["click_id"])


def _every_event_type(world: World) -> None:
    """Traffic and finance actions that make every event type."""
    c = world.client
    owner = world.owner
    r = c.post(
        f"/api/v1/programs/{world.program_id}/partners", json={"code": "bob", "name": "Bob"}, headers=owner
    )
    assert r.status_code == 201, r.text
    # in_1: alice's click; approved at once (holding_days 0), then partly refunded after booking
    assert (
        world.sale(
            transaction_id="in_1", customer_external_id="c1", click_id=_click(world, "alice")
        ).status_code
        == 200
    )
    # in_2: nobody's yet
    assert world.sale(transaction_id="in_2", customer_external_id="c2", amount=3000).status_code == 200
    _reconcile(c)
    refund = {"transaction_id": "in_1", "refund_id": "re_1", "amount": 400}
    assert c.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
    # a late lead binds c2 to bob's click: in_2 becomes bob's
    lead = {"customer_external_id": "c2", "click_id": _click(world, "bob")}
    assert c.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    _reconcile(c)
    # finance: void in_2, pay alice (a batch pays only partners with payout details)
    payee(world, "alice")
    r = c.post(
        f"/api/v1/programs/{world.program_id}/commissions/in_2/void", json={"reason": "fraud"}, headers=owner
    )
    assert r.status_code == 200, r.text
    today = datetime.now(UTC).date().isoformat()
    r = c.post(f"/api/v1/programs/{world.program_id}/payouts", json={"up_to": today}, headers=owner)
    assert r.status_code == 201, r.text
    payout_id = r.json()["data"]["payout_id"]
    r = c.post(f"/api/v1/programs/{world.program_id}/payouts/{payout_id}/paid", headers=owner)
    assert r.status_code == 200, r.text
    # the operator flags the key; the next run (or the worker's next look) sends it
    deadline = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    r = c.post(
        f"/api/v1/operator/programs/{world.program_id}/api-key/rotation",
        json={"deadline": deadline},
        headers=OP,
    )
    assert r.status_code == 200, r.text
    _reconcile(c)


def test_every_event_type_is_delivered_signed_and_named_as_the_reads_name_it(
    app_client: TestClient, receiver: Receiver
) -> None:
    world = make_world(app_client, holding_days=0)
    endpoint = _endpoint(world, receiver.url + "/hooks")
    secret = endpoint["secret"]
    _every_event_type(world)
    r = app_client.post(_path(world, f"/{endpoint['endpoint_id']}/ping"), headers=world.owner)
    assert r.status_code == 202, r.text
    assert _deliverer(app_client).deliver_due() == len(receiver.received)

    events = [_verified(secret, got) for got in receiver.received]
    assert sorted({e["type"] for e in events}) == sorted(ALL)
    assert len({got.webhook_id for got in receiver.received}) == len(receiver.received)  # each once
    for got, event in zip(receiver.received, events, strict=True):
        assert got.path == "/hooks"
        assert got.webhook_id == event["id"]
        assert set(event) == {"id", "type", "timestamp", "program_id", "data"}
        assert event["program_id"] == world.program_id
        assert event["timestamp"].endswith("Z")

    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event["data"])
    sales = app_client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner).json()["data"]
    lines = app_client.get(f"/api/v1/programs/{world.program_id}/commissions", headers=world.owner).json()[
        "data"
    ]
    payouts = app_client.get(f"/api/v1/programs/{world.program_id}/payouts", headers=world.owner).json()[
        "data"
    ]
    for kind in ("sale.created", "sale.refunded"):
        assert all(set(data) == set(sales[0]) for data in by_type[kind]), kind
    assert set(by_type["sale.attributed"][0]) == {*sales[0], "previous_partner_code"}
    assert by_type["sale.attributed"][0]["partner_code"] == "bob"
    assert by_type["sale.attributed"][0]["previous_partner_code"] is None
    assert by_type["sale.refunded"][0]["refunded"] == 400
    for kind in ("commission.created", "commission.approved", "commission.adjusted", "commission.voided"):
        assert all(set(data) == set(lines[0]) for data in by_type[kind]), kind
    assert {d["kind"] for d in by_type["commission.adjusted"]} == {"clawback"}
    assert {(d["transaction_id"], d["status"]) for d in by_type["commission.voided"]} == {("in_2", "void")}
    for kind in ("payout.created", "payout.paid"):
        assert by_type[kind][0]["payout_id"] == payouts[0]["payout_id"]
        assert set(by_type[kind][0]) == set(payouts[0])
    assert by_type["payout.paid"][0]["status"] == "paid"
    assert set(by_type["api_key.rotation_required"][0]) == {
        "program_id",
        "api_token_masked",
        "flagged_at",
        "deadline",
    }

    # Re-runs, a backfill and the worker's own look at the rotation flag send nothing again.
    seen = len(receiver.received)
    _reconcile(app_client)
    backfill = {"from": "2020-01-01", "to": "2030-12-31", "dry_run": False}
    r = app_client.post(f"/api/v1/programs/{world.program_id}/backfill", json=backfill, headers=world.owner)
    assert r.status_code == 200, r.text
    _reconcile(app_client)
    assert _deliverer(app_client).deliver_due() == 0
    assert len(receiver.received) == seen


def test_only_the_types_an_endpoint_takes_and_only_changes_after_it_was_made(
    app_client: TestClient, receiver: Receiver
) -> None:
    world = make_world(app_client, holding_days=0)
    assert world.sale(transaction_id="in_before", click_id=_click(world, "alice")).status_code == 200
    _reconcile(app_client)  # before any endpoint: nothing is queued for it later
    _endpoint(world, receiver.url, ["sale.created"])
    assert world.sale(transaction_id="in_after", customer_external_id="c9").status_code == 200
    _reconcile(app_client)
    _deliverer(app_client).deliver_due()
    assert [(r.event["type"], r.event["data"]["transaction_id"]) for r in receiver.received] == [
        ("sale.created", "in_after")
    ]
    # Its last endpoint gone, the program's changes are not followed; a new endpoint starts afresh.
    [endpoint] = app_client.get(_path(world), headers=world.owner).json()["data"]
    assert (
        app_client.delete(_path(world, f"/{endpoint['endpoint_id']}"), headers=world.owner).status_code == 200
    )
    assert world.sale(transaction_id="in_unwatched", customer_external_id="c8").status_code == 200
    _reconcile(app_client)
    _endpoint(world, receiver.url, ["sale.created"])
    _reconcile(app_client)
    assert world.sale(transaction_id="in_watched", customer_external_id="c7").status_code == 200
    _reconcile(app_client)
    _deliverer(app_client).deliver_due()
    assert [r.event["data"]["transaction_id"] for r in receiver.received] == ["in_after", "in_watched"]


def test_a_receiver_failing_five_times_gets_the_event_once_more_with_the_same_id(
    app_client: TestClient, receiver: Receiver
) -> None:
    world = make_world(app_client)
    endpoint = _endpoint(world, receiver.url, ["ping"])
    receiver.fail(5, status=503)
    with time_machine.travel(datetime.now(UTC), tick=True) as clock:
        r = app_client.post(_path(world, f"/{endpoint['endpoint_id']}/ping"), headers=world.owner)
        delivery_id = r.json()["data"]["delivery_id"]
        for attempt in range(1, 7):
            assert _deliverer(app_client).deliver_due() == 1, attempt
            assert _deliverer(app_client).deliver_due() == 0  # not due again before its time
            [found] = _deliveries(world, endpoint["endpoint_id"])
            assert found["attempt"] == attempt
            if attempt < 6:
                assert found["status"] == "pending" and found["response_status"] == 503
                wait = datetime.fromisoformat(found["next_attempt_at"]) - datetime.now(UTC)
                # 30 s, 1 min, 2 min... each within 20 % jitter (rounded to the second)
                nominal = timedelta(seconds=30 * 2 ** (attempt - 1))
                assert nominal * 0.8 - timedelta(seconds=2) <= wait <= nominal * 1.2 + timedelta(seconds=1)
                clock.shift(wait + timedelta(seconds=1))
    assert found["status"] == "succeeded" and found["next_attempt_at"] is None
    assert [a["status"] for a in found["attempt_log"]] == ["failed"] * 5 + ["succeeded"]
    assert [a["response_body"] for a in found["attempt_log"]][:1] == ["not now"]
    assert found["delivery_id"] == delivery_id
    ids = receiver.ids()
    assert len(ids) == 6 and len(set(ids)) == 1  # the same webhook-id every time
    with time_machine.travel(datetime.now(UTC) + timedelta(days=1), tick=False):
        assert _deliverer(app_client).deliver_due() == 0


def test_retries_end_after_three_days_and_an_endpoint_failing_for_five_is_disabled(
    app_client: TestClient, receiver: Receiver
) -> None:
    world = make_world(app_client)
    endpoint = _endpoint(world, receiver.url, ["ping"])
    endpoint_id = endpoint["endpoint_id"]
    receiver.default = (500, {}, b"x" * 10_000)
    start = datetime.now(UTC)
    with time_machine.travel(start, tick=False) as clock:
        app_client.post(_path(world, f"/{endpoint_id}/ping"), headers=world.owner)
        attempts = 0
        while True:
            attempts += _deliverer(app_client).deliver_due()
            [found] = _deliveries(world, endpoint_id)
            if found["status"] != "pending":
                break
            clock.move_to(datetime.fromisoformat(found["next_attempt_at"]) + timedelta(seconds=1))
        assert found["status"] == "failed" and found["next_attempt_at"] is None
        assert datetime.now(UTC) - start <= timedelta(days=3)
        assert 15 <= attempts <= 25, attempts  # the documented schedule: about 20
        assert all(len(a["response_body"]) == 4096 for a in found["attempt_log"])  # 4 KiB kept
        r = app_client.get(_path(world, f"/{endpoint_id}"), headers=world.owner)
        assert r.json()["data"]["enabled"] is True  # 3 days of failures: not yet
        # two more days of failing pings
        while datetime.now(UTC) - start < timedelta(days=5, hours=1):
            clock.shift(timedelta(hours=6))
            app_client.post(_path(world, f"/{endpoint_id}/ping"), headers=world.owner)
            _deliverer(app_client).deliver_due()
        r = app_client.get(_path(world, f"/{endpoint_id}"), headers=world.owner)
        data = r.json()["data"]
        assert data["enabled"] is False
        assert data["disabled_reason"].startswith("every delivery failed for 5 days")
        # enabling it again clears the reason
        r = app_client.patch(_path(world, f"/{endpoint_id}"), json={"enabled": True}, headers=world.owner)
        assert r.json()["data"]["disabled_reason"] is None and r.json()["data"]["enabled"] is True


def test_a_rotation_signs_with_both_secrets_for_24_hours(
    app_client: TestClient, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    receiver.fail(1)  # a failed attempt is logged: never with a secret
    world = make_world(app_client)
    endpoint = _endpoint(world, receiver.url, ["ping"])
    endpoint_id, old = endpoint["endpoint_id"], endpoint["secret"]
    r = app_client.post(_path(world, f"/{endpoint_id}/rotate-secret"), headers=world.owner)
    assert r.status_code == 200, r.text
    new = r.json()["data"]["secret"]
    assert new.startswith("whsec_") and new != old
    assert r.json()["data"]["previous_secret_expires_at"] is not None
    app_client.post(_path(world, f"/{endpoint_id}/ping"), headers=world.owner)
    _deliverer(app_client).deliver_due()
    [first] = receiver.received
    assert "failed: HTTP 500" in caplog.text
    assert len(first.headers["webhook-signature"].split(" ")) == 2
    assert _verified(old, first)["type"] == "ping"
    assert _verified(new, first)["type"] == "ping"
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=24, seconds=5), tick=False):
        app_client.post(_path(world, f"/{endpoint_id}/ping"), headers=world.owner)
        _deliverer(app_client).deliver_due()
        second = receiver.received[1]
        assert len(second.headers["webhook-signature"].split(" ")) == 1
        assert _verified(new, second)["type"] == "ping"
        with pytest.raises(WebhookVerificationError):
            _verified(old, second)
    for secret in (old, new):
        assert secret not in caplog.text and secret.removeprefix("whsec_") not in caplog.text


def test_endpoints_are_an_owners_and_the_secret_is_shown_once(app_client: TestClient) -> None:
    world = make_world(app_client)
    r = app_client.post(
        _path(world), json={"url": "https://hooks.brand.test/x", "events": ["ping"]}, headers=world.owner
    )
    assert r.status_code == 201, r.text
    made = r.json()["data"]
    assert made["secret"].startswith("whsec_") and made["enabled"] is True
    listed = app_client.get(_path(world), headers=world.owner).json()["data"]
    assert [e["endpoint_id"] for e in listed] == [made["endpoint_id"]]
    assert "secret" not in listed[0] and listed[0]["secret_masked"].endswith(made["secret"][-4:])
    assert made["secret"] not in app_client.get(_path(world), headers=world.owner).text
    one = _path(world, f"/{made['endpoint_id']}")
    r = app_client.patch(
        one, json={"events": ["sale.created", "payout.paid"], "enabled": False}, headers=world.owner
    )
    assert r.status_code == 200 and r.json()["data"]["events"] == ["sale.created", "payout.paid"]
    assert r.json()["data"]["enabled"] is False
    member = world.member()
    assert app_client.get(_path(world), headers=member).json()["error"]["code"] == "owner_required"
    other = make_world(app_client)
    assert (
        app_client.get(one.replace(world.program_id, other.program_id), headers=other.owner).status_code
        == 404
    )
    assert app_client.get(_path(world), headers=other.owner).json()["error"]["code"] == "program_not_found"
    bad = [
        {"url": "https://x.test", "events": []},
        {"url": "https://x.test", "events": ["sale.nope"]},
        {"url": "https://x.test", "events": ["ping", "ping"]},
        {"url": "https://x.test", "events": ["ping"], "secret": "mine"},
        {"url": "ftp://x.test/", "events": ["ping"]},
        {"url": "https://user:pw@x.test/", "events": ["ping"]},
        {"url": "not a url", "events": ["ping"]},
    ]
    for body in bad:
        r = app_client.post(_path(world), json=body, headers=world.owner)
        assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", (body, r.text)
    r = app_client.get(
        _path(world, f"/{made['endpoint_id']}/deliveries"), params={"status": "lost"}, headers=world.owner
    )
    assert r.status_code == 422
    r = app_client.post(
        _path(world, f"/{made['endpoint_id']}/deliveries/whd_nope/resend"), headers=world.owner
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = app_client.delete(one, headers=world.owner)
    assert r.status_code == 200 and r.json()["data"] == {"endpoint_id": made["endpoint_id"], "deleted": True}
    assert app_client.get(one, headers=world.owner).status_code == 404


def test_without_the_setting_only_https_urls_of_public_addresses_are_taken(client: TestClient) -> None:
    plain = make_world(client)
    for url in (
        "http://127.0.0.1:8080/hook",
        "http://hooks.brand.test/x",
        "https://127.0.0.1/x",
        "https://10.0.0.1/x",
        "https://[::1]/x",
        "https://169.254.169.254/latest/meta-data",
        "https://localhost/x",
        "https://[::ffff:10.0.0.1]/x",
    ):
        r = client.post(_path(plain), json={"url": url, "events": ["ping"]}, headers=plain.owner)
        assert r.status_code == 422, (url, r.text)
        assert r.json()["error"]["fields"][0]["field"] == "url"
    r = client.post(
        _path(plain), json={"url": "https://hooks.brand.test/x", "events": ["ping"]}, headers=plain.owner
    )
    assert r.status_code == 201


def test_resend_sends_the_same_event_again_and_the_log_filters_by_status(
    app_client: TestClient, receiver: Receiver
) -> None:
    world = make_world(app_client)
    endpoint_id = _endpoint(world, receiver.url, ["ping"])["endpoint_id"]
    receiver.fail(1)
    for _ in range(2):
        app_client.post(_path(world, f"/{endpoint_id}/ping"), headers=world.owner)
    _deliverer(app_client).deliver_due()
    assert [d["status"] for d in _deliveries(world, endpoint_id, status="pending")] == ["pending"]
    [done] = _deliveries(world, endpoint_id, status="succeeded")
    r = app_client.post(
        _path(world, f"/{endpoint_id}/deliveries/{done['delivery_id']}/resend"), headers=world.owner
    )
    assert r.status_code == 202 and r.json()["data"]["status"] == "pending"
    _deliverer(app_client).deliver_due()
    [again] = _deliveries(world, endpoint_id, status="succeeded")
    assert again["attempt"] == 2
    assert receiver.ids().count(done["event_id"]) == 2
    assert len(_deliveries(world, endpoint_id, limit="1")) == 1


def test_two_workers_never_hold_one_delivery(app_client: TestClient, receiver: Receiver) -> None:
    world = make_world(app_client)
    endpoint_id = _endpoint(world, receiver.url, ["ping"])["endpoint_id"]
    for _ in range(30):
        app_client.post(_path(world, f"/{endpoint_id}/ping"), headers=world.owner)
    store = app_client.app.state.tally.store  # type: ignore[attr-defined]
    a, b = Deliverer(store, True, per_endpoint=50), Deliverer(store, True, per_endpoint=50)
    taken_a = a._claim([])
    taken_b = b._claim([])
    assert len(taken_a) == 30 and taken_b == []  # leased: the other worker finds none due
    a._release([c.delivery_id for c in taken_a[:10]])
    assert b._claim([]) == []  # one sender per endpoint: a still sends to it
    a._release([c.delivery_id for c in taken_a[10:]])
    assert len(b._claim([])) == 30


def test_a_worker_that_died_leaves_its_deliveries_to_the_next(
    app_client: TestClient, receiver: Receiver
) -> None:
    world = make_world(app_client)
    endpoint_id = _endpoint(world, receiver.url, ["ping"])["endpoint_id"]
    app_client.post(_path(world, f"/{endpoint_id}/ping"), headers=world.owner)
    store = app_client.app.state.tally.store  # type: ignore[attr-defined]
    gone = Deliverer(store, True)
    gone.holder = f"{socket.gethostname()}:4194303:1:abcd"  # a pid no process of this host has
    assert len(gone._claim([])) == 1
    alive = Deliverer(store, True)
    assert alive._claim([]) == []  # leased
    assert alive.deliver_due() == 1  # it frees the dead worker's lease first
    assert len(receiver.received) == 1
