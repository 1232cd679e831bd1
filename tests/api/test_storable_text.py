"""Characters every backend can store (issue 48, item 2): one rule at the edge
(`ingest/domain/bounds.py`). A NUL (PostgreSQL text cannot hold U+0000) anywhere in a request
body is `422 validation_error`, never a 500, on every endpoint that takes one, the
unauthenticated click and lead and the processor's webhook included; ids, names, emails and codes
refuse every C0 control character (CR/LF in a name would reach a mail header); free text (a
reason) keeps tab and newline. The same sweep runs on both backends, and nothing is stored."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from ingest.stripe import sign
from tests.conftest import OP, WEBHOOK_SECRET, World, make_world
from tests.helpers import ACCOUNT, LIVE_CHECKOUT, payee, query
from tests.stripe_fixtures import load_event, serialise

NUL = "\x00"
# (method, path, credential, body): `{p}`, `{w}` are the program and workspace ids; `X` in a
# string of the body is where the character under test goes.
Case = tuple[str, str, str, dict[str, Any]]
CASES: dict[str, Case] = {
    "click partner_code": (
        "POST",
        "/api/v1/track/click",
        "none",
        {"program_id": "{p}", "partner_code": "aXb"},
    ),
    "click program_id": (
        "POST",
        "/api/v1/track/click",
        "none",
        {"program_id": "{p}X", "partner_code": "alice"},
    ),
    "click url": (
        "POST",
        "/api/v1/track/click",
        "none",
        {"program_id": "{p}", "partner_code": "alice", "url": "https://b.test/X"},
    ),
    "click referrer": (
        "POST",
        "/api/v1/track/click",
        "none",
        {"program_id": "{p}", "partner_code": "alice", "referrer": "https://r.test/X"},
    ),
    "lead customer": (
        "POST",
        "/api/v1/track/lead",
        "none",
        {"program_id": "{p}", "customer_external_id": "cX", "click_id": "clk_1"},
    ),
    "lead email": ("POST", "/api/v1/track/lead", "key", {"customer_external_id": "c1", "email": "aX@b.test"}),
    "lead name": ("POST", "/api/v1/track/lead", "key", {"customer_external_id": "c1", "name": "AnXn"}),
    "lead click_id": (
        "POST",
        "/api/v1/track/lead",
        "key",
        {"customer_external_id": "c1", "click_id": "clk_X"},
    ),
    "sale transaction_id": (
        "POST",
        "/api/v1/track/sale",
        "key",
        {"transaction_id": "tX", "customer_external_id": "c1", "amount": 100},
    ),
    "sale customer": (
        "POST",
        "/api/v1/track/sale",
        "key",
        {"transaction_id": "t1", "customer_external_id": "cX", "amount": 100},
    ),
    "sale subscription_id": (
        "POST",
        "/api/v1/track/sale",
        "key",
        {"transaction_id": "t1", "customer_external_id": "c1", "amount": 100, "subscription_id": "sX"},
    ),
    "sale promo_code": (
        "POST",
        "/api/v1/track/sale",
        "key",
        {"transaction_id": "t1", "customer_external_id": "c1", "amount": 100, "promo_code": "PXq"},
    ),
    "sale additional_data": (
        "POST",
        "/api/v1/track/sale",
        "key",
        {
            "transaction_id": "t1",
            "customer_external_id": "c1",
            "amount": 100,
            "additional_data": {"note": "X"},
        },
    ),
    "sale additional_data key": (
        "POST",
        "/api/v1/track/sale",
        "key",
        {"transaction_id": "t1", "customer_external_id": "c1", "amount": 100, "additional_data": {"kX": 1}},
    ),
    "refund refund_id": (
        "POST",
        "/api/v1/track/refund",
        "key",
        {"transaction_id": "t1", "refund_id": "rX", "amount": 100},
    ),
    "refund reason": (
        "POST",
        "/api/v1/track/refund",
        "key",
        {"transaction_id": "t1", "refund_id": "r1", "amount": 100, "reason": "whyX"},
    ),
    "account email": (
        "POST",
        "/api/v1/operator/accounts",
        "operator",
        {"email": "oX@b.test", "workspace_name": "W"},
    ),
    "account workspace": (
        "POST",
        "/api/v1/operator/accounts",
        "operator",
        {"email": "o@b.test", "workspace_name": "WXq"},
    ),
    "agent key name": (
        "POST",
        "/api/v1/operator/agent-keys",
        "operator",
        {"name": "tXq", "scopes": ["programs:read"], "workspace_ids": ["{w}"]},
    ),
    "agent key workspace": (
        "POST",
        "/api/v1/operator/agent-keys",
        "operator",
        {"name": "t", "scopes": ["programs:read"], "workspace_ids": ["{w}X"]},
    ),
    "member email": (
        "POST",
        "/api/v1/workspaces/{w}/members",
        "owner",
        {"email": "mX@b.test", "role": "member"},
    ),
    "program name": ("POST", "/api/v1/programs", "owner", {"workspace_id": "{w}", "name": "PXq"}),
    "program workspace": ("POST", "/api/v1/programs", "owner", {"workspace_id": "{w}X", "name": "P"}),
    "settings name": ("PATCH", "/api/v1/programs/{p}", "owner", {"name": "PXq"}),
    "settings stripe account": ("PATCH", "/api/v1/programs/{p}", "owner", {"stripe_account_id": "acct_X"}),
    "settings website": ("PATCH", "/api/v1/programs/{p}", "owner", {"website_url": "https://b.test/X"}),
    "partner code": ("POST", "/api/v1/programs/{p}/partners", "owner", {"code": "bXb", "name": "B"}),
    "partner name": ("POST", "/api/v1/programs/{p}/partners", "owner", {"code": "bob", "name": "BXb"}),
    "partner email": (
        "POST",
        "/api/v1/programs/{p}/partners",
        "owner",
        {"code": "bob", "name": "B", "email": "bX@b.test"},
    ),
    "payout email": (
        "PATCH",
        "/api/v1/programs/{p}/partners/alice",
        "owner",
        {
            "payout_method": "paypal",
            "payout_email": "aX@b.test",
            "payout_name": "A",
            "payout_currency": "usd",
        },
    ),
    "payout name": (
        "PATCH",
        "/api/v1/programs/{p}/partners/alice",
        "owner",
        {
            "payout_method": "paypal",
            "payout_email": "a@b.test",
            "payout_name": "AXb",
            "payout_currency": "usd",
        },
    ),
    "promo code": ("POST", "/api/v1/programs/{p}/partners/alice/promo-codes", "owner", {"code": "SXb"}),
    "adjustment reason": (
        "POST",
        "/api/v1/programs/{p}/partners/alice/adjustments",
        "owner",
        {"amount": 100, "currency": "usd", "reason": "bonusX"},
    ),
    "hold reason": ("POST", "/api/v1/programs/{p}/commissions/in_1/hold", "owner", {"reason": "checkX"}),
    "metadata fix": (
        "POST",
        "/api/v1/programs/{p}/metadata-fixes",
        "owner",
        {"fixes": [{"transaction_id": "tX", "svc_click_id": "c"}]},
    ),
    "webhook url": (
        "POST",
        "/api/v1/programs/{p}/webhook-endpoints",
        "owner",
        {"url": "https://h.test/X", "events": ["ping"]},
    ),
    "webhook description": (
        "POST",
        "/api/v1/programs/{p}/webhook-endpoints",
        "owner",
        {"url": "https://h.test/", "events": ["ping"], "description": "dX"},
    ),
}


def _fill(value: Any, world: World, char: str) -> Any:
    if isinstance(value, str):
        return value.format(p=world.program_id, w=world.workspace_id).replace("X", char)
    if isinstance(value, list):
        return [_fill(v, world, char) for v in value]
    if isinstance(value, dict):
        return {_fill(k, world, char): _fill(v, world, char) for k, v in value.items()}
    return value


def _headers(world: World, credential: str) -> dict[str, str]:
    return {"none": {}, "key": world.key, "owner": world.owner, "operator": OP}[credential]


def _send(world: World, case: Case, char: str) -> Any:
    method, path, credential, body = case
    url = _fill(path, world, "")
    return world.client.request(
        method, url, json=_fill(body, world, char), headers=_headers(world, credential)
    )


def _stored(world: World) -> list[tuple[Any, ...]]:
    return query(world.client, "SELECT count(*) FROM raw_events")


@pytest.fixture
def connected(client: Any) -> World:
    world = make_world(client, stripe_account_id=ACCOUNT)
    payee(world)
    return world


def test_a_nul_in_any_request_body_is_a_validation_error(connected: World) -> None:
    world = connected
    before = _stored(world)
    answers = {}
    for name, case in CASES.items():
        r = _send(world, case, NUL)
        answers[name] = (r.status_code, r.json().get("error", {}).get("code"))
    assert {n: a for n, a in answers.items() if a != (422, "validation_error")} == {}
    assert _stored(world) == before


def test_the_sweep_is_sound_without_the_character(connected: World) -> None:
    """Each case with a plain letter in the character's place is accepted (or refused for
    another reason than its text), so the sweep tests the character, not a broken body."""
    world = connected
    world.sale(transaction_id="in_1")
    for name, case in CASES.items():
        r = _send(world, case, "x")
        assert r.status_code < 500, (name, r.text)
        if r.status_code == 422:  # (an id made unknown by the letter is refused as unknown)
            assert "character" not in r.text, (name, r.text)


CONTROLS = ["\x01", "\x1f", "\x7f", "\r", "\n", "\r\n", "\t"]
# Names, ids, emails, codes and addresses: no control character at all.
ONE_LINE = [n for n in CASES if not n.endswith(("reason", "description")) and "additional_data" not in n]
FREE_TEXT = ["refund reason", "adjustment reason", "hold reason", "webhook description"]


@pytest.mark.parametrize("char", CONTROLS, ids=repr)
def test_names_and_ids_refuse_control_characters(connected: World, char: str) -> None:
    world = connected
    before = _stored(world)
    answers = {n: _send(world, CASES[n], char) for n in ONE_LINE}
    wrong = {n: (r.status_code, r.text[:200]) for n, r in answers.items() if r.status_code != 422}
    assert wrong == {}
    assert all(r.json()["error"]["code"] == "validation_error" for r in answers.values())
    assert _stored(world) == before


def test_free_text_keeps_tab_and_newline_but_no_other_control(connected: World) -> None:
    world = connected
    client = world.client
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    lead = {"customer_external_id": "c1", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    for tx in ("t1", "in_1"):
        assert world.sale(transaction_id=tx, customer_external_id="c1").status_code == 200
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    for name in FREE_TEXT:
        r = _send(world, CASES[name], "\x01")
        assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), (name, r.text)
    for name in FREE_TEXT:
        r = _send(world, CASES[name], "line one\n\tline two")
        assert r.status_code in (200, 201), (name, r.text)


def _delivery(place: str, char: str) -> bytes:
    event = load_event(LIVE_CHECKOUT, account=ACCOUNT, event_id="evt_nul_1")
    obj = event["data"]["object"]
    if place == "metadata value":
        obj["metadata"] = {"note": f"a{char}b"}
    elif place == "metadata key":
        obj["metadata"] = {f"k{char}": "v"}
    elif place == "event id":
        event["id"] = f"evt_{char}1"
    else:
        obj["customer"] = f"cus_{char}1"
    return serialise(event)


def _deliver(world: World, body: bytes) -> Any:
    headers = {
        "Stripe-Signature": sign(body, WEBHOOK_SECRET, int(time.time())),
        "Content-Type": "application/json",
    }
    return world.client.post("/webhooks/stripe", content=body, headers=headers)


@pytest.mark.parametrize("place", ["metadata value", "metadata key", "event id", "customer"])
def test_a_processor_delivery_with_a_nul_is_never_a_500(connected: World, place: str) -> None:
    world = connected
    before = _stored(world)
    r = _deliver(world, _delivery(place, NUL))
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), r.text
    assert _stored(world) == before
    r = _deliver(world, _delivery(place, "x"))
    assert r.status_code == 200, r.text


READS: list[Callable[[World], str]] = [
    lambda w: f"/api/v1/programs/{w.program_id}/sales?transaction_id=a%00b",
    lambda w: f"/api/v1/programs/{w.program_id}/sales/a%00b/explain",
    lambda w: f"/api/v1/programs/{w.program_id}/partners/a%00b",
    lambda w: f"/api/v1/programs/{w.program_id}%00",
    lambda w: f"/api/v1/programs/{w.program_id}/payouts/po%00",
]


@pytest.mark.parametrize("read", range(len(READS)))
def test_a_nul_in_a_path_or_query_is_a_validation_error(connected: World, read: int) -> None:
    r = connected.client.get(READS[read](connected), headers=connected.owner)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), r.text


def test_a_refusal_before_routing_answers_as_its_route_documents(world: World) -> None:
    """A NUL in a page's query is the dashboard's (or portal's) HTML error page, in the API's
    the JSON envelope; an id no route could hold (a newline) still reaches its page's handler
    and gets the page's own 404, never the API's JSON "no such path"."""
    from tests.helpers import logged_in

    base = f"/dashboard/programs/{world.program_id}"
    csrf = logged_in(world.client, world.account_token)
    page = world.client.get(f"{base}/payouts?x=%00")
    assert page.status_code == 422 and page.headers["content-type"].startswith("text/html")
    assert "validation_error" in page.text
    api = world.client.get(f"/api/v1/programs/{world.program_id}/commissions?x=%00", headers=world.owner)
    assert api.status_code == 422 and api.json()["error"]["code"] == "validation_error"
    portal = world.client.get(f"/partner/programs/{world.program_id}/statement?x=%00")
    assert portal.status_code == 422 and portal.headers["content-type"].startswith("text/html")
    odd = world.client.post(
        f"{base}/commissions/y%0Az", data={"action": "hold", "reason": "r", "csrf_token": csrf}
    )
    assert odd.status_code == 404 and odd.headers["content-type"].startswith("text/html"), odd.text
