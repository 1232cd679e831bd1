"""Every dashboard page and the html report in real headless Chromium, at phone width (390 px)
and printed on A4: the page never scrolls sideways (wide tables scroll inside their own box), and
in print no table runs past the paper's edge."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest

from tests.browser.cdp import Page
from tests.conftest import OP, LiveServer, bearer, make_world

PHONE = 390
A4_CONTENT = 703  # 210 mm less the 12 mm margins each side, at 96 px per inch
LONG_TXN = "in_0_an_invoice_identifier_long_enough_to_need_wrapping_somewhere"
LONG_PARTNER = "a-partner-code-of-quite-some-length"
OVERFLOW = (
    "({scroll: document.scrollingElement.scrollWidth, inner: window.innerWidth,"
    " client: document.documentElement.clientWidth})"
)
# Elements (other than the contents of a box that scrolls on its own) sticking out of the page.
STICKING_OUT = """[...document.querySelectorAll('body *')]
  .filter(el => !el.closest('.scroll, .table-scroll'))
  .filter(el => el.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
  .map(el => el.tagName + (el.id ? '#' + el.id : '') + (el.className ? '.' + el.className : ''))"""
SCROLLING_BOXES = """[...document.querySelectorAll('.scroll, .table-scroll')]
  .filter(box => box.scrollWidth > box.clientWidth).length"""
# In print nothing scrolls: any table wider than the paper would be cut.
CUT_IN_PRINT = """[...document.querySelectorAll('table')]
  .filter(t => t.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
  .map(t => t.id)"""


@dataclass
class Shop:
    server: LiveServer
    program_id: str
    owner_token: str

    def url(self, suffix: str = "") -> str:
        return f"{self.server.url}/dashboard/programs/{self.program_id}{suffix}"


@pytest.fixture
def shop(live_server: LiveServer) -> Shop:
    """Sales in usd, eur and kwd by two partners (one with a long code), long transaction ids, a
    refund, an unattributed sale and a refused call; reconciled."""
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        world = make_world(http)  # type: ignore[arg-type]  # an httpx.Client speaks like a TestClient
        partner = {"code": LONG_PARTNER, "name": "A partner with a long name"}
        r = http.post(
            f"/api/v1/programs/{world.program_id}/partners", json=partner, headers=bearer(world.account_token)
        )
        assert r.status_code == 201, r.text
        sales = [
            ("alice", 10_000, "usd"),
            (LONG_PARTNER, 2_500_000, "usd"),
            ("alice", 4_000, "eur"),
            (LONG_PARTNER, 12_345, "kwd"),
        ]
        for n, (code, amount, currency) in enumerate(sales):
            click = http.post(
                "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": code}
            )
            sale = {
                "transaction_id": LONG_TXN.replace("0", str(n), 1),
                "customer_external_id": f"cust_{n}",
                "amount": amount,
                "currency": currency,
                "click_id": click.json()["data"]["click_id"],
                "occurred_at": f"2026-01-{n + 2:02d}T10:00:00Z",
            }
            assert http.post("/api/v1/track/sale", json=sale, headers=world.key).status_code == 200
        lone = {
            "transaction_id": "in_x",
            "customer_external_id": "cust_x",
            "amount": 700,
            "occurred_at": "2026-01-05T00:00:00Z",
        }
        assert http.post("/api/v1/track/sale", json=lone, headers=world.key).status_code == 200
        refund = {"transaction_id": LONG_TXN.replace("0", "1", 1), "refund_id": "re_1", "amount": 5_000}
        assert http.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
        assert http.post("/api/v1/track/sale", json={"amount": 5}, headers=world.key).status_code == 422
        assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    return Shop(live_server, world.program_id, world.account_token)


def width(page: Page, pixels: int) -> None:
    page.send(
        "Emulation.setDeviceMetricsOverride", width=pixels, height=900, deviceScaleFactor=1, mobile=False
    )


def log_in(page: Page, shop: Shop) -> None:
    page.navigate(f"{shop.server.url}/dashboard/login")
    page.evaluate(f"document.getElementById('token').value = {json.dumps(shop.owner_token)}")
    page.events.clear()
    page.evaluate("document.querySelector('#login-form button[type=submit]').click()")
    page.wait_for("Page.loadEventFired")
    assert page.evaluate("location.pathname") == "/dashboard"


def pages(shop: Shop) -> list[tuple[str, str]]:
    txn = LONG_TXN.replace("0", "1", 1)
    return [
        ("programs", f"{shop.server.url}/dashboard"),
        ("settings", shop.url()),
        ("confirm regenerate", shop.url("/api-key")),
        ("tracking log", shop.url("/log")),
        ("sales", shop.url("/sales")),
        ("explain", shop.url(f"/sales/{txn}")),
        ("explain unattributed", shop.url("/sales/in_x")),
        ("finance tab", shop.url("/finance?period=2026-01")),
        ("html report", shop.url("/finance/export?period=2026-01&format=html")),
        ("payouts tab", shop.url("/payouts")),
        ("error page", shop.url("/sales/in_nope")),
    ]


@pytest.mark.browser
def test_no_page_scrolls_sideways_at_phone_width(shop: Shop, page: Page) -> None:
    width(page, PHONE)
    page.navigate(f"{shop.server.url}/dashboard/login")
    seen = {"login": page.evaluate(OVERFLOW)}
    log_in(page, shop)
    wide_tables = 0
    for name, url in pages(shop):
        page.navigate(url)
        assert page.evaluate("document.body.textContent.length") > 100, name
        seen[name] = page.evaluate(OVERFLOW)
        assert page.evaluate(STICKING_OUT) == [], name
        # the wide tables are there, and scroll inside their own box
        wide_tables += page.evaluate(SCROLLING_BOXES)
    for name, found in seen.items():
        assert found["inner"] == PHONE, name
        assert found["scroll"] <= found["inner"], (name, found)
    assert wide_tables >= 4  # sales, log, ladder, the report's partner tables: too wide for a phone


@pytest.mark.browser
def test_finance_pages_print_on_a4_without_cut_columns(shop: Shop, page: Page) -> None:
    log_in(page, shop)
    width(page, A4_CONTENT)
    page.send("Emulation.setEmulatedMedia", media="print")
    try:
        for name, url in pages(shop):
            page.navigate(url)
            assert page.evaluate(CUT_IN_PRINT) == [], name
            assert page.evaluate(OVERFLOW)["scroll"] <= A4_CONTENT, name
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") in (
                "rgb(255, 255, 255)",
                "rgba(0, 0, 0, 0)",
            ), name
        page.navigate(shop.url("/sales"))
        assert page.evaluate("getComputedStyle(document.querySelector('header.top')).display") == "none"
        pdf = page.send("Page.printToPDF", preferCSSPageSize=True)["data"]
        assert len(pdf) > 1000
    finally:
        page.send("Emulation.setEmulatedMedia", media="")


@pytest.mark.browser
def test_three_decimal_currencies_show_their_three_decimals(shop: Shop, page: Page) -> None:
    """Money has one formatter (reports/money.py) on every page: 12.345 KWD (its minor unit is a
    thousandth) is never shown as 123.45 KWD, in the sales list, the explain view and the
    finance tab, as Chromium renders them."""
    log_in(page, shop)
    kwd_sale = LONG_TXN.replace("0", "3", 1)
    page.navigate(shop.url("/sales"))
    cells = page.evaluate(
        "[...document.querySelectorAll('tr')].filter(tr => tr.textContent.includes('KWD'))"
        ".map(tr => [...tr.querySelectorAll('td.num')].map(td => td.innerText))"
    )
    # amount, commission (30 %, with its status below it), platform fee (none), refunded: every
    # one with three decimals
    assert cells == [["12.345 KWD", "3.704 KWD\nApproved", "0.000 KWD", "0.000 KWD"]]
    page.navigate(shop.url(f"/sales/{kwd_sale}"))
    assert "12.345 KWD" in page.evaluate("document.body.innerText")
    page.navigate(shop.url("/finance?period=2026-01"))
    gross = page.evaluate(
        "document.querySelector('tr[data-field=gross_sales] td[data-currency=kwd]').innerText"
    )
    assert gross == "12.345 KWD"
