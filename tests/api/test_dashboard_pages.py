"""The dashboard's paper cuts, through the real app (the browser tests measure the same pages in
Chromium at 390 and 1280 px: tests/browser/test_pages.py)."""

from __future__ import annotations

import csv
import html
import io
import re
from datetime import UTC, datetime
from pathlib import Path

import time_machine
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import load_settings
from tests.conftest import OP, OPERATOR_TOKEN, World, make_world
from tests.helpers import logged_in, payee, program_path


# -- an empty month is not a green "Reconciled" ---------------------------------------------------
def test_an_empty_month_says_there_is_nothing_to_reconcile_not_reconciled(world: World) -> None:
    logged_in(world.client, world.account_token)
    before_any_run = world.client.get(program_path(world, "/finance?period=2026-01")).text
    assert 'id="no-activity"' in before_any_run and 'id="no-run-yet"' in before_any_run
    assert 'id="reconciled"' not in before_any_run and "checks pass" not in before_any_run

    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    empty = world.client.get(program_path(world, "/finance?period=2026-01")).text
    assert 'id="no-activity"' in empty and "nothing to" in empty
    assert 'id="no-run-yet"' not in empty
    assert 'id="reconciled"' not in empty and "0 checks pass" not in empty
    html = world.client.get(
        f"/api/v1/programs/{world.program_id}/reports/finance?period=2026-01&format=html",
        headers=world.owner,
    ).text
    assert 'id="no-activity"' in html and 'id="reconciled"' not in html


def test_a_month_before_the_program_existed_says_so(client: TestClient) -> None:
    with time_machine.travel(datetime(2026, 3, 10, 12, 0, tzinfo=UTC), tick=True):
        world = make_world(client)
        logged_in(client, world.account_token)
        page = client.get(program_path(world, "/finance?period=2025-11")).text
        assert 'id="before-program"' in page and "before this program existed" in page
        assert "period=2026-03" in page  # a link to its first month
        page = client.get(program_path(world, "/finance?period=2026-03")).text
        assert 'id="before-program"' not in page


def test_a_month_with_sales_is_still_reconciled_in_green(world: World) -> None:
    assert world.sale(occurred_at="2026-01-05T10:00:00Z").status_code == 200
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world, "/finance?period=2026-01")).text
    assert 'id="reconciled"' in page and 'id="no-activity"' not in page


# -- the tracking log shows money in the currency's units -----------------------------------------
def test_the_tracking_log_shows_amounts_in_the_currencys_units(world: World) -> None:
    assert world.sale(transaction_id="in_usd", amount=1250).status_code == 200
    assert world.sale(transaction_id="in_kwd", amount=12345, currency="kwd").status_code == 200
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world, "/log")).text
    assert "sale in_usd 12.50 USD" in page and "sale in_kwd 12.345 KWD" in page
    assert "1250 usd" not in page and "12345 kwd" not in page
    api = world.client.get(f"/api/v1/programs/{world.program_id}/tracking-log", headers=world.owner)
    assert "sale in_usd 1250 usd" in api.text  # the API keeps what ingest wrote


# -- sales: date, partner and currency filters, and the CSV of what they match ----------------------
def sales_world(world: World) -> None:
    r = world.client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "bob", "name": "Bob Partner"},
        headers=world.owner,
    )
    assert r.status_code == 201, r.text
    for n, (code, currency, day) in enumerate(
        [("alice", "usd", 3), ("alice", "eur", 10), ("bob", "usd", 20), ("bob", "usd", 40), (None, "usd", 12)]
    ):
        customer = f"cust_{n}"
        if code is not None:
            click = world.client.post(
                "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": code}
            ).json()["data"]["click_id"]
            lead = {"customer_external_id": customer, "click_id": click}
            assert world.client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
        occurred = f"2026-01-{day:02d}T10:00:00Z" if day <= 31 else f"2026-02-{day - 31:02d}T10:00:00Z"
        r = world.sale(
            transaction_id=f"in_{n}",
            customer_external_id=customer,
            amount=1000 + n,
            currency=currency,
            occurred_at=occurred,
        )
        assert r.status_code == 200, r.text
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200


def shown_sales(html: str) -> list[str]:
    return re.findall(r'/sales/(in_[0-9]+)">', html)


