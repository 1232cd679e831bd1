"""The dashboard's Webhooks tab in real headless Chromium against a live server with its delivery
worker on and a real receiver: an owner adds an endpoint with the form and sees its secret once,
sends a ping, sees the delivery (status, answer, time, attempts) and resends it; the page never
scrolls sideways at phone width (390 px) or on a laptop (1280 px)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.browser.cdp import Page
from tests.conftest import LiveServer, make_world, start_server
from tests.processes import wait_until
from tests.receiver import Receiver

OVERFLOW = "document.scrollingElement.scrollWidth <= window.innerWidth"
STICKING_OUT = """[...document.querySelectorAll('body *')]
  .filter(el => !el.closest('.scroll'))
  .filter(el => el.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
  .map(el => el.tagName + (el.id ? '#' + el.id : ''))"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "page.duckdb", TALLY_WEBHOOKS_ALLOW_PRIVATE="1")
    try:
        yield live
    finally:
        live.stop()


def _width(page: Page, pixels: int) -> None:
    page.send(
        "Emulation.setDeviceMetricsOverride", width=pixels, height=900, deviceScaleFactor=1, mobile=False
    )


def _submit(page: Page, selector: str) -> None:
    page.events.clear()
    page.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
    page.wait_for("Page.loadEventFired")


def _fits(page: Page, pixels: int) -> None:
    assert page.evaluate("window.innerWidth") == pixels
    assert page.evaluate(OVERFLOW), page.evaluate("document.scrollingElement.scrollWidth")
    assert page.evaluate(STICKING_OUT) == []


@pytest.mark.browser
@pytest.mark.parametrize("pixels", [390, 1280])
def test_an_owner_adds_an_endpoint_pings_it_and_resends(server: LiveServer, page: Page, pixels: int) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        world = make_world(http)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
    receiver = Receiver()
    try:
        _width(page, pixels)
        page.navigate(f"{server.url}/dashboard/login")
        page.evaluate(f"document.getElementById('token').value = {json.dumps(world.account_token)}")
        _submit(page, "#login-form button[type=submit]")
        tab = f"{server.url}/dashboard/programs/{world.program_id}/webhooks"
        page.navigate(f"{server.url}/dashboard/programs/{world.program_id}")
        assert page.evaluate(
            "[...document.querySelectorAll('nav.tabs a')].some(a => a.textContent === 'Webhooks')"
        )
        page.navigate(tab)
        assert page.evaluate("document.getElementById('no-endpoints') !== null")
        _fits(page, pixels)

        url = f"{receiver.url}/hooks/{'x' * 60}"  # a long URL must wrap, not widen the page
        page.evaluate(f"document.getElementById('url').value = {json.dumps(url)}")
        page.evaluate("document.querySelector('input[name=events][value=\"sale.created\"]').checked = true")
        _submit(page, "#add-endpoint-button")
        secret = page.evaluate("document.querySelector('#new-secret-box code.secret').textContent")
        assert secret.startswith("whsec_")
        _fits(page, pixels)
        page.navigate(tab)  # a reload shows it no more
        assert page.evaluate("document.getElementById('new-secret-box')") is None
        assert secret not in page.evaluate("document.body.innerHTML")

        _submit(page, "button.ping")
        assert "Ping queued" in page.evaluate("document.getElementById('done').textContent")
        receiver.wait_for(1)
        assert (
            Webhook(secret).verify(receiver.received[0].body, receiver.received[0].headers)["type"] == "ping"
        )

        def shown() -> list[str]:
            page.navigate(tab)
            cells = "[...document.querySelectorAll('table.deliveries tbody tr td')]"
            found: list[str] = page.evaluate(cells + ".map(td => td.textContent.trim())")
            return found

        wait_until(lambda: "succeeded" in " ".join(shown()), "the ping shown as succeeded", 30, 0.2)
        cells = shown()
        assert "200" in cells and "1" in cells
        _fits(page, pixels)

        _submit(page, "button.resend")
        receiver.wait_for(2)
        assert receiver.ids()[0] == receiver.ids()[1]
        _submit(page, "button.toggle")  # disable
        assert page.evaluate("document.querySelector('.endpoint .badge.warn').textContent") == "disabled"
        _submit(page, "button.delete")
        assert page.evaluate("document.getElementById('no-endpoints') !== null")
    finally:
        receiver.close()


@pytest.mark.browser
def test_a_refused_url_is_said_next_to_the_form(tmp_path: Path, page: Page) -> None:
    live = start_server(tmp_path / "plain.duckdb")  # without TALLY_WEBHOOKS_ALLOW_PRIVATE
    try:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            world = make_world(http)  # type: ignore[arg-type]
        page.navigate(f"{live.url}/dashboard/login")
        page.evaluate(f"document.getElementById('token').value = {json.dumps(world.account_token)}")
        _submit(page, "#login-form button[type=submit]")
        page.navigate(f"{live.url}/dashboard/programs/{world.program_id}/webhooks")
        page.evaluate("document.getElementById('url').value = 'http://127.0.0.1:9/x'")
        page.evaluate("document.querySelector('input[name=events][value=\"payout.paid\"]').checked = true")
        _submit(page, "#add-endpoint-button")
        assert "https://" in page.evaluate("document.getElementById('endpoint-errors').textContent")
        assert page.evaluate("document.getElementById('url').value") == "http://127.0.0.1:9/x"
        assert page.evaluate("document.querySelector('input[value=\"payout.paid\"]').checked") is True
    finally:
        live.stop()
