"""Refused calls that name a program (hardening, round two): a bounded note in the tracking log,
never the sender's text; refusals rate limited per client address; the tracking log read in
bounded pages off the event loop. Both backends."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.http import MAX_BODY
from api.settings import Settings
from ingest.refusals import MAX_NOTE
from tests.conftest import World, bearer, make_world
from tests.helpers import ACCOUNT, LIVE_CHECKOUT, deliver, logged_in, program_path, query
from tests.stripe_fixtures import load_event, serialise

MARKER = "FLOODTEXT"


@pytest.fixture
def connected(client: TestClient) -> World:
    return make_world(client, stripe_account_id=ACCOUNT)


def padded(event: dict[str, Any], field: str, size: int = MAX_BODY - 64) -> bytes:
    """`event` with `field` filled with the marker until its body is about `size` bytes."""
    base = len(serialise({**event, field: ""}))
    return serialise({**event, field: (MARKER * (size // len(MARKER)))[: size - base]})


def details(client: TestClient) -> list[str]:
    return [str(d) for (d,) in query(client, "SELECT detail FROM tracking_log ORDER BY log_id")]


def test_refused_deliveries_of_a_mebibyte_leave_only_a_bounded_note(connected: World) -> None:
    client = connected.client
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
    bodies = [
        padded(event, "type"),  # the event type itself is the sender's megabyte
        padded({**event, "metadata": {"program_id": connected.program_id}}, "padding"),
        padded({**event, "type": "checkout.session.completed"}, "data_extra"),
    ]
    for body in bodies * 2:
        assert len(body) <= MAX_BODY
        r = deliver(client, body, secret="whsec_someone_else")
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_signature")
    assert query(client, "SELECT count(*) FROM raw_events") == [(0,)]
    notes = details(client)
    assert len(notes) == len(bodies) * 2
    for body, detail in zip(bodies * 2, notes, strict=True):
        assert len(detail.encode()) <= MAX_NOTE < 1024
        assert MARKER not in detail
        assert f"{len(body)}-byte body sha256 {hashlib.sha256(body).hexdigest()}" in detail
        assert "invalid_signature: mismatch" in detail
        assert "content-type application/json" in detail
    # a known event type is named; the sender's own "type" never is
    assert "checkout.session.completed" in notes[2] and "checkout" not in notes[0]
    total = query(client, "SELECT sum(length(detail)) FROM tracking_log")[0][0]
    assert total <= len(notes) * MAX_NOTE


def test_refused_public_track_calls_leave_only_a_bounded_note(world: World) -> None:
    client = world.client
    pid = world.program_id
    # valid bodies (a megabyte of whitespace is still JSON) naming a partner the program lacks
    stranger = json.dumps({"program_id": pid, "partner_code": MARKER * 20}).encode()
    calls = [stranger, stranger + b" " * (MAX_BODY - len(stranger))]
    for body in calls:
        r = client.post(
            "/api/v1/track/click", content=body, headers={"Content-Type": "application/json; charset=utf-8"}
        )
        assert (r.status_code, r.json()["error"]["code"]) == (404, "partner_not_found")
    assert query(client, "SELECT count(*) FROM raw_events") == [(0,)]
    notes = details(client)
    assert len(notes) == len(calls)
    for body, detail in zip(calls, notes, strict=True):
        assert len(detail.encode()) <= MAX_NOTE
        assert MARKER not in detail  # not even the partner code a stranger made up
        assert f"{len(body)}-byte body sha256 {hashlib.sha256(body).hexdigest()}" in detail
        assert "refused (partner_not_found)" in detail and "content-type application/json" in detail


def test_an_authenticated_refusal_keeps_its_message_cut_short(world: World) -> None:
    body = {"customer_external_id": "c1", "program_id": "prog_other"}
    r = world.client.post("/api/v1/track/lead", json=body, headers=world.key)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "program_mismatch")
    [detail] = details(world.client)
    assert detail.startswith("refused (program_mismatch)") and "prog_other" in detail  # its message
    assert "headers authorization,content-type" in detail and len(detail) <= MAX_NOTE


def test_refusals_over_the_rate_are_answered_429_and_leave_nothing(settings: Settings) -> None:
    limited = settings.model_copy(update={"refusal_rate_per_second": 0.001, "refusal_rate_burst": 3})
    app = create_app(limited)
    with TestClient(app) as client:
        world = make_world(client, stripe_account_id=ACCOUNT)
        event = load_event(LIVE_CHECKOUT, account=ACCOUNT)
        codes = [deliver(client, event, secret="whsec_someone_else").status_code for _ in range(3)]
        assert codes == [400, 400, 400]
        r = deliver(client, event, secret="whsec_someone_else")
        assert (r.status_code, r.json()["error"]["code"]) == (429, "rate_limited")
        assert int(r.headers["Retry-After"]) >= 1
        # every kind of unverified refusal from this address is over the limit now
        r = client.post("/api/v1/track/sale", json={"amount": 1}, headers=bearer("aff_wrong"))
        assert (r.status_code, r.json()["error"]["code"]) == (429, "rate_limited")
        r = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "bob"})
        assert (r.status_code, r.json()["error"]["code"]) == (429, "rate_limited")
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        # accepted calls, and the refusals of a valid key's calls, are not limited by it
        assert deliver(client, event).status_code == 200
        r = client.post(
            "/api/v1/track/lead", json={"customer_external_id": "c", "program_id": "x"}, headers=world.key
        )
        assert (r.status_code, r.json()["error"]["code"]) == (422, "program_mismatch")
        # only the refusals within the rate left a line; another address has its own bucket
        refusals = [n.split(";")[0] for n in details(client) if n.startswith("refused")]
        assert refusals == ["refused (invalid_signature: mismatch)"] * 3 + ["refused (program_mismatch)"]
        other = TestClient(app, client=("203.0.113.7", 40000))
        assert deliver(other, event, secret="whsec_someone_else").status_code == 400


def test_tracking_log_pages_are_read_off_the_event_loop(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = world.client.app.state.tally.store  # type: ignore[attr-defined]
    read = store.tracking_log
    on_loop: list[bool] = []

    def spy(*args: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # a worker thread: no event loop runs here
            on_loop.append(False)
        return read(*args)

    monkeypatch.setattr(store, "tracking_log", spy)
    for n in range(5):
        assert world.sale(transaction_id=f"in_{n}", customer_external_id=f"c{n}").status_code == 200
    path = f"/api/v1/programs/{world.program_id}/tracking-log"
    first = world.client.get(f"{path}?limit=2", headers=world.owner).json()["data"]
    assert [e["detail"].split()[1] for e in first["entries"]] == ["in_4", "in_3"]
    rest = world.client.get(f"{path}?limit=10&before={first['next_before']}", headers=world.owner).json()[
        "data"
    ]
    assert [e["detail"].split()[1] for e in rest["entries"]] == ["in_2", "in_1", "in_0"]
    assert rest["next_before"] is None
    logged_in(world.client, world.account_token)
    assert world.client.get(program_path(world, "/log")).status_code == 200
    assert on_loop == [False, False, False]