def test_sales_filter_by_date_partner_and_currency_and_download_what_they_match(world: World) -> None:
    sales_world(world)
    client = world.client
    logged_in(client, world.account_token)
    page = client.get(program_path(world, "/sales")).text
    assert shown_sales(page) == ["in_0", "in_1", "in_4", "in_2", "in_3"]
    assert '<option value="bob">Bob Partner (bob)</option>' in page
    assert '<option value="eur">EUR</option>' in page and '<option value="usd">USD</option>' in page
    assert 'id="clear-filters"' not in page

    def shown(query: str) -> list[str]:
        return shown_sales(client.get(program_path(world, f"/sales?{query}")).text)

    assert shown("from=2026-01-10&to=2026-01-20") == ["in_1", "in_4", "in_2"]  # both days included
    assert shown("partner_code=alice") == ["in_0", "in_1"]
    assert shown("currency=usd") == ["in_0", "in_4", "in_2", "in_3"]
    assert shown("currency=USD&partner_code=bob&to=2026-01-31") == ["in_2"]
    assert shown("attributed=no") == ["in_4"]
    assert shown("partner_code=nobody") == []
    page = client.get(program_path(world, "/sales?partner_code=bob&currency=usd")).text
    assert 'id="clear-filters"' in page and "selected>Bob Partner (bob)" in page
    link = re.search(r'href="([^"]+)" id="download-csv"', page)
    assert link is not None
    href = link.group(1).replace("&amp;", "&")
    assert href == program_path(world, "/sales?partner_code=bob&currency=usd&format=csv")
    r = client.get(href)
    assert r.status_code == 200 and r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.headers["content-disposition"] == f'attachment; filename="sales-{world.program_id}.csv"'
    rows = list(csv.DictReader(io.StringIO(r.content.decode("utf-8-sig"))))
    assert [(row["transaction_id"], row["amount"], row["amount_decimal"]) for row in rows] == [
        ("in_2", "1002", "10.02"),
        ("in_3", "1003", "10.03"),
    ]
    # the same bytes as the API's CSV with the same filters
    api = client.get(
        f"/api/v1/programs/{world.program_id}/sales?partner_code=bob&currency=usd&format=csv",
        headers=world.owner,
    )
    assert api.content == r.content
    bad = client.get(program_path(world, "/sales?currency=dollars"))
    assert bad.status_code == 422 and "validation_error" in bad.text
    assert client.get(program_path(world, "/sales?format=xlsx")).status_code == 422


def test_the_api_filters_sales_by_partner_and_currency(world: World) -> None:
    sales_world(world)
    base = f"/api/v1/programs/{world.program_id}/sales"
    r = world.client.get(f"{base}?partner_code=bob&currency=USD", headers=world.owner)
    assert [s["transaction_id"] for s in r.json()["data"]] == ["in_2", "in_3"]
    r = world.client.get(f"{base}?currency=us", headers=world.owner)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == "currency"


# -- payouts: people, not account ids; the batch button off when nothing is due --------------------
def test_the_payouts_tab_names_people_and_refuses_a_batch_when_nothing_is_due(client: TestClient) -> None:
    with time_machine.travel(datetime(2026, 1, 5, 9, 0, tzinfo=UTC), tick=True) as clock:
        world = make_world(client, holding_days=0)
        payee(world, "alice")  # a batch pays only partners with payout details
        token = logged_in(client, world.account_token)
        page = client.get(program_path(world, "/payouts")).text
        assert re.search(r'<button type="submit" id="make-batch-button" disabled', page)
        assert 'id="batch-refusal"' in page and "Nothing is reconciled yet" in page
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        page = client.get(program_path(world, "/payouts")).text
        assert 'id="make-batch-button" disabled' in page and "Nothing is due" in page

        click = client.post(
            "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
        ).json()["data"]["click_id"]
        lead = {"customer_external_id": "cust_1", "click_id": click}
        assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
        assert world.sale(amount=10_000).status_code == 200
        clock.move_to(datetime(2026, 2, 10, 9, 0, tzinfo=UTC))
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        token = logged_in(client, world.account_token)  # a month later: a new session
        page = client.get(program_path(world, "/payouts")).text
        assert 'id="make-batch-button">' in page and 'id="batch-refusal"' not in page
        assert "<strong>Alice</strong> <code>alice</code>" in page  # the partner by name
        r = client.post(program_path(world, "/payouts"), data={"up_to": "2026-01-31", "csrf_token": token})
        assert r.status_code == 200
        page = r.text
        assert 'title="acc_' in page and ">owner@brand.test</span>" in page  # who made it
        assert not re.search(r"by <code>acc_", page)
        assert 'id="make-batch-button" disabled' in page  # everything due is in the batch now


