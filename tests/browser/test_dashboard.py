"""The dashboard in real headless Chromium against a live server: log in through the form,
regenerate the key with the button and use it, members see no button, CSRF-less posts refused."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest.domain.tokens import mask
from tests.browser.cdp import Page
from tests.conftest import LiveServer, bearer, make_world

TEST_SALE = {"additional_data": {"test_mode": True}}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Dashboard:
    server: LiveServer
    program_id: str
    owner_token: str
    member_token: str
    api_key: str

    @property
    def program_url(self) -> str:
        return f"{self.server.url}/dashboard/programs/{self.program_id}"

    def test_sale(self, key: str) -> httpx.Response:
        return httpx.post(
            f"{self.server.url}/api/v1/track/sale", json=TEST_SALE, headers=bearer(key), timeout=10
        )


@pytest.fixture
def dashboard(live_server: LiveServer) -> Dashboard:
    """A live tally with an owner, a member, a program with its key and the partner `alice`."""
    with httpx.Client(base_url=live_server.url, timeout=10) as http:
        world = make_world(http)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
        member = world.member()["Authorization"].removeprefix("Bearer ")
    return Dashboard(live_server, world.program_id, world.account_token, member, world.api_key)


def click_and_wait(page: Page, selector: str) -> None:
    """Click an element that navigates (a link, a submit button) and wait for the new page."""
    page.events.clear()
    page.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
    page.wait_for("Page.loadEventFired")


def text_of(page: Page, selector: str) -> Any:
    return page.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? null")


def log_in(page: Page, dashboard: Dashboard, token: str) -> None:
    page.navigate(f"{dashboard.server.url}/dashboard")
    assert page.evaluate("location.pathname") == "/dashboard/login"  # no session: sent to log in
    page.evaluate(f"document.getElementById('token').value = {json.dumps(token)}")
    click_and_wait(page, "#login-form button[type=submit]")
    assert page.evaluate("location.pathname") == "/dashboard"


def post_from_page(page: Page, path: str, body: str) -> tuple[int, str]:
    """A same-origin fetch from the page, with the session cookie (what injected script could do)."""
    status, text = page.evaluate(
        f"""fetch({json.dumps(path)}, {{method: 'POST', credentials: 'same-origin',
              headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: {json.dumps(body)}}})
            .then(async r => [r.status, await r.text()])"""
    )
    return status, text


@pytest.mark.browser
def test_owner_logs_in_regenerates_with_the_button_and_uses_the_shown_key(
    dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    log_in(page, dashboard, dashboard.owner_token)
    session = next(
        c for c in page.cookies(dashboard.server.url + "/dashboard") if c["name"] == "tally_session"
    )
    assert session["httpOnly"] is True and session["sameSite"] == "Lax" and session["path"] == "/dashboard"
    assert dashboard.owner_token not in session["value"]
    assert "tally_session" not in page.evaluate("document.cookie")  # scripts cannot read it

    click_and_wait(page, f"a[href='/dashboard/programs/{dashboard.program_id}']")
    assert text_of(page, "#api-key-masked") == mask(dashboard.api_key)
    assert text_of(page, "#regenerate-key").strip() == "Regenerate API key…"

    click_and_wait(page, "#regenerate-key")  # first a question, nothing regenerated yet
    assert page.evaluate("location.pathname") == f"/dashboard/programs/{dashboard.program_id}/api-key"
    assert "stops working" in text_of(page, "#confirm-key") and text_of(page, "#new-api-key") is None
    assert dashboard.test_sale(dashboard.api_key).status_code == 200
    click_and_wait(page, "#cancel-regenerate")  # cancel: back to the settings, same key
    assert text_of(page, "#api-key-masked") == mask(dashboard.api_key)
    assert dashboard.test_sale(dashboard.api_key).status_code == 200

    click_and_wait(page, "#regenerate-key")
    click_and_wait(page, "#confirm-regenerate")  # POST, then the redirect's GET shows the key
    assert page.evaluate("location.pathname + location.search") == (
        f"/dashboard/programs/{dashboard.program_id}?key=new"
    )
    new_key = text_of(page, "#new-api-key")
    assert new_key.startswith("aff_") and new_key != dashboard.api_key
    assert "will not be shown again" in text_of(page, "#new-key-box")
    assert text_of(page, "#api-key-masked").endswith(new_key[-4:])

    page.events.clear()
    page.send("Page.reload")  # a reload GETs the page again: no second POST, no second key
    page.wait_for("Page.loadEventFired")
    assert page.evaluate("location.search") == "?key=new"
    assert text_of(page, "#new-api-key") is None and text_of(page, "#key-shown-once") is not None
    assert new_key not in page.evaluate("document.documentElement.outerHTML")
    assert text_of(page, "#api-key-masked") == mask(new_key)

    page.navigate(dashboard.program_url)  # the settings page again: masked only, key gone
    assert text_of(page, "#new-api-key") is None
    assert new_key not in page.evaluate("document.documentElement.outerHTML")
    masked = text_of(page, "#api-key-masked")
    assert masked.endswith(new_key[-4:]) and masked == mask(new_key)

    sale = dashboard.test_sale(new_key)  # the key shown is the one in force: reloading made no other
    assert sale.status_code == 200 and sale.json()["data"]["test_mode"] is True
    assert dashboard.test_sale(dashboard.api_key).status_code == 401

    shot = page.screenshot(tmp_path / "program.png").read_bytes()
    assert shot.startswith(PNG_SIGNATURE) and len(shot) > 10_000
    width, height = struct.unpack(">II", shot[16:24])  # the IHDR chunk
    assert width >= 800 and height >= 600

    status, text = post_from_page(
        page, f"/dashboard/programs/{dashboard.program_id}/api-key", "confirm=regenerate"
    )
    assert status == 403 and "csrf_refused" in text
    status, _ = post_from_page(
        page, f"/dashboard/programs/{dashboard.program_id}/api-key", "csrf_token=forged&confirm=regenerate"
    )
    assert status == 403
    assert dashboard.test_sale(new_key).status_code == 200  # nothing changed
    page.navigate(dashboard.program_url)
    assert text_of(page, "#api-key-masked") == mask(new_key)

    click_and_wait(page, "#logout")
    assert page.evaluate("location.pathname") == "/dashboard/login"
    page.navigate(dashboard.program_url)
    assert page.evaluate("location.pathname") == "/dashboard/login"


@pytest.mark.browser
def test_member_sees_no_regenerate_button_and_a_forged_post_is_refused(
    dashboard: Dashboard, page: Page
) -> None:
    log_in(page, dashboard, dashboard.member_token)
    page.navigate(dashboard.program_url)
    assert text_of(page, "h1") == "Brand partners"
    assert page.evaluate("document.getElementById('regenerate-key')") is None
    assert "Only a workspace owner" in text_of(page, "#api-key")
    assert text_of(page, "#api-key-masked") == mask(dashboard.api_key)
    assert "alice" in text_of(page, "#partners")

    token = page.evaluate("document.querySelector('input[name=csrf_token]').value")
    status, text = post_from_page(
        page, f"/dashboard/programs/{dashboard.program_id}/api-key", f"csrf_token={token}&confirm=regenerate"
    )
    assert status == 403 and "owner_required" in text
    assert dashboard.test_sale(dashboard.api_key).status_code == 200


@pytest.mark.browser
def test_wrong_token_stays_on_the_login_page(dashboard: Dashboard, page: Page) -> None:
    page.navigate(f"{dashboard.server.url}/dashboard/login")
    page.evaluate("document.getElementById('token').value = 'acct_not-a-real-token'")
    click_and_wait(page, "#login-form button[type=submit]")
    assert page.evaluate("location.pathname") == "/dashboard/login"
    assert "not a valid account token" in text_of(page, ".error")
    names = {c["name"] for c in page.cookies(dashboard.server.url + "/dashboard")}
    assert "tally_session" not in names
