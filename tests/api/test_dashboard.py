"""The dashboard through the real app: login and its cookie, CSRF on every form, owner-only key
regeneration that shows the new key once, partners, settings, tracking log, sales and explain."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import time_machine
from starlette.testclient import TestClient

from api.app import create_app
from api.forms import money_for_form
from api.settings import Settings, load_settings
from ingest.domain.tokens import mask
from tests.conftest import OP, OPERATOR_TOKEN, World, bearer, make_world
from tests.helpers import csrf_of, logged_in, login, program_path, settings_form

MASKED = re.compile(r'<code id="api-key-masked">([^<]+)</code>')
NEW_KEY = re.compile(r'<code id="new-api-key" class="secret">([^<]+)</code>')
TEST_SALE = {"additional_data": {"test_mode": True}}


def member_token(world: World, role: str = "member") -> str:
    return world.member(role)["Authorization"].removeprefix("Bearer ")


def set_cookie_headers(response: httpx.Response) -> list[str]:
    return response.headers.get_list("set-cookie")


# -- login, cookie, logout -----------------------------------------------------------------------
def test_login_with_an_account_token_sets_a_locked_down_session_cookie(world: World) -> None:
    client = world.client
    r = login(client, world.account_token)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    session = next(h for h in set_cookie_headers(r) if h.startswith("tally_session="))
    flags = [part.strip().lower() for part in session.split(";")]
    assert "httponly" in flags and "samesite=lax" in flags and "path=/dashboard" in flags
    assert "secure" not in flags  # TALLY_BASE_URL is http here
    assert "max-age=43200" in flags
    value = session.split(";", 1)[0].removeprefix("tally_session=")
    assert len(value) >= 40 and world.account_token not in session
    page = client.get("/dashboard")
    assert page.status_code == 200
    assert "Brand partners" in page.text and mask(world.api_key) in page.text
    assert world.account_token not in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_login_page_when_logged_in_goes_to_the_programs(world: World) -> None:
    logged_in(world.client, world.account_token)
    r = world.client.get("/dashboard/login", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/dashboard")


@pytest.mark.parametrize("kind", ["unknown", "program_key", "operator", "empty"])
def test_login_refuses_anything_but_an_account_token(world: World, kind: str) -> None:
    token = {
        "unknown": "acct_" + "x" * 40,
        "program_key": world.api_key,
        "operator": OPERATOR_TOKEN,
        "empty": "",
    }[kind]
    r = login(world.client, token)
    assert r.status_code == 401
    assert "not a valid account token" in r.text
    assert not any(h.startswith("tally_session=") for h in set_cookie_headers(r))
    if token:
        assert token not in r.text
    assert world.client.get("/dashboard", follow_redirects=False).status_code == 303


def test_login_csrf_is_refused_without_the_double_submit_cookie(world: World) -> None:
    token = csrf_of(world.client.get("/dashboard/login").text)
    world.client.cookies.clear()  # a browser that never loaded our login form, posting a seen token
    r = world.client.post(
        "/dashboard/login", data={"token": world.account_token, "csrf_token": token}, follow_redirects=False
    )
    assert r.status_code == 403 and "csrf_refused" in r.text
    assert not any(h.startswith("tally_session=") for h in set_cookie_headers(r))
    token = csrf_of(world.client.get("/dashboard/login").text)
    r = world.client.post(
        "/dashboard/login",
        data={"token": world.account_token, "csrf_token": "not-the-cookie-value-0123456789abcdef"},
        follow_redirects=False,
    )
    assert r.status_code == 403
    r = world.client.post(
        "/dashboard/login",
        data={"token": world.account_token, "csrf_token": token},
        headers={"Origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert r.status_code == 403 and "another site" in r.text
    assert login(world.client, world.account_token).status_code == 303  # the real form still works


def test_session_cookie_is_secure_when_the_base_url_is_https(tmp_path: Path) -> None:
    settings = load_settings(
        database=str(tmp_path / "s.duckdb"), operator_token=OPERATOR_TOKEN, base_url="https://tally.example"
    )
    with TestClient(create_app(settings), base_url="https://tally.example") as client:
        world = make_world(client)
        r = login(client, world.account_token)
        assert r.status_code == 303
        cookies = set_cookie_headers(r)
        assert all("secure" in [p.strip().lower() for p in h.split(";")] for h in cookies)


def test_logout_ends_the_session_server_side(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    stolen = world.client.cookies["tally_session"]
    refused = world.client.post("/dashboard/logout", data={}, follow_redirects=False)
    assert refused.status_code == 403  # logging out is a form like any other
    r = world.client.post("/dashboard/logout", data={"csrf_token": token}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/dashboard/login")
    assert any(h.startswith('tally_session=""') or "max-age=0" in h.lower() for h in set_cookie_headers(r))
    world.client.cookies.set("tally_session", stolen, path="/dashboard")  # replaying the old cookie
    again = world.client.get("/dashboard", follow_redirects=False)
    assert (again.status_code, again.headers["location"]) == (303, "/dashboard/login")


def test_a_restart_keeps_people_logged_in_and_logout_still_ends_it(settings: Settings) -> None:
    """Sessions live in the database: a new app on the same file (a restart) knows the cookie,
    with the same CSRF token; logging out there ends it, also for the next restart."""
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
        token = logged_in(client, world.account_token)
        cookie = client.cookies["tally_session"]
    with TestClient(create_app(settings)) as client:
        client.cookies.set("tally_session", cookie, path="/dashboard")
        page = client.get("/dashboard", follow_redirects=False)
        assert page.status_code == 200 and csrf_of(page.text) == token
        r = client.post("/dashboard/logout", data={"csrf_token": token}, follow_redirects=False)
        assert r.status_code == 303
    with TestClient(create_app(settings)) as client:
        client.cookies.set("tally_session", cookie, path="/dashboard")
        r = client.get("/dashboard", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/dashboard/login")


def test_sessions_expire_after_twelve_hours_on_the_server(world: World) -> None:
    with time_machine.travel(datetime.now(UTC), tick=True) as traveller:
        logged_in(world.client, world.account_token)
        kept = world.client.cookies["tally_session"]
        traveller.shift(timedelta(hours=11, minutes=59))
        assert world.client.get("/dashboard", follow_redirects=False).status_code == 200
        traveller.shift(timedelta(minutes=2))
        world.client.cookies.clear()
        world.client.cookies.set("tally_session", kept, path="/dashboard")  # a browser ignoring Max-Age
        r = world.client.get("/dashboard", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/dashboard/login")


@pytest.mark.parametrize("path", ["", "/log", "/sales", "/sales/in_1"])
def test_pages_without_a_session_redirect_to_login(world: World, path: str) -> None:
    r = world.client.get(program_path(world, path), follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/dashboard/login")
    assert world.client.get("/dashboard", follow_redirects=False).status_code == 303


def test_a_program_of_another_workspace_is_a_404_page(world: World) -> None:
    other = world.client.post(
        "/api/v1/operator/accounts", json={"email": "x@other.test", "workspace_name": "Other"}, headers=OP
    ).json()["data"]
    logged_in(world.client, other["token"])
    assert "Brand partners" not in world.client.get("/dashboard").text
    for path in ("", "/log", "/sales", "/sales/in_1"):
        r = world.client.get(program_path(world, path))
        assert r.status_code == 404 and "program_not_found" in r.text, path
        assert r.headers["content-type"].startswith("text/html")
    assert world.client.get("/dashboard/programs/prog_nope").status_code == 404


# -- the key: masked value, owner-only regenerate, shown once -------------------------------------
def masked_on_page(client: TestClient, world: World) -> str:
    found = MASKED.search(client.get(program_path(world)).text)
    assert found
    return found.group(1)


CONFIRM = {"confirm": "regenerate"}  # what the confirmation page's form adds


def regenerated(client: TestClient, world: World, token: str) -> httpx.Response:
    """Confirm on the confirmation page's form, follow its redirect: the page showing the key."""
    r = client.post(
        program_path(world, "/api-key"), data={"csrf_token": token, **CONFIRM}, follow_redirects=False
    )
    assert r.status_code == 303 and r.headers["location"] == program_path(world, "?key=new#api-key")
    return client.get(r.headers["location"])


