"""The html finance report in real headless Chromium against a live server: the standalone page
under its own Content-Security-Policy and the dashboard's Finance tab, with their inline SVG
charts drawn (colours applied, no CSP violation), their tables in the DOM, and screenshots."""

from __future__ import annotations

import base64
import io
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.browser.cdp import Chromium, Page
from tests.browser.conftest import launch
from tests.conftest import OP, LiveServer, bearer, make_world

PERIOD = "2026-01"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BAR_BLUE = (47, 95, 179)  # charts.BAR, #2f5fb3
# Registered before any page script could run (DevTools scripts are not subject to the page's CSP):
# every CSP violation the page causes is kept in window.__csp.
CSP_PROBE = """window.__cspListening = true; window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"""


@dataclass
class Reported:
    server: LiveServer
    program_id: str
    owner_token: str

    @property
    def finance_page(self) -> str:
        return f"{self.server.url}/dashboard/programs/{self.program_id}/finance?period={PERIOD}"

    @property
    def export_html(self) -> str:
        path = f"/dashboard/programs/{self.program_id}/finance/export"
        return f"{self.server.url}{path}?period={PERIOD}&format=html"


@pytest.fixture
def reported(live_server: LiveServer) -> Reported:
    """A live tally with January sales of two partners in usd and eur, a refund, reconciled."""
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        world = make_world(http)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
        owner = bearer(world.account_token)
        r = http.post(
            f"/api/v1/programs/{world.program_id}/partners",
            json={"code": "bob", "name": "Bob"},
            headers=owner,
        )
        assert r.status_code == 201, r.text
        for n, (partner, amount, currency) in enumerate(
            [("alice", 10_000, "usd"), ("bob", 25_000, "usd"), ("alice", 4_000, "eur"), ("bob", 1_500, "eur")]
        ):
            click = http.post(
                "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": partner}
            ).json()["data"]["click_id"]
            sale = {
                "transaction_id": f"in_{n}",
                "customer_external_id": f"cust_{n}",
                "amount": amount,
                "currency": currency,
                "click_id": click,
                "occurred_at": f"2026-01-{n + 2:02d}T10:00:00Z",
            }
            assert http.post("/api/v1/track/sale", json=sale, headers=world.key).status_code == 200
        refund = {
            "transaction_id": "in_1",
            "refund_id": "re_1",
            "amount": 5_000,
            "occurred_at": "2026-01-09T10:00:00Z",
        }
        assert http.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
        assert (
            http.post(
                "/api/v1/track/sale",
                json={
                    "amount": 700,
                    "occurred_at": "2026-01-05T00:00:00Z",
                    "transaction_id": "in_x",
                    "customer_external_id": "cust_x",
                },
                headers=world.key,
            ).status_code
            == 200
        )
        assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    return Reported(live_server, world.program_id, world.account_token)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    with launch("--window-size=1280,1024") as browser:
        yield browser


@pytest.fixture
def page(chromium: Chromium) -> Iterator[Page]:
    page = chromium.new_page()
    page.send("Network.clearBrowserCookies")
    page.send("Page.addScriptToEvaluateOnNewDocument", source=CSP_PROBE)
    yield page
    page.close()


def js(page: Page, expression: str) -> Any:
    return page.evaluate(expression)


def log_in(page: Page, reported: Reported) -> None:
    page.navigate(f"{reported.server.url}/dashboard/login")
    page.evaluate(f"document.getElementById('token').value = {json.dumps(reported.owner_token)}")
    page.events.clear()
    page.evaluate("document.querySelector('#login-form button[type=submit]').click()")
    page.wait_for("Page.loadEventFired")
    assert page.evaluate("location.pathname") == "/dashboard"


def element_png(page: Page, selector: str) -> Image.Image:
    """A screenshot of one element (scrolled into view), as an image."""
    box = js(
        page,
        f"""(() => {{ const el = document.querySelector({json.dumps(selector)}); el.scrollIntoView();
            const r = el.getBoundingClientRect();
            return {{x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}}; }})()""",
    )
    assert box["width"] > 100 and box["height"] > 50, box
    data = page.send(
        "Page.captureScreenshot", format="png", clip={**box, "scale": 1}, captureBeyondViewport=True
    )
    return Image.open(io.BytesIO(base64.b64decode(data["data"]))).convert("RGB")


def colours(image: Image.Image) -> dict[tuple[int, int, int], int]:
    """Pixel count per RGB colour."""
    found = image.getcolors(maxcolors=image.width * image.height) or []
    return {colour: count for count, colour in found}


def colour_share(image: Image.Image, colour: tuple[int, int, int]) -> float:
    return colours(image).get(colour, 0) / (image.width * image.height)