# -- the checklist says how to do each step ----------------------------------------------------------
def test_the_checklist_shows_how_to_do_each_step_with_this_servers_address(world: World) -> None:
    client = world.client
    logged_in(client, world.account_token)
    r = client.get(program_path(world))
    page = html.unescape(r.text)
    base, pid = "http://testserver", world.program_id
    assert f'<script src="{base}/sdk/v1/tally.js" data-program-id="{pid}" defer></script>' in page
    assert f"{base}/webhooks/stripe" in page and "TALLY_STRIPE_WEBHOOK_SECRETS=whsec_..." in page
    assert f"curl -X POST {base}/api/v1/track/sale" in page
    assert "Authorization: Bearer $SERVICE_API_KEY" in page and '"test_mode": true' in page
    assert f"curl -X POST {base}/api/v1/track/lead" in page and "tally.signup(userId)" in page
    assert "https://your-site.example/?aff=alice" in page  # the program's own partner
    assert f"{base}/demo/shop?program_id={pid}&aff=alice" in page
    flat = " ".join(page.split())
    assert 'id="secrets-configured"' in page and "2 signing secrets configured" in flat  # never the values
    assert "whsec_test_primary" not in page and world.api_key not in page
    for step in (
        "api_key_generated",
        "test_sale_received",
        "click_received",
        "lead_received",
        "sale_received",
    ):
        assert f'id="howto-{step}"' in page, step
    # a copy button for every snippet, hidden until the script shows it
    snippets = re.findall(r'<pre id="(snippet-[a-z-]+)">', r.text)
    assert len(snippets) >= 8
    assert sorted(re.findall(r'data-copy="(snippet-[a-z-]+)" hidden>Copy</button>', r.text)) == sorted(
        snippets
    )
    # a step done is folded, a step to do is open
    assert re.search(r'id="howto-api_key_generated">', r.text)
    assert re.search(r'id="howto-test_sale_received" open>', r.text)
    # this page, and only this one, runs our one script
    assert r.headers["content-security-policy"].endswith("; script-src 'self'")
    assert '<script src="/dashboard/static/dashboard.js" defer></script>' in r.text
    other = client.get(program_path(world, "/sales"))
    assert "script-src" not in other.headers["content-security-policy"] and "<script" not in other.text
    js = client.get("/dashboard/static/dashboard.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("application/javascript")
    assert "data-copy" in js.text


def test_the_checklist_says_when_the_server_has_no_webhook_secret(tmp_path: Path) -> None:
    settings = load_settings(
        database=str(tmp_path / "t.duckdb"),
        operator_token=OPERATOR_TOKEN,
        base_url="https://tally.example",
        reconcile_interval_seconds=0,
    )
    with TestClient(create_app(settings), base_url="https://testserver") as client:
        world = make_world(client)
        logged_in(client, world.account_token)
        page = html.unescape(client.get(program_path(world)).text)
    assert 'id="secrets-missing"' in page and "https://tally.example/webhooks/stripe" in page


# -- the demo brand page ----------------------------------------------------------------------------
def test_the_demo_page_carries_the_script_tag_for_a_program(client: TestClient) -> None:
    r = client.get("/demo/shop?program_id=prog_abc&aff=alice")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script src="/sdk/v1/tally.js" data-program-id="prog_abc" defer></script>' in r.text
    assert '<script src="/demo/shop.js" defer></script>' in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in r.text
    assert client.get("/demo/shop.js").headers["content-type"].startswith("application/javascript")
    for bad in ("", '"><script>alert(1)</script>', "prog abc"):
        r = client.get("/demo/shop", params={"program_id": bad})
        assert r.status_code == 200 and 'id="how-to-open"' in r.text and "<script src" not in r.text
        assert "alert(1)" not in r.text