def test_regenerate_shows_the_new_key_once_and_the_mask_follows_it(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world))
    assert 'id="regenerate-key"' in page.text and "Regenerate API key" in page.text
    assert masked_on_page(world.client, world) == mask(world.api_key)
    assert world.api_key not in page.text

    confirm = world.client.get(program_path(world, "/api-key"))  # the button's page: a question
    assert confirm.status_code == 200 and 'id="confirm-regenerate"' in confirm.text
    assert 'name="confirm" value="regenerate"' in confirm.text and NEW_KEY.search(confirm.text) is None
    assert world.sale(**TEST_SALE).status_code == 200  # asking changed nothing

    r = world.client.post(
        program_path(world, "/api-key"), data={"csrf_token": token, **CONFIRM}, follow_redirects=False
    )
    assert r.status_code == 303 and NEW_KEY.search(r.text) is None
    r = world.client.get(r.headers["location"])
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    found = NEW_KEY.search(r.text)
    assert found and "will not be shown again" in r.text
    new_key = found.group(1)
    assert new_key.startswith("aff_") and new_key != world.api_key
    assert MASKED.search(r.text).group(1) == mask(new_key)  # type: ignore[union-attr]

    reload = world.client.get(program_path(world, "?key=new"))  # a reload: no second key, none shown
    assert reload.status_code == 200 and NEW_KEY.search(reload.text) is None
    assert new_key not in reload.text and 'id="key-shown-once"' in reload.text
    assert MASKED.search(reload.text).group(1) == mask(new_key)  # type: ignore[union-attr]

    assert world.sale(**TEST_SALE).status_code == 401  # the old key stopped at once
    sale = world.client.post("/api/v1/track/sale", json=TEST_SALE, headers=bearer(new_key))
    assert sale.status_code == 200 and sale.json()["data"]["test_mode"] is True  # the reload kept it

    again = world.client.get(program_path(world))
    assert new_key not in again.text and 'id="new-api-key"' not in again.text
    assert masked_on_page(world.client, world) == mask(new_key)
    assert masked_on_page(world.client, world).endswith(new_key[-4:])
    api = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert api["api_token_masked"] == mask(new_key)