def assert_report_in_dom(page: Page) -> None:
    assert js(page, "window.__cspListening") is True
    assert js(page, "window.__csp") == []
    assert js(page, "document.querySelectorAll('#finance-report svg').length") == 4
    for code in ("usd", "eur"):
        for chart in ("partners", "status"):
            assert js(page, f"!!document.querySelector('#chart-{chart}-{code} > svg')"), (chart, code)
        rows = js(
            page, f"[...document.querySelectorAll('#partners-{code} tbody tr')].map(r => r.dataset.partner)"
        )
        assert sorted(rows) == ["alice", "bob"]
        statuses = js(
            page, f"[...document.querySelectorAll('#status-{code} tbody tr')].map(r => r.dataset.status)"
        )
        assert statuses == ["pending", "approved", "held", "reversed", "void", "paid"]
        assert js(page, f"document.querySelectorAll('#checks-{code} tbody tr.bad').length") == 0
    assert js(page, "document.querySelectorAll('#summary tbody tr').length") == 29
    for field in ("held", "void"):  # issue 49: shown apart from commissions (none this month)
        cell = f"document.querySelector('#summary tr[data-field={field}] td[data-currency=usd]')"
        assert js(page, f"{cell}.textContent") == "0.00 USD", field
    assert (
        js(
            page,
            "document.querySelector('#summary tr[data-field=gross_sales] td[data-currency=usd]').textContent",
        )
        == "357.00 USD"
    )
    assert (
        js(
            page,
            "document.querySelector('#summary tr[data-field=refunds] td[data-currency=usd]').textContent",
        )
        == "50.00 USD"
    )
    assert js(page, "document.querySelector('#unattributed-usd tbody tr td.num').textContent") == "1"
    assert "Reconciled" in js(page, "document.getElementById('reconciled').textContent")
    # where the figures come from: when, which reconcile run, whether the month is closed
    provenance = js(page, "document.getElementById('report-provenance').textContent")
    assert "Generated" in provenance and "Month open" in provenance
    assert js(page, "document.getElementById('report-run-id').textContent").startswith("rcr_")
    assert js(page, "document.querySelector('#report-provenance time').title").endswith("Z")
    held = "document.querySelector('#status-usd tr[data-status=held] .code-label')"
    assert js(page, f"{held}.textContent") == "Held" and js(page, f"{held}.title") == "held"
    # the report's stylesheet applies (the page's hashed <style>, or the dashboard's finance.css)
    assert js(page, "getComputedStyle(document.querySelector('#status-usd th.num')).textAlign") == "right"
    fill = js(
        page,
        "getComputedStyle(document.querySelector('#chart-partners-usd svg path[fill=\"#2f5fb3\"]')).fill",
    )
    assert fill == "rgb(47, 95, 179)"


@pytest.mark.browser
def test_standalone_html_report_renders_its_charts_under_its_csp(
    reported: Reported, page: Page, tmp_path: Path
) -> None:
    log_in(page, reported)
    page.navigate(reported.export_html)
    assert js(page, "document.contentType") == "text/html"
    assert js(page, "document.title").startswith(f"Finance report {PERIOD}")
    assert_report_in_dom(page)
    # the page's one <style> element was allowed by its hash: the table styles apply
    assert js(page, "getComputedStyle(document.querySelector('#summary')).borderCollapse") == "collapse"
    chart = element_png(page, "#chart-partners-usd")
    assert colour_share(chart, BAR_BLUE) > 0.05  # the bars are drawn, in their colour
    status = element_png(page, "#chart-status-eur")
    assert len(colours(status)) > 20  # bars, labels, axes: far from a blank image
    shot = page.screenshot(tmp_path / "report.png").read_bytes()
    assert shot.startswith(PNG_SIGNATURE) and len(shot) > 20_000
    width, height = struct.unpack(">II", shot[16:24])
    assert width >= 1000 and height >= 700


@pytest.mark.browser
def test_dashboard_finance_tab_shows_the_report_with_its_charts(
    reported: Reported, page: Page, tmp_path: Path
) -> None:
    log_in(page, reported)
    page.navigate(reported.finance_page)
    assert js(page, "document.querySelector('nav.tabs a.current').textContent") == "Finance"
    assert_report_in_dom(page)
    chart = element_png(page, "#chart-partners-eur")
    assert colour_share(chart, BAR_BLUE) > 0.05
    links = js(page, "[...document.querySelectorAll('#downloads a')].map(a => a.getAttribute('href'))")
    assert [link.rsplit("format=", 1)[1] for link in links] == ["csv", "xlsx", "html"]
    shot = page.screenshot(tmp_path / "finance-tab.png").read_bytes()
    assert shot.startswith(PNG_SIGNATURE) and len(shot) > 20_000
