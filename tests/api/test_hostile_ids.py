"""Any transaction id the ingest accepts can be explained, held, released and voided through the
API (issue 48, item 1): ids reach a URL as one percent-encoded segment (`quote(id, safe='')`) and
the routes take them as `:path`, so `/`, `%`, `?`, `#`, spaces and any other character work;
ids made only of dots (`.`, `..`: path steps a browser or client would resolve) are refused at
ingest. The dashboard's explain page and its Hold / Release / Void form name the same sale."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import csrf_of, logged_in

# (Starlette's TestClient decodes a path twice, so an id holding a valid escape such as `%2F`
# is tried against a live server: tests/test_cli_hostile_ids.py and the browser test.)
IDS = [
    "x/../../payouts/po_1/paid",
    "a/b",
    "/leading/",
    "50%off",
    "100%",
    "what?x=1",
    "tx#frag",
    "with space",
    "reçu-№7 ✓",
    "...x",
    "x..",
]


def _attributed(client: TestClient) -> World:
    world = make_world(client)
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    for tx in IDS:
        r = world.sale(transaction_id=tx, customer_external_id="cust_1", amount=1000)
        assert r.status_code == 200, (tx, r.text)
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    return world


def _api(world: World, tx: str, suffix: str) -> str:
    return f"/api/v1/programs/{world.program_id}{suffix.format(quote(tx, safe=''))}"


def _statuses(world: World, tx: str) -> list[str]:
    r = world.client.get(_api(world, tx, "/sales/{}/explain"), headers=world.owner)
    assert r.status_code == 200, (tx, r.text)
    assert r.json()["data"]["sale"]["transaction_id"] == tx
    return [line["status"] for line in r.json()["data"]["lines"]]


def test_every_accepted_id_is_explained_held_released_and_voided(client: TestClient) -> None:
    world = _attributed(client)
    for tx in IDS:
        assert _statuses(world, tx) == ["pending"], tx
        for action, status in (("hold", "held"), ("release", "pending"), ("void", "void")):
            r = client.post(
                _api(world, tx, "/commissions/{}/" + action), json={"reason": "check"}, headers=world.owner
            )
            assert r.status_code == 200, (tx, action, r.text)
            assert r.json()["data"]["transaction_id"] == tx
            assert _statuses(world, tx) == [status], (tx, action)
    # Nothing else was touched: every line of the program is the void one of its own sale.
    r = client.get(f"/api/v1/programs/{world.program_id}/commissions", headers=world.owner)
    assert sorted((x["transaction_id"], x["status"]) for x in r.json()["data"]) == sorted(
        (tx, "void") for tx in IDS
    )


def test_the_dashboard_acts_on_the_sale_the_page_shows(client: TestClient) -> None:
    world = _attributed(client)
    csrf = logged_in(client, world.account_token)
    base = f"/dashboard/programs/{world.program_id}"
    sales = client.get(f"{base}/sales")
    for tx in IDS:
        href = f'href="{base}/sales/{quote(tx, safe="")}"'
        assert href.replace("&", "&amp;") in sales.text or href in sales.text, tx
        page = client.get(f"{base}/sales/{quote(tx, safe='')}")
        assert page.status_code == 200, (tx, page.text)
        action = f'action="{base}/commissions/{quote(tx, safe="")}"'
        assert action in page.text, tx
        r = client.post(
            f"{base}/commissions/{quote(tx, safe='')}",
            data={"csrf_token": csrf_of(page.text) or csrf, "action": "hold", "reason": "check"},
            follow_redirects=False,
        )
        assert r.status_code == 303, (tx, r.text)
        assert r.headers["location"].startswith(f"{base}/sales/{quote(tx, safe='')}?"), tx
        assert _statuses(world, tx) == ["held"], tx


@pytest.mark.parametrize("tx", [".", "..", "..."])
def test_an_id_of_dots_only_is_refused_at_ingest(world: World, tx: str) -> None:
    r = world.sale(transaction_id=tx)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), r.text
    body = {"transaction_id": "in_1", "refund_id": tx, "amount": 1}
    r = world.client.post("/api/v1/track/refund", json=body, headers=world.key)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), r.text