def test_a_post_without_the_confirmation_asks_first_and_changes_nothing(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    for extra in ({}, {"confirm": ""}, {"confirm": "yes"}):
        r = world.client.post(
            program_path(world, "/api-key"), data={"csrf_token": token, **extra}, follow_redirects=False
        )
        assert r.status_code == 303 and r.headers["location"] == program_path(world, "/api-key")
    assert world.sale(**TEST_SALE).status_code == 200
    assert masked_on_page(world.client, world) == mask(world.api_key)


def test_the_new_key_waits_for_its_own_session_only(world: World) -> None:
    other_browser = TestClient(world.client.app)  # the same owner in another browser
    logged_in(other_browser, world.account_token)
    token = logged_in(world.client, world.account_token)
    r = world.client.post(
        program_path(world, "/api-key"), data={"csrf_token": token, **CONFIRM}, follow_redirects=False
    )
    assert r.status_code == 303
    assert NEW_KEY.search(other_browser.get(program_path(world, "?key=new")).text) is None
    assert NEW_KEY.search(world.client.get(r.headers["location"]).text)


def test_a_member_sees_no_regenerate_button_and_is_refused_by_the_server(world: World) -> None:
    token = logged_in(world.client, member_token(world))
    page = world.client.get(program_path(world))
    assert page.status_code == 200
    assert (
        'id="regenerate-key"' not in page.text
        and 'action="' + program_path(world, "/api-key") not in page.text
    )
    assert "Only a workspace owner" in page.text
    assert masked_on_page(world.client, world) == mask(world.api_key)
    assert world.client.get(program_path(world, "/api-key")).status_code == 403
    r = world.client.post(program_path(world, "/api-key"), data={"csrf_token": token, **CONFIRM})
    assert r.status_code == 403 and "owner_required" in r.text
    assert NEW_KEY.search(r.text) is None
    assert world.sale(**TEST_SALE).status_code == 200  # the key did not change


def test_an_owner_added_as_member_of_the_workspace_can_regenerate(world: World) -> None:
    token = logged_in(world.client, member_token(world, "owner"))
    r = regenerated(world.client, world, token)
    assert r.status_code == 200 and NEW_KEY.search(r.text)


@pytest.mark.parametrize(
    ("data", "headers"),
    [
        ({}, {}),
        ({"csrf_token": "wrong"}, {}),
        ({"csrf_token": ""}, {}),
        (None, {"Origin": "https://evil.example"}),  # right token, foreign origin
        (None, {"Referer": "https://evil.example/page"}),
        (None, {"Origin": "null"}),
    ],
)
def test_posts_without_the_right_csrf_token_or_origin_change_nothing(
    world: World, data: dict[str, str] | None, headers: dict[str, str]
) -> None:
    token = logged_in(world.client, world.account_token)
    form = {"csrf_token": token, **CONFIRM} if data is None else {**data, **CONFIRM}
    r = world.client.post(program_path(world, "/api-key"), data=form, headers=headers)
    assert r.status_code == 403 and "csrf_refused" in r.text
    assert NEW_KEY.search(r.text) is None
    assert world.sale(**TEST_SALE).status_code == 200
    assert masked_on_page(world.client, world) == mask(world.api_key)
    partner = dict(form, code="mallory", name="Mallory")
    assert (
        world.client.post(program_path(world, "/partners"), data=partner, headers=headers).status_code == 403
    )
    settings = dict(form, name="Hijacked", commission_type="percent", commission_percent="100")
    assert (
        world.client.post(program_path(world, "/settings"), data=settings, headers=headers).status_code == 403
    )
    api = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert api["name"] == "Brand partners" and api["commission_bps"] == 3000
    codes = [
        p["code"]
        for p in world.client.get(
            f"/api/v1/programs/{world.program_id}/partners", headers=world.owner
        ).json()["data"]
    ]
    assert codes == ["alice"]


def test_a_json_post_with_the_session_cookie_but_no_form_token_is_refused(world: World) -> None:
    logged_in(world.client, world.account_token)
    r = world.client.post(program_path(world, "/api-key"), json={"csrf_token": "x"})
    assert r.status_code == 403
    assert world.sale(**TEST_SALE).status_code == 200


def test_the_csrf_token_of_one_session_does_not_work_in_another(world: World) -> None:
    other_browser = TestClient(world.client.app)  # same app, its own cookie jar
    first = logged_in(other_browser, world.account_token)
    second = logged_in(world.client, world.account_token)
    assert first != second
    r = world.client.post(program_path(world, "/api-key"), data={"csrf_token": first, **CONFIRM})
    assert r.status_code == 403
    r = other_browser.post(program_path(world, "/api-key"), data={"csrf_token": second, **CONFIRM})
    assert r.status_code == 403
    assert world.sale(**TEST_SALE).status_code == 200


# -- partners and settings -------------------------------------------------------------------------
def test_owner_adds_partners_through_the_form(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    r = world.client.post(
        program_path(world, "/partners"),
        data={"csrf_token": token, "code": "bob", "name": "Bob <b>", "email": ""},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"].endswith("#partners")
    page = world.client.get(program_path(world)).text
    assert "<code>bob</code>" in page and "Bob &lt;b&gt;" in page and "Bob <b>" not in page
    api = world.client.get(f"/api/v1/programs/{world.program_id}/partners", headers=world.owner).json()
    assert {p["code"]: p["email"] for p in api["data"]} == {"alice": "alice@partner.test", "bob": None}

    dup = world.client.post(
        program_path(world, "/partners"), data={"csrf_token": token, "code": "bob", "name": "B"}
    )
    assert dup.status_code == 409 and "already exists" in dup.text
    bad = world.client.post(
        program_path(world, "/partners"), data={"csrf_token": token, "code": "no spaces", "name": "X"}
    )
    assert bad.status_code == 422 and "code:" in bad.text and 'value="no spaces"' in bad.text


def test_members_see_partners_but_no_add_form_and_cannot_add(world: World) -> None:
    token = logged_in(world.client, member_token(world))
    page = world.client.get(program_path(world)).text
    assert (
        "<code>alice</code>" in page and 'id="partner-form"' not in page and 'id="settings-form"' not in page
    )
    r = world.client.post(
        program_path(world, "/partners"), data={"csrf_token": token, "code": "m", "name": "M"}
    )
    assert r.status_code == 403 and "owner_required" in r.text
    r = world.client.post(
        program_path(world, "/settings"),
        data={"csrf_token": token, "name": "M", "commission_type": "flat", "commission_flat": "1"},
    )
    assert r.status_code == 403


def test_owner_updates_settings_through_the_form(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    form = settings_form(
        token, name="Renamed", commission_percent="25", recurring_months="12", requires_server_side_leads="on"
    )
    r = world.client.post(program_path(world, "/settings"), data=form, follow_redirects=False)
    assert r.status_code == 303
    api = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert (api["name"], api["commission_bps"], api["recurring_months"]) == ("Renamed", 2500, 12)
    assert api["requires_server_side_leads"] is True and api["stripe_account_id"] is None
    assert "Settings saved" in world.client.get(r.headers["location"]).text

    bad = world.client.post(
        program_path(world, "/settings"), data=settings_form(token, commission_percent="lots")
    )
    assert bad.status_code == 422 and 'value="lots"' in bad.text
    assert 'id="e-commission_percent"' in bad.text and "<strong>Commission (%)</strong>" in bad.text
    too_big = world.client.post(
        program_path(world, "/settings"), data=settings_form(token, platform_fee_percent="100.01")
    )
    assert too_big.status_code == 422 and 'id="e-platform_fee_percent"' in too_big.text
    api = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert (api["name"], api["commission_bps"], api["platform_fee_bps"]) == ("Renamed", 2500, 0)


@pytest.mark.parametrize(
    ("typed", "currency", "stored"),
    [
        ("12.50", "usd", 1250),
        ("1.250", "kwd", 1250),
        ("0.005", "bhd", 5),
        ("500", "jpy", 500),
        ("1,000", "eur", 100_000),
    ],
)
def test_the_flat_commission_is_entered_as_money_in_the_currencys_decimals(
    world: World, typed: str, currency: str, stored: int
) -> None:
    token = logged_in(world.client, world.account_token)
    form = settings_form(
        token,
        commission_type="flat",
        commission_flat=typed,
        flat_currency=currency,
        platform_fee_percent="2.5",
    )
    r = world.client.post(program_path(world, "/settings"), data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    api = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert (api["commission_type"], api["commission_flat"], api["platform_fee_bps"]) == (
        "flat",
        {currency: stored},  # in that currency alone (CONTRACT 15)
        250,
    )
    page = world.client.get(program_path(world)).text
    shown = money_for_form(stored, currency)  # the row it was entered in, with its currency chosen
    assert f'id="s-commission_flat" name="commission_flat" inputmode="decimal" value="{shown}"' in page
    chosen = (
        rf'<select id="s-flat_currency" name="flat_currency"[^>]*>.*?<option value="{currency}" selected>'
    )
    assert re.search(chosen, page, re.S)
    assert 'name="platform_fee_percent" inputmode="decimal" value="2.5"' in page
    assert 'name="commission_percent" inputmode="decimal" value="30"' in page


@pytest.mark.parametrize(
    ("typed", "currency", "message"),
    [
        ("12.345", "usd", "USD amounts have at most 2 decimals"),
        ("1.5", "jpy", "JPY amounts have no decimals"),
        ("1.2345", "kwd", "KWD amounts have at most 3 decimals"),
        ("12,5", "usd", "a dot before the decimals"),
    ],
)
def test_an_amount_with_too_many_decimals_is_refused_on_the_form(
    world: World, typed: str, currency: str, message: str
) -> None:
    token = logged_in(world.client, world.account_token)
    form = settings_form(token, commission_type="flat", commission_flat=typed, flat_currency=currency)
    r = world.client.post(program_path(world, "/settings"), data=form)
    assert r.status_code == 422 and message in r.text and f'value="{typed}"' in r.text
    assert 'id="e-commission_flat"' in r.text and 'aria-invalid="true"' in r.text
    api = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert (api["commission_type"], api["commission_flat"]) == ("percent", 0)


# -- checklist and tracking log ------------------------------------------------------------------
def test_checklist_shows_done_and_not_done(world: World) -> None:
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world)).text
    assert re.search(r'class="done" data-step="api_key_generated"', page)
    assert re.search(r'class="todo" data-step="test_sale_received"', page)
    assert world.sale(**TEST_SALE).status_code == 200
    page = world.client.get(program_path(world)).text
    assert re.search(r'class="done" data-step="test_sale_received"', page)
    assert re.search(r'class="todo" data-step="sale_received"', page)


def test_tracking_log_is_newest_first_and_paginated(world: World) -> None:
    for n in range(53):
        assert world.sale(transaction_id=f"in_{n}", customer_external_id=f"c{n}").status_code == 200
    assert world.client.post("/api/v1/track/sale", json={"amount": 5}, headers=world.key).status_code == 422
    logged_in(world.client, world.account_token)
    first = world.client.get(program_path(world, "/log"))
    assert first.status_code == 200
    ids = [int(i) for i in re.findall(r"<tr class=\"\w+\">\s*<td>(\d+)</td>", first.text)]
    assert len(ids) == 50 and ids == sorted(ids, reverse=True)
    assert 'class="bad"' in first.text.split("<tbody>")[1].split("</tr>")[0]  # the 422 is the newest
    older = re.search(r'href="([^"]+)" id="older"', first.text)
    assert older
    second = world.client.get(older.group(1).replace("&amp;", "&"))
    rest = [int(i) for i in re.findall(r"<tr class=\"\w+\">\s*<td>(\d+)</td>", second.text)]
    assert rest and max(rest) < min(ids) and len(ids) + len(rest) == 54
    assert world.client.get(program_path(world, "/log?before=abc")).status_code == 422
    assert world.client.get(program_path(world, "/log?before=²")).status_code == 422  # not a 500


# -- sales and explain (the reconciler's tables) --------------------------------------------------
def test_sales_before_the_first_reconcile_run_show_an_empty_state(world: World) -> None:
    logged_in(world.client, world.account_token)
    r = world.client.get(program_path(world, "/sales"))
    assert r.status_code == 200 and 'id="not-reconciled"' in r.text
    explain = world.client.get(program_path(world, "/sales/in_1"))
    assert explain.status_code == 404 and "sale_not_found" in explain.text


def reconciled_world(world: World) -> dict[str, dict[str, Any]]:
    """An attributed sale (click -> lead -> sale), an unattributed one whose id needs escaping, a
    test sale; then a real reconcile run. The JSON API's view of the sales, by transaction id."""
    click = world.client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
    ).json()["data"]["click_id"]
    lead = {"customer_external_id": "cust_1", "email": "c1@buyer.test", "click_id": click}
    assert world.client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    assert world.sale(transaction_id="in_1", amount=10000).status_code == 200
    assert world.sale(transaction_id=EVIL, customer_external_id="cust_2", amount=500).status_code == 200
    assert world.client.post("/api/v1/track/sale", json=TEST_SALE, headers=world.key).status_code == 200
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    r = world.client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner)
    return {s["transaction_id"]: s for s in r.json()["data"] if not s["test_mode"]}


EVIL = "in_<b>x</b>"


def test_sales_and_explain_show_the_reconciled_attribution(world: World) -> None:
    api = reconciled_world(world)
    assert api["in_1"]["partner_code"] == "alice" and api[EVIL]["partner_code"] is None
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world, "/sales"))
    assert page.status_code == 200 and 'id="not-reconciled"' not in page.text
    assert "100.00 USD" in page.text and api["in_1"]["attribution_rule"] in page.text
    assert api["in_1"]["commission"] == 3000 and "30.00 USD" in page.text
    assert api[EVIL]["unattributed_reason"] in page.text
    assert "<b>x</b>" not in page.text and "in_&lt;b&gt;x&lt;/b&gt;" in page.text
    only = world.client.get(program_path(world, "/sales?attributed=no")).text
    assert (
        "in_&lt;b&gt;" in only
        and 'href="/dashboard/programs/' + world.program_id + '/sales/in_1"' not in only
    )

    explain = world.client.get(program_path(world, "/sales/in_1"))
    assert explain.status_code == 200 and 'id="ladder"' in explain.text
    rule = api["in_1"]["attribution_rule"]
    assert (
        f'attributed to <code>alice</code> by rule <span class="code-label" title="{rule}">' in explain.text
    )
    json_explain = world.client.get(
        f"/api/v1/programs/{world.program_id}/sales/in_1/explain", headers=world.owner
    ).json()["data"]
    assert json_explain["steps"] and all(step["rule"] in explain.text for step in json_explain["steps"])
    link = re.search(r'href="([^"]+)">in_&lt;b&gt;', page.text)
    assert link
    unattributed = world.client.get(link.group(1))
    assert unattributed.status_code == 200 and "not attributed" in unattributed.text
    assert "<b>x</b>" not in unattributed.text
    assert world.client.get(program_path(world, "/sales/in_nope")).status_code == 404
    assert "/sales/None" not in page.text  # the test sale has no transaction id to open


