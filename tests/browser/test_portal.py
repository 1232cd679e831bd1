"""The partners' portal in real headless Chromium against a live server (CONTRACT 14): the
one-time sign-in link, each portal page at phone width (390 px) and at 1280 px (it never scrolls
sideways, nothing sticks out, the copy buttons work), a partner trying other partners' pages and
ids (404, nothing of theirs shown), and the payout-details form with its CSRF token."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.browser.cdp import Page
from tests.browser.measure import WIDTHS, assert_fits, click_and_wait, text_of, window
from tests.conftest import OP, LiveServer, bearer, make_world, start_server
from tests.helpers import payee

LONG_PARTNER = "a-partner-code-of-quite-some-length"
SIGN_IN = re.compile(r"/partner/sign-in/(ptl_[A-Za-z0-9]+)$")
THIEF = "payout_method=paypal&payout_email=thief%40evil.test&payout_name=Thief&payout_currency=USD"


@dataclass
class Brand:
    """A live tally: program "Brand partners" (site https://brand.test) where alice and a partner
    with a long code each referred sales (usd and kwd), a paid batch, a held sale and a refund;
    a second program of the brand where alice (same email) is `alice2`, one where she is not,
    and a program of another brand."""

    server: LiveServer
    owner: dict[str, str]
    program_id: str
    second_program: str
    without_alice: str
    foreign_program: str
    long_payout: str

    @property
    def url(self) -> str:
        return self.server.url

    def link(self, code: str, program_id: str | None = None) -> str:
        r = httpx.post(
            f"{self.url}/api/v1/programs/{program_id or self.program_id}/partners/{code}/portal-link",
            headers=self.owner,
            timeout=10,
        )
        assert r.status_code == 201, r.text
        url: str = r.json()["data"]["url"]
        assert SIGN_IN.search(url) and url.startswith(self.url)
        return url


def _sale(
    http: httpx.Client, key: dict[str, str], pid: str, tx: str, code: str, amount: int, cur: str
) -> None:
    click = http.post("/api/v1/track/click", json={"program_id": pid, "partner_code": code})
    lead = {
        "customer_external_id": f"key_{tx}",
        "click_id": click.json()["data"]["click_id"],
        "email": f"{tx}@shop.test",
    }
    assert http.post("/api/v1/track/lead", json=lead, headers=key).status_code == 200
    sale = {"transaction_id": tx, "customer_external_id": f"key_{tx}", "amount": amount, "currency": cur}
    assert http.post("/api/v1/track/sale", json=sale, headers=key).status_code == 200


@pytest.fixture(scope="module")
def brand(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brand]:
    server = start_server(tmp_path_factory.mktemp("portal") / "live.duckdb")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            world = make_world(http, holding_days=0, website_url="https://brand.test/")  # type: ignore[arg-type]
            pid, owner = world.program_id, bearer(world.account_token)
            long = {"code": LONG_PARTNER, "name": "A partner with a rather long name", "email": "long@p.test"}
            assert http.post(f"/api/v1/programs/{pid}/partners", json=long, headers=owner).status_code == 201
            http.post(
                f"/api/v1/programs/{pid}/partners/alice/promo-codes", json={"code": "ALICE10"}, headers=owner
            )
            for n, (code, amount, cur) in enumerate(
                [("alice", 10_000, "usd"), ("alice", 4_000, "kwd"), (LONG_PARTNER, 2_500_000, "usd")]
            ):
                _sale(http, world.key, pid, f"tx_{n}", code, amount, cur)
            assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
            r = http.post(
                f"/api/v1/programs/{pid}/commissions/tx_1/hold", json={"reason": "fraud check"}, headers=owner
            )
            assert r.status_code == 200, r.text
            payee(world, "alice")  # a batch pays only partners with payout details (in their currency)
            payee(world, LONG_PARTNER)
            batch = http.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": "9999-12-31"}, headers=owner)
            assert batch.status_code == 201, batch.text

            def program(name: str, workspace: str = world.workspace_id, auth: dict[str, str] = owner) -> str:
                r = http.post(
                    "/api/v1/programs", json={"workspace_id": workspace, "name": name}, headers=auth
                )
                assert r.status_code == 201, r.text
                return str(r.json()["data"]["program_id"])

            second, without = program("Brand wholesale"), program("Brand without alice")
            for pid_, body in (
                (second, {"code": "alice2", "name": "Alice", "email": "alice@partner.test"}),
                (without, {"code": "zed", "name": "Zed", "email": "zed@partner.test"}),
            ):
                assert (
                    http.post(f"/api/v1/programs/{pid_}/partners", json=body, headers=owner).status_code
                    == 201
                )
            other = http.post(
                "/api/v1/operator/accounts",
                json={"email": "o@other.test", "workspace_name": "Other"},
                headers=OP,
            ).json()["data"]
            foreign = program("Another brand", other["workspace_id"], bearer(other["token"]))
            # a batch of the long partner's eur line only: alice has nothing in it
            _sale(http, world.key, pid, "tx_long_only", LONG_PARTNER, 1_000, "eur")
            payee(world, LONG_PARTNER, currency="eur")
            long_batch = http.post(
                f"/api/v1/programs/{pid}/payouts", json={"up_to": "9999-12-31"}, headers=owner
            )
            assert long_batch.status_code == 201, long_batch.text
            assert [r["partner_code"] for r in long_batch.json()["data"]["rows"]] == [LONG_PARTNER]
            refund = {"transaction_id": "tx_0", "refund_id": "re_0", "amount": 2_000}  # after payment
            assert http.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
            assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        yield Brand(server, owner, pid, second, without, foreign, long_batch.json()["data"]["payout_id"])
    finally:
        server.stop()


def sign_in(page: Page, url: str) -> None:
    page.navigate(url)
    assert text_of(page, "h1") == "Sign in to your partner dashboard"
    click_and_wait(page, "#sign-in")


@pytest.mark.browser
def test_the_sign_in_link_signs_in_once(brand: Brand, page: Page) -> None:
    url = brand.link("alice")
    page.navigate(url)
    page.navigate(url)  # opening the page again (a mail scanner, a second look) uses nothing up
    click_and_wait(page, "#sign-in")
    assert page.evaluate("location.pathname") == f"/partner/programs/{brand.program_id}"
    assert "Alice" in text_of(page, "#partner-identity")
    (cookie,) = [c for c in page.cookies(brand.url + "/partner") if c["name"] == "tally_partner"]
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Lax" and cookie["path"] == "/partner"
    assert "tally_partner" not in page.evaluate("document.cookie")
    page.send("Network.clearBrowserCookies")
    sign_in(page, url)  # the second use: refused, and no session
    assert text_of(page, "#error-code") == "not_found" and "used already or has expired" in text_of(
        page, "main"
    )
    page.navigate(f"{brand.url}/partner/programs/{brand.program_id}")
    assert page.evaluate("location.pathname") == "/partner" and text_of(page, "#signed-out") is not None


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_every_portal_page_fits_the_phone_and_the_desktop(brand: Brand, page: Page, pixels: int) -> None:
    window(page, pixels)
    sign_in(page, brand.link(LONG_PARTNER))
    base = f"{brand.url}/partner/programs/{brand.program_id}"
    pages = {
        "programs": f"{brand.url}/partner",
        "overview": base,
        "link builder": f"{base}?page="
        + "https://brand.test/a/rather/long/path/to/a/product/page?variant=blue%26size=xl",
        "commissions": f"{base}/commissions",
        "payouts": f"{base}/payouts",
        "payout details": f"{base}/payout-details",
    }
    for name, url in pages.items():
        page.navigate(url)
        assert page.evaluate("document.body.textContent.length") > 100, name
        assert_fits(page, pixels, name)
    page.navigate(pages["link builder"])
    built = text_of(page, "#built-link")
    assert built.startswith("https://brand.test/a/rather/long/path") and built.endswith(f"aff={LONG_PARTNER}")
    assert page.evaluate("[...document.querySelectorAll('button.copy')].filter(b => b.hidden).length") == 0
    page.evaluate(
        "window.__copied = [];"
        " navigator.clipboard.writeText = t => (window.__copied.push(t), Promise.resolve())"
    )
    page.evaluate("document.querySelector('button[data-copy=built-link]').click()")
    page.wait_until("window.__copied.length === 1")
    assert page.evaluate("window.__copied") == [built]
    chart = page.evaluate(
        "(() => { const r = document.querySelector('#activity-chart svg').getBoundingClientRect();"
        " return [r.width > 100, r.right <= document.documentElement.clientWidth + 1]; })()"
    )
    assert chart == [True, True]


@pytest.mark.browser
@pytest.mark.parametrize("pixels", WIDTHS)
def test_alice_sees_her_programs_and_lines_at_each_width(brand: Brand, page: Page, pixels: int) -> None:
    window(page, pixels)
    sign_in(page, brand.link("alice"))
    page.navigate(f"{brand.url}/partner")
    programs = page.evaluate("[...document.querySelectorAll('#programs a')].map(a => a.textContent)")
    assert programs == ["Brand partners", "Brand wholesale"]
    assert_fits(page, pixels, "programs")
    page.navigate(f"{brand.url}/partner/programs/{brand.program_id}")
    assert text_of(page, "#referral-link") == "https://brand.test/?aff=alice"
    assert text_of(page, "#promo-1") == "ALICE10"
    page.navigate(f"{brand.url}/partner/programs/{brand.program_id}/commissions")
    reasons = page.evaluate("[...document.querySelectorAll('#lines td.why')].map(td => td.innerText)")
    assert any(r.startswith("Held by the brand: fraud check") for r in reasons)
    assert any(r.startswith("Clawback:") for r in reasons)
    assert_fits(page, pixels, "commissions")


@pytest.mark.browser
def test_a_partner_trying_other_partners_urls_and_ids_gets_404_and_nothing_of_them(
    brand: Brand, page: Page
) -> None:
    sign_in(page, brand.link("alice"))
    tried = {
        "another brand's program": f"/partner/programs/{brand.foreign_program}",
        "a program without her": f"/partner/programs/{brand.without_alice}/commissions",
        "its payouts": f"/partner/programs/{brand.without_alice}/payouts?format=csv",
        "its payout details": f"/partner/programs/{brand.without_alice}/payout-details",
        "a batch with none of her lines": f"/partner/programs/{brand.program_id}/payouts/{brand.long_payout}",
        "a made-up batch": f"/partner/programs/{brand.program_id}/payouts/po_0000",
    }
    for what, path in tried.items():
        page.navigate(brand.url + path)
        assert text_of(page, "#error-code") == "not_found", what
        body = page.evaluate("document.body.innerText")
        for secret in ("Brand without alice", "Another brand", "Zed", LONG_PARTNER, "tx_long_only"):
            assert secret not in body, (what, secret)
    # the same paths fetched from her page: 404 too, and a POST to another program's form as well
    status = page.evaluate(f"fetch({json.dumps(tried['a program without her'])}).then(r => r.status)")
    assert status == 404
    page.navigate(f"{brand.url}/partner/programs/{brand.program_id}/commissions")
    text = page.evaluate("document.body.innerText")
    for secret in ("tx_2", LONG_PARTNER, "tx_0@shop.test", "key_tx_0", "long@p.test"):
        assert secret not in text, secret


@pytest.mark.browser
def test_the_payout_details_form_saves_and_a_post_without_its_token_is_refused(
    brand: Brand, page: Page
) -> None:
    sign_in(page, brand.link("alice"))
    path = f"/partner/programs/{brand.program_id}/payout-details"
    page.navigate(brand.url + path)
    page.evaluate(
        "document.getElementById('d-method').value = 'wise';"
        "document.getElementById('d-email').value = 'alice@wise.test';"
        "document.getElementById('d-name').value = 'Alice Example';"
        "document.getElementById('d-currency').value = 'EUR';"
    )
    click_and_wait(page, "#save-details")
    assert page.evaluate("location.search") == "?saved=1" and text_of(page, "#saved") is not None
    assert page.evaluate("document.getElementById('d-email').value") == "alice@wise.test"
    # a same-origin post without the form's CSRF token (what injected script could send): refused
    status, text = page.evaluate(
        f"""fetch({json.dumps(path)}, {{method: 'POST', credentials: 'same-origin',
              headers: {{'Content-Type': 'application/x-www-form-urlencoded'}},
              body: {json.dumps(THIEF)}}})
            .then(async r => [r.status, await r.text()])"""
    )
    assert status == 403 and "csrf_refused" in text
    partners = httpx.get(
        f"{brand.url}/api/v1/programs/{brand.program_id}/partners", headers=brand.owner
    ).json()
    alice = next(p for p in partners["data"] if p["code"] == "alice")
    assert (alice["payout_method"], alice["payout_email"], alice["payout_currency"]) == (
        "wise",
        "alice@wise.test",
        "eur",
    )
