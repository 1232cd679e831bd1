"""The first hour's pages in real headless Chromium against a live server, each at phone width
(390 px, a mobile window that lays out by the page's viewport tag) and at 1280 px: the front
door, the integration checklist and its copy buttons, explain before a reconcile run, an empty
month, the tracking log, the payouts tab, the error reference, the sales filters and their CSV,
and the demo brand page whose `?aff=` click lands in the tracking log. Every page fits its
window: it never scrolls sideways and nothing sticks out of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.browser.cdp import Page
from tests.browser.measure import (
    DESKTOP,
    PHONE,
    WIDTHS,
    assert_fits,
    click_and_wait,
    log_in,
    text_of,
    visible_within,
    window,
)
from tests.conftest import OP, LiveServer, bearer, make_world, start_server
from tests.helpers import payee

LONG_PARTNER = "a-partner-code-of-quite-some-length"
LONG_REQUEST_ID = "req-" + "0123456789abcdef" * 4  # a sane client id, echoed and logged


@dataclass
class Site:
    """A live tally with a busy program (sales in three currencies by two partners, a paid-out
    January, approved February lines due, a refused call, a sale not reconciled yet) and an
    empty program of the same owner."""

    server: LiveServer
    owner_token: str
    program_id: str
    empty_program_id: str

    @property
    def url(self) -> str:
        return self.server.url

    def program(self, suffix: str = "", program_id: str | None = None) -> str:
        return f"{self.server.url}/dashboard/programs/{program_id or self.program_id}{suffix}"


def _sale(
    http: httpx.Client, key: dict[str, str], pid: str, n: int, code: str, amount: int, cur: str, day: str
) -> None:
    click = http.post("/api/v1/track/click", json={"program_id": pid, "partner_code": code})
    assert click.status_code == 201, click.text
    sale = {
        "transaction_id": f"in_{n}",
        "customer_external_id": f"cust_{n}",
        "amount": amount,
        "currency": cur,
        "click_id": click.json()["data"]["click_id"],
        "occurred_at": f"{day}T10:00:00Z",
    }
    r = http.post("/api/v1/track/sale", json=sale, headers={**key, "X-Request-Id": f"{LONG_REQUEST_ID}-{n}"})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    server = start_server(tmp_path_factory.mktemp("pages") / "live.duckdb")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            world = make_world(http, holding_days=0, commission_bps=2500)  # type: ignore[arg-type]
            pid, owner = world.program_id, bearer(world.account_token)
            partner = {
                "code": LONG_PARTNER,
                "name": "A partner with a rather long name",
                "email": "long@p.test",
            }
            assert (
                http.post(f"/api/v1/programs/{pid}/partners", json=partner, headers=owner).status_code == 201
            )
            _sale(http, world.key, pid, 1, "alice", 10_000, "usd", "2026-01-05")
            _sale(http, world.key, pid, 2, LONG_PARTNER, 2_500_000, "usd", "2026-01-06")
            assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
            payee(world, "alice")  # a batch pays only partners with payout details (in their currency)
            payee(world, LONG_PARTNER)
            r = http.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": "2026-01-31"}, headers=owner)
            assert r.status_code == 201, r.text
            payee(world, "alice", currency="eur")  # February's lines: hers in eur, the long code's in kwd
            payee(world, LONG_PARTNER, method="wise", currency="kwd")
            _sale(http, world.key, pid, 3, "alice", 4_000, "eur", "2026-02-03")
            _sale(http, world.key, pid, 4, LONG_PARTNER, 12_345, "kwd", "2026-02-04")
            lone = {"transaction_id": "in_5", "customer_external_id": "nobody", "amount": 700}
            assert (
                http.post(
                    "/api/v1/track/sale",
                    json={**lone, "occurred_at": "2026-02-05T00:00:00Z"},
                    headers=world.key,
                ).status_code
                == 200
            )
            assert http.post("/api/v1/track/sale", json={"amount": 5}, headers=world.key).status_code == 422
            assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
            fresh = {"transaction_id": "in_fresh", "customer_external_id": "cust_1", "amount": 1_500}
            assert http.post("/api/v1/track/sale", json=fresh, headers=world.key).status_code == 200
            r = http.post(
                "/api/v1/programs",
                json={"workspace_id": world.workspace_id, "name": "Empty program"},
                headers=owner,
            )
            assert r.status_code == 201, r.text
            empty = r.json()["data"]["program_id"]
        yield Site(server, world.account_token, pid, empty)
    finally:
        server.stop()


CSP_PROBE = """window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"""


@pytest.fixture
def owner_page(site: Site, page: Page) -> Page:
    """The owner, logged in; every page it opens records what its Content-Security-Policy blocked."""
    page.send("Page.addScriptToEvaluateOnNewDocument", source=CSP_PROBE)
    log_in(page, site.url, site.owner_token)
    return page


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_the_root_goes_on_to_the_dashboard_sign_in(site: Site, page: Page, pixels: int) -> None:
    window(page, pixels)
    page.navigate(site.url + "/")
    assert page.evaluate("location.pathname") == "/dashboard/login"
    assert page.evaluate("document.getElementById('token') !== null")
    assert_fits(page, pixels, "sign-in")
    log_in(page, site.url, site.owner_token)
    page.navigate(site.url + "/")
    assert page.evaluate("location.pathname") == "/dashboard"  # with a session: the programs
    assert_fits(page, pixels, "programs")


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_the_checklist_shows_how_and_copies_each_snippet(site: Site, owner_page: Page, pixels: int) -> None:
    page = owner_page
    window(page, pixels)
    page.navigate(site.program())
    assert_fits(page, pixels, "settings with the checklist")
    # steps to do are open, each with its snippets; the copy buttons show once the script ran
    open_steps = page.evaluate("[...document.querySelectorAll('details.howto[open]')].map(d => d.id)")
    to_do = page.evaluate("[...document.querySelectorAll('li.todo')].map(li => 'howto-' + li.dataset.step)")
    assert open_steps == to_do and "howto-processor_event_received" in to_do  # steps done are folded
    assert "howto-click_received" not in to_do  # this program has had clicks
    page.evaluate("document.querySelectorAll('details.howto').forEach(d => { d.open = true; })")
    assert_fits(page, pixels, "every step open")
    tag = text_of(page, "#snippet-script-tag")
    assert (
        tag == f'<script src="{site.url}/sdk/v1/tally.js" data-program-id="{site.program_id}" defer></script>'
    )
    assert text_of(page, "#snippet-webhook-url") == f"{site.url}/webhooks/stripe"
    assert "Bearer $SERVICE_API_KEY" in text_of(page, "#snippet-sale")
    hidden = page.evaluate(
        "[...document.querySelectorAll('button.copy')].filter(b => b.hidden || !b.offsetWidth).length"
    )
    assert hidden == 0
    # every snippet and its button inside the window
    assert visible_within(page, "details.howto[open] .snippet pre, details.howto[open] button.copy") == []
    # a click copies the snippet's text exactly (the clipboard call is watched, not the OS clipboard)
    page.evaluate(
        "window.__copied = [];"
        " navigator.clipboard.writeText = t => (window.__copied.push(t), Promise.resolve())"
    )
    for snippet in ("snippet-script-tag", "snippet-webhook-url", "snippet-sale"):
        page.evaluate(f"document.querySelector('button[data-copy={snippet}]').click()")
        page.wait_until(f"document.querySelector('button[data-copy={snippet}]').dataset.copied === 'yes'")
        assert text_of(page, f"button[data-copy={snippet}]") == "Copied"
    copied = page.evaluate("window.__copied")
    assert copied == [tag, f"{site.url}/webhooks/stripe", text_of(page, "#snippet-sale")]
    assert "\n" in copied[2] and copied[2].startswith(f"curl -X POST {site.url}/api/v1/track/sale")
    assert page.evaluate("window.__csp") == []  # our one script ran under the page's policy


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_explain_says_a_fresh_sale_is_not_reconciled_yet(site: Site, owner_page: Page, pixels: int) -> None:
    page = owner_page
    window(page, pixels)
    page.navigate(site.program("/sales/in_fresh"))
    assert "Recorded, not reconciled yet" in text_of(page, "#not-reconciled-yet")
    assert "tally reconcile" in text_of(page, "#explain-hint")
    assert_fits(page, pixels, "explain, not reconciled")
    page.navigate(site.program("/sales/in_never"))
    assert "No such sale" in text_of(page, "#sale-unknown")
    assert_fits(page, pixels, "explain, unknown")


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_an_empty_month_is_honest(site: Site, owner_page: Page, pixels: int) -> None:
    page = owner_page
    window(page, pixels)
    page.navigate(site.program("/finance?period=2026-01", site.empty_program_id))
    assert text_of(page, "#reconciled") is None  # no green "Reconciled (0 checks pass)"
    assert "nothing to" in text_of(page, "#no-activity")
    assert "before this program existed" in text_of(page, "#before-program")
    assert (
        page.evaluate("getComputedStyle(document.getElementById('no-activity')).color") != "rgb(27, 94, 32)"
    )
    assert_fits(page, pixels, "empty month")
    page.navigate(site.program("/finance?period=2026-01"))
    assert "Reconciled" in text_of(page, "#reconciled")  # a month with sales still says so


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_the_tracking_log_shows_every_column_and_money_in_units(
    site: Site, owner_page: Page, pixels: int
) -> None:
    page = owner_page
    window(page, pixels)
    page.navigate(site.program("/log"))
    assert_fits(page, pixels, "tracking log")
    details = page.evaluate("[...document.querySelectorAll('#log td.detail')].map(td => td.textContent)")
    assert "sale in_1 100.00 USD" in details and "sale in_4 12.345 KWD" in details
    assert not any(d.endswith((" usd", " kwd")) for d in details)
    ids = page.evaluate(
        "[...document.querySelectorAll('#log td.request-id')].map(td => td.textContent.trim())"
    )
    assert f"{LONG_REQUEST_ID}-1" in ids
    if pixels == DESKTOP:  # every column in view: the table needs no scrolling at all
        box = page.evaluate(
            "(() => { const b = document.querySelector('#log').closest('.scroll');"
            " return {scroll: b.scrollWidth, client: b.clientWidth}; })()"
        )
        assert box["scroll"] <= box["client"], box
        assert visible_within(page, "#log td.request-id code") == []


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_payouts_name_people_show_the_money_and_refuse_an_empty_batch(
    site: Site, owner_page: Page, pixels: int
) -> None:
    page = owner_page
    window(page, pixels)
    page.navigate(site.program("/payouts"))
    assert_fits(page, pixels, "payouts")
    # what each row pays is on screen without scrolling anything sideways
    pays = page.evaluate("[...document.querySelectorAll('td.pays')].map(td => td.textContent.trim())")
    # due now (February, 25 %): 10.00 EUR; January's batch: 25.00 and 6,250.00 USD
    assert {"10.00 EUR", "25.00 USD", "6,250.00 USD"} <= set(pays)
    # 3.086 KWD is approved and unpaid, but no payout service sends KWD: a batch would not pay it
    kwd = "[...document.querySelectorAll('#due tr[data-currency=kwd] td')].map(td => td.textContent.trim())"
    assert "3.086 KWD" in page.evaluate(kwd)
    assert visible_within(page, "td.pays") == []
    if pixels == PHONE:  # rows are cards: no table scrolls sideways
        scrolling = "[...document.querySelectorAll('.scroll')].filter(b => b.scrollWidth > b.clientWidth + 1)"
        assert page.evaluate(scrolling + ".length") == 0
    names = page.evaluate("[...document.querySelectorAll('td.partner strong')].map(s => s.textContent)")
    assert "Alice" in names and "A partner with a rather long name" in names
    made_by = page.evaluate("document.querySelector('section.batch .person')?.textContent")
    assert made_by == "owner@brand.test"
    assert "acc_" not in page.evaluate("document.querySelector('section.batch p.hint').textContent")
    assert page.evaluate("document.getElementById('make-batch-button').disabled") is False
    page.navigate(site.program("/payouts", site.empty_program_id))
    assert page.evaluate("document.getElementById('make-batch-button').disabled") is True
    assert "Nothing is reconciled yet" in text_of(page, "#batch-refusal") or "Nothing is due" in text_of(
        page, "#batch-refusal"
    )
    assert_fits(page, pixels, "payouts, nothing due")


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_the_error_reference_fits_a_phone_and_says_how_to_fix(site: Site, page: Page, pixels: int) -> None:
    window(page, pixels)
    page.navigate(site.url + "/docs/errors#sale_not_found")
    assert_fits(page, pixels, "/docs/errors")  # 390 wide on a phone, not 980
    sections = page.evaluate(
        "[...document.querySelectorAll('section.code')]"
        ".map(s => [s.id, s.querySelector('.fix')?.textContent ?? ''])"
    )
    assert len(sections) >= 30
    assert [sid for sid, fix in sections if not fix.startswith("How to fix:") or len(fix) < 40] == []
    font = page.evaluate("parseFloat(getComputedStyle(document.querySelector('section.code p')).fontSize)")
    assert font >= 14  # readable without zooming


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_sales_filter_by_date_partner_and_currency_and_download_the_csv(
    site: Site, owner_page: Page, pixels: int
) -> None:
    page = owner_page
    window(page, pixels)
    page.navigate(site.program("/sales"))
    assert_fits(page, pixels, "sales")
    shown = (
        "[...document.querySelectorAll('#sales tbody tr td:nth-child(2)')].map(td => td.textContent.trim())"
    )
    assert page.evaluate(shown) == ["in_1", "in_2", "in_3", "in_4", "in_5"]
    page.evaluate(
        f"""document.getElementById('f-from').value = '2026-01-06';
            document.getElementById('f-to').value = '2026-02-28';
            document.getElementById('f-partner').value = {json.dumps(LONG_PARTNER)};
            document.getElementById('f-currency').value = 'usd';"""
    )
    click_and_wait(page, "#sale-filters button[type=submit]")
    assert page.evaluate(shown) == ["in_2"]
    assert page.evaluate("document.getElementById('f-partner').value") == LONG_PARTNER  # kept
    assert_fits(page, pixels, "sales, filtered")
    href = page.evaluate("document.getElementById('download-csv').href")
    assert "format=csv" in href and "currency=usd" in href and f"partner_code={LONG_PARTNER}" in href
    status, kind, first = page.evaluate(
        "fetch(document.getElementById('download-csv').href).then(async r => [r.status,"
        " r.headers.get('content-type'), new Uint8Array(await r.arrayBuffer()).slice(0, 3).join(',')])"
    )
    assert (status, kind, first) == (200, "text/csv; charset=utf-8", "239,187,191")  # a BOM
    text = page.evaluate("fetch(document.getElementById('download-csv').href).then(r => r.text())")
    lines = text.lstrip("\ufeff").splitlines()
    assert len(lines) == 2 and lines[0].startswith("sale_id,transaction_id,")
    assert ",in_2," in lines[1] and ",2500000," in lines[1] and ",25000.00," in lines[1]


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_the_demo_page_records_a_click_and_a_sign_up_that_land_in_the_log(
    site: Site, owner_page: Page, pixels: int, tmp_path: Path
) -> None:
    page = owner_page
    window(page, pixels)
    page.send("Network.deleteCookies", name="svc_click_id", url=site.url)
    page.navigate(f"{site.url}/demo/shop?program_id={site.program_id}&aff=alice")
    state = page.wait_until(
        "(s => s !== 'waiting' && s)(document.getElementById('click-status').dataset.state)"
    )
    assert state == "recorded", text_of(page, "#click-status")
    cookie = next(c for c in page.cookies(site.url) if c["name"] == "svc_click_id")
    assert cookie["value"].startswith("clk_") and cookie["value"] in text_of(page, "#click-status")
    assert_fits(page, pixels, "demo page")
    assert page.evaluate("window.__csp") == []
    user = f"demo_user_{pixels}"
    page.evaluate(f"document.getElementById('user-id').value = {json.dumps(user)}")
    page.evaluate("document.getElementById('signup-button').click()")
    lead_state = page.wait_until(
        "(s => s !== 'sending' && s)(document.getElementById('lead-status').dataset.state)"
    )
    assert lead_state == "recorded", text_of(page, "#lead-status")
    assert "with the click" in text_of(page, "#lead-status")
    page.screenshot(tmp_path / f"demo-{pixels}.png")
    # the click and the lead are in the program's tracking log
    click_and_wait(page, "#log-link")
    details = page.evaluate("[...document.querySelectorAll('#log td.detail')].map(td => td.textContent)")
    assert f"click {cookie['value']} for alice" in details
    assert any(user in d and "browser lead" in d for d in details), details