def test_sales_of_another_program_are_not_shown(world: World) -> None:
    reconciled_world(world)
    other = world.client.post(
        "/api/v1/programs", json={"workspace_id": world.workspace_id, "name": "Second"}, headers=world.owner
    ).json()["data"]["program_id"]
    logged_in(world.client, world.account_token)
    page = world.client.get(f"/dashboard/programs/{other}/sales")
    assert page.status_code == 200 and "in_1" not in page.text and 'id="not-reconciled"' not in page.text
    assert world.client.get(f"/dashboard/programs/{other}/sales/in_1").status_code == 404


def test_three_decimal_and_zero_decimal_amounts_show_with_their_own_decimals(world: World) -> None:
    assert world.sale(transaction_id="in_kwd", amount=12_345, currency="kwd").status_code == 200
    assert world.sale(transaction_id="in_bhd", amount=1_234_500, currency="bhd").status_code == 200
    assert world.sale(transaction_id="in_jpy", amount=5_000, currency="jpy").status_code == 200
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world, "/sales")).text
    assert '<td class="num">12.345 KWD</td>' in page
    assert '<td class="num">1,234.500 BHD</td>' in page
    assert '<td class="num">5,000 JPY</td>' in page
    explain = world.client.get(program_path(world, "/sales/in_kwd")).text
    assert "12.345 KWD" in explain


def test_codes_show_as_labels_with_the_code_on_hover_and_times_as_dates(world: World) -> None:
    with time_machine.travel(datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC), tick=False):
        reconciled_world(world)
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world, "/sales")).text
    assert '<span class="code-label" title="customer_key">Customer key of a lead</span>' in page
    assert '<span class="code-label" title="customer_not_found">Customer not found</span>' in page
    assert '<span class="code-label" title="self_hosted">Your server</span>' in page
    assert (
        '<time datetime="2026-03-04T05:06:07Z" title="2026-03-04T05:06:07Z">4 Mar 2026, 05:06 UTC</time>'
        in page
    )
    assert ">2026-03-04T05:06:07Z<" not in page  # no raw timestamp as text
    settings = world.client.get(program_path(world)).text
    assert '<span class="code-label" title="api_key_generated">API key generated</span>' in settings
    explain = world.client.get(program_path(world, "/sales/in_1")).text
    assert '<span class="code-label" title="matched">Matched</span>' in explain
    log = world.client.get(program_path(world, "/log")).text
    assert '<span class="code-label" title="accepted">Accepted</span>' in log
