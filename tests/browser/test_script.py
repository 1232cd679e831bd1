"""The browser script (CONTRACT section 4, "Browser script") in real headless Chromium.

A live tally on 127.0.0.1 and a brand site on another origin (`brand.test`, mapped to loopback
by Chromium's resolver), so the click and lead calls are cross-origin and CORS is exercised.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from ingest.storage.duckdb.store import DuckStore
from tests.browser.cdp import Chromium, Page
from tests.browser.conftest import launch
from tests.conftest import LiveServer, bearer, make_world
from tests.helpers import sql_rows

BRAND_HOST = "brand.test"
NINETY_DAYS = 90 * 24 * 3600

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Brand</title>{head}</head>
<body style="font-family: sans-serif"><h1>Brand test site</h1><p>Sign up and save.</p></body></html>
"""


# -- the script's HTTP contract (no browser needed) -------------------------------------------------
def test_script_is_served_cacheable_with_etag_and_cors(client: TestClient) -> None:
    r = client.get("/sdk/v1/tally.js")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/javascript"
    assert r.headers["cache-control"] == "public, max-age=3600"
    assert r.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in r.headers
    etag = r.headers["etag"]
    assert etag.startswith('"') and etag.endswith('"') and len(etag) == 34
    assert b"svc_click_id" in r.content and b"Authorization" not in r.content
    again = client.get("/sdk/v1/tally.js", headers={"If-None-Match": etag})
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag)
    stale = client.get("/sdk/v1/tally.js", headers={"If-None-Match": '"other"'})
    assert stale.status_code == 200 and stale.content == r.content
    preflight = client.options(
        "/sdk/v1/tally.js", headers={"Origin": "https://brand.test", "Access-Control-Request-Method": "GET"}
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "*"


# -- real Chromium ------------------------------------------------------------------------------------


@dataclass
class Tally:
    server: LiveServer
    program_id: str
    account_token: str
    api_key: str

    def get(self, path: str) -> dict[str, Any]:
        r = httpx.get(self.server.url + path, headers=bearer(self.account_token), timeout=10)
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()["data"]
        return data

    def log_details(self) -> list[str]:
        entries = self.get(f"/api/v1/programs/{self.program_id}/tracking-log")["entries"]
        return [e["detail"] for e in reversed(entries)]

    def step_done(self, key: str) -> bool:
        steps = self.get(f"/api/v1/programs/{self.program_id}/checklist")["steps"]
        return bool(next(s["done"] for s in steps if s["key"] == key))


@pytest.fixture
def tally(live_server: LiveServer) -> Tally:
    """A live tally with an account, a program, its key and the partner `alice`."""
    with httpx.Client(base_url=live_server.url, timeout=10) as http:
        world = make_world(http)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
    return Tally(live_server, world.program_id, world.account_token, world.api_key)


class BrandSite:
    """A tiny brand website on its own origin; `pages` maps a path to its HTML."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                html = site.pages.get(self.path.split("?", 1)[0])
                body = (html or "not found").encode()
                self.send_response(200 if html else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # the port the kernel gave
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="brand-site", daemon=True)
        self._thread.start()
        self.origin = f"http://{BRAND_HOST}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="module")
def brand() -> Iterator[BrandSite]:
    site = BrandSite()
    yield site
    site.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    with launch(f"--host-resolver-rules=MAP {BRAND_HOST} 127.0.0.1") as browser:
        yield browser


@pytest.fixture
def page(chromium: Chromium) -> Iterator[Page]:
    page = chromium.new_page()
    page.send("Network.clearBrowserCookies")
    yield page
    page.close()


def include_tag(tally: Tally) -> str:
    """The documented include: the script from tally's origin, configured by data attribute."""
    src = f"{tally.server.url}/sdk/v1/tally.js"
    return f'<script src="{src}" data-program-id="{tally.program_id}" defer></script>'


def exceptions(page: Page) -> list[Any]:
    return [e["params"] for e in page.events if e.get("method") == "Runtime.exceptionThrown"]


@pytest.mark.browser
def test_aff_visit_sets_click_cookie_and_signup_reports_browser_lead(
    tally: Tally, brand: BrandSite, page: Page, tmp_path: Path
) -> None:
    brand.pages["/"] = PAGE.format(head=include_tag(tally))
    page.navigate(f"{brand.origin}/?aff=alice&utm_source=newsletter")
    click_id = page.evaluate("tally.ready")
    assert isinstance(click_id, str) and click_id.startswith("clk_")
    assert page.evaluate("tally.clickId()") == click_id

    [cookie] = [c for c in page.cookies(brand.origin + "/") if c["name"] == "svc_click_id"]
    assert cookie["value"] == click_id
    assert (cookie["domain"], cookie["path"], cookie["sameSite"]) == (BRAND_HOST, "/", "Lax")
    assert cookie["secure"] is False and cookie["httpOnly"] is False and cookie["session"] is False
    assert abs(cookie["expires"] - (time.time() + NINETY_DAYS)) < 120
    assert page.cookies(tally.server.url + "/") == []  # nothing set on tally's own origin

    assert tally.step_done("click_received") is True
    assert tally.log_details() == [f"click {click_id} for alice"]

    lead = page.evaluate('tally.signup("user_42")')
    assert lead == {
        "lead_id": lead["lead_id"],
        "customer_external_id": "user_42",
        "status": "settled",
        "provisional": False,
    }
    assert tally.log_details()[-1] == f"browser lead {lead['lead_id']} (settled) for user_42"
    assert exceptions(page) == []

    shot = page.screenshot(tmp_path / "brand.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 2000

    # The lead carried the cookie's click: the customer's sale is attributed to alice.
    r = httpx.post(
        tally.server.url + "/api/v1/track/sale",
        json={"transaction_id": "in_browser_1", "customer_external_id": "user_42", "amount": 4900},
        headers=bearer(tally.api_key),
        timeout=10,
    )
    assert (r.json()["data"]["attributed"], r.json()["data"]["partner_code"]) == (True, "alice")

    # Server-side read of the raw log: a browser-mode lead, the click id, from the brand's origin.
    tally.server.stop()
    store = DuckStore(tally.server.database)
    try:
        rows = sql_rows(
            store,
            "SELECT kind, click_id, partner_code, customer_key, lead_status, headers FROM raw_events"
            " WHERE kind IN ('click', 'lead') ORDER BY seq",
        )
    finally:
        store.close()
    (click_row, lead_row) = rows
    assert click_row[:3] == ("click", click_id, "alice")
    assert lead_row[:5] == ("lead", click_id, None, "user_42", "settled")
    headers = json.loads(lead_row[5])
    assert headers["origin"] == brand.origin
    assert "authorization" not in {h.lower() for h in headers}


@pytest.mark.browser
def test_page_without_aff_sets_no_cookie_and_init_with_track_lead_works(
    tally: Tally, brand: BrandSite, page: Page
) -> None:
    config = json.dumps({"programId": tally.program_id, "apiBase": tally.server.url})
    brand.pages["/manual"] = PAGE.format(
        head=f'<script src="{tally.server.url}/sdk/v1/tally.js"></script>'
        f"<script>tally.init({config});</script>"
    )
    page.navigate(f"{brand.origin}/manual?ref=homepage")
    assert page.evaluate("tally.ready") is None
    assert page.evaluate("document.cookie") == ""
    assert [c["name"] for c in page.cookies(brand.origin + "/")] == []
    assert tally.step_done("click_received") is False

    lead = page.evaluate('tally.trackLead({customerExternalId: "user_9"})')
    assert (lead["customer_external_id"], lead["status"]) == ("user_9", "settled")
    assert tally.log_details() == [f"browser lead {lead['lead_id']} (settled) for user_9"]

    refused = page.evaluate('tally.signup("").then(() => "resolved", (e) => e.name)')
    assert refused == "TypeError"
    # a second init is a no-op that returns the same `ready`
    assert page.evaluate('tally.init({programId: "prog_other"}) === tally.ready') is True
    assert exceptions(page) == []


@pytest.mark.browser
def test_unknown_partner_code_does_not_throw_or_set_a_cookie(
    tally: Tally, brand: BrandSite, page: Page
) -> None:
    brand.pages["/"] = PAGE.format(head=include_tag(tally))
    page.navigate(f"{brand.origin}/?aff=nobody")
    assert page.evaluate("tally.ready") is None
    assert page.cookies(brand.origin + "/") == []
    assert exceptions(page) == []
    assert any("click not recorded" in m for m in page.console_messages())


@pytest.mark.browser
def test_signup_right_at_load_waits_for_the_click_in_flight(
    tally: Tally, brand: BrandSite, page: Page
) -> None:
    on_load = 'document.addEventListener("DOMContentLoaded", () => { window.lead = tally.signup("u_e"); });'
    eager = f"<script>{on_load}</script>"
    brand.pages["/eager"] = PAGE.format(head=include_tag(tally) + eager)
    page.navigate(f"{brand.origin}/eager?aff=alice")
    lead = page.evaluate("window.lead")
    assert lead["customer_external_id"] == "u_e"
    click_id = page.evaluate("tally.clickId()")
    assert tally.log_details() == [
        f"click {click_id} for alice",
        f"browser lead {lead['lead_id']} (settled) for u_e",
    ]
    r = httpx.post(
        tally.server.url + "/api/v1/track/sale",
        json={"transaction_id": "in_eager", "customer_external_id": "u_e", "amount": 100},
        headers=bearer(tally.api_key),
        timeout=10,
    )
    assert r.json()["data"]["partner_code"] == "alice"
