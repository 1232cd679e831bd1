"""Issue 48, item 1, in real headless Chromium against a live server: whoever holds the program
key records sales whose transaction ids are paths (`x/../../payouts/<payout_id>/paid`,
`y/../../webhooks/<endpoint_id>/delete`); the owner opens each one's explain page and presses
Hold, Release and Void, and the sales list links each one's own page. Only the intended action
happens: the sale's line changes, the open payout batch stays open and unpaid, the webhook
endpoint stays."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.browser.cdp import Page
from tests.conftest import OP, LiveServer, bearer, make_world, start_server
from tests.helpers import payee


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "hostile.duckdb", TALLY_WEBHOOKS_ALLOW_PRIVATE="1")
    try:
        yield live
    finally:
        live.stop()


def _press(page: Page, selector: str) -> None:
    page.events.clear()
    page.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
    page.wait_for("Page.loadEventFired")


@pytest.mark.browser
def test_hostile_ids_cannot_steer_the_owners_buttons(server: LiveServer, page: Page) -> None:
    http = httpx.Client(base_url=server.url, timeout=60)
    world = make_world(http, holding_days=0)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
    pid, owner, key = world.program_id, world.owner, world.key
    payee(world)
    click = http.post("/api/v1/track/click", json={"program_id": pid, "partner_code": "alice"})
    lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
    assert http.post("/api/v1/track/lead", json=lead, headers=key).status_code == 200
    sale = {"transaction_id": "in_ok", "customer_external_id": "cust_1", "amount": 10_000}
    assert http.post("/api/v1/track/sale", json=sale, headers=key).status_code == 200
    assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    r = http.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": "9999-12-30"}, headers=owner)
    assert r.status_code == 201, r.text
    payout_id = r.json()["data"]["payout_id"]
    hook = {"url": "http://127.0.0.1:9/hook", "events": ["ping"]}
    r = http.post(f"/api/v1/programs/{pid}/webhook-endpoints", json=hook, headers=owner)
    assert r.status_code == 201, r.text
    endpoint_id = r.json()["data"]["endpoint_id"]
    hostile = [f"x/../../payouts/{payout_id}/paid", f"y/../../webhooks/{endpoint_id}/delete"]
    for tx in hostile:
        sale = {"transaction_id": tx, "customer_external_id": "cust_1", "amount": 1_000}
        assert http.post("/api/v1/track/sale", json=sale, headers=key).status_code == 200
    assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200

    def statuses(tx: str) -> list[str]:
        r = http.get(f"/api/v1/programs/{pid}/sales/{quote(tx, safe='')}/explain", headers=owner)
        assert r.status_code == 200, r.text
        return [line["status"] for line in r.json()["data"]["lines"]]

    def untouched() -> None:
        r = http.get(f"/api/v1/programs/{pid}/payouts/{payout_id}", headers=owner)
        assert (r.json()["data"]["status"], r.json()["data"]["paid_at"]) == ("open", None), r.text
        r = http.get(f"/api/v1/programs/{pid}/webhook-endpoints/{endpoint_id}", headers=owner)
        assert r.status_code == 200, r.text

    untouched()
    page.navigate(f"{server.url}/dashboard")
    page.evaluate(f"document.getElementById('token').value = {json.dumps(world.account_token)}")
    _press(page, "#login-form button[type=submit]")
    base = f"/dashboard/programs/{pid}"
    for tx in hostile:
        explain = f"{base}/sales/{quote(tx, safe='')}"
        page.navigate(f"{server.url}{explain}")
        before = statuses(tx)
        for action, status in (("hold", "held"), ("release", before[0]), ("void", "void")):
            page.evaluate("document.querySelector('#finance-action input[name=reason]').value = 'check'")
            _press(page, f"#finance-action button[value={action}]")
            assert page.evaluate("location.pathname") == explain, (tx, action)
            assert page.evaluate("document.getElementById('acted')?.textContent") == (
                f"{action.capitalize()} recorded."
            )
            assert statuses(tx) == [status], (tx, action)
            untouched()
    page.navigate(f"{server.url}{base}/sales")  # the sales list links each sale's own page
    for tx in hostile:
        explain = f"{base}/sales/{quote(tx, safe='')}"
        _press(page, f"a[href={json.dumps(explain)}]")
        assert page.evaluate("location.pathname") == explain
        page.navigate(f"{server.url}{base}/sales")
    assert statuses("in_ok") == ["approved"]
    r: Any = http.get(f"/api/v1/programs/{pid}/webhook-endpoints", headers=bearer(world.account_token))
    assert [e["endpoint_id"] for e in r.json()["data"]] == [endpoint_id]
    http.close()
