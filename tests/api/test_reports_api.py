"""The finance and double-counting reports through the real app: click, lead, sales, refund and a
signed connect webhook, a real reconcile run, then every format, the errors and the dashboard tab."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
import openpyxl
import pytest
import time_machine
from starlette.testclient import TestClient

from ingest.stripe import sign
from reports import load, reads
from reports.html import DOCUMENT_CSP
from reports.money import minor
from tests.conftest import OP, WEBHOOK_SECRET, World, bearer, make_world
from tests.helpers import as_cell, parse_finance_csv, report_run_id, without_provenance
from tests.stripe_fixtures import load_event, serialise, with_metadata

ACCOUNT = "acct_1TallyReportsAccount"
CHECKOUT = "stripe-sync-engine__checkout_session_completed.json"  # 9.99 EUR incl. 0.65 tax; pi + cs + in
CHECKOUT_PI = "pi_1IqxJOJDPojXS6LN9uOebAea"
NOW = datetime(2026, 2, 5, 12, 0, tzinfo=UTC)
PERIOD = "2026-01"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def deliver(client: TestClient, event: dict[str, Any]) -> httpx.Response:
    body = serialise(event)
    headers = {
        "Stripe-Signature": sign(body, WEBHOOK_SECRET, int(time.time())),
        "Content-Type": "application/json",
    }
    return client.post("/webhooks/stripe", content=body, headers=headers)


def logged_in(client: TestClient, token: str) -> None:
    """Log in to the dashboard through its form."""
    form = client.get("/dashboard/login")
    found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert found
    r = client.post(
        "/dashboard/login", data={"token": token, "csrf_token": found.group(1)}, follow_redirects=False
    )
    assert r.status_code == 303, r.text


def finance_url(world: World, query: str = f"period={PERIOD}") -> str:
    return f"/api/v1/programs/{world.program_id}/reports/finance?{query}"


def doubles_url(world: World, query: str = "") -> str:
    return f"/api/v1/programs/{world.program_id}/reports/double-counting?{query}"


@pytest.fixture
def frozen() -> Iterator[None]:
    with time_machine.travel(NOW, tick=True):
        yield


@pytest.fixture
def shop(client: TestClient, frozen: None) -> World:
    """A program with 10 % platform fee connected to ACCOUNT, partners alice and bob, and a
    January of traffic, reconciled on Feb 5:

    - alice's click -> lead cust_1 -> sale in_1 of 100.00 USD on Jan 3, refunded 25.00 on Jan 10
      (approved: commission 30.00 - 7.50, fee 10.00 - 2.50);
    - bob's click in the metadata of a connect checkout of 9.99 EUR (0.65 tax) on Jan 20 (pending:
      30 % of 9.34 = 2.80, fee 0.93); the same payment tracked again self-hosted: refused (409);
    - in_2 of 5.00 USD without attribution; a test sale.
    """
    world = make_world(client, stripe_account_id=ACCOUNT, platform_fee_bps=1000)
    r = client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "bob", "name": "Bob", "email": "bob@partner.test"},
        headers=world.owner,
    )
    assert r.status_code == 201, r.text
    clicks = {
        code: client.post(
            "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": code}
        ).json()["data"]["click_id"]
        for code in ("alice", "bob")
    }
    lead = {"customer_external_id": "cust_1", "email": "c1@buyer.test", "click_id": clicks["alice"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    assert (
        world.sale(transaction_id="in_1", amount=10_000, occurred_at="2026-01-03T10:00:00Z").status_code
        == 200
    )
    refund = {
        "transaction_id": "in_1",
        "refund_id": "re_1",
        "amount": 2_500,
        "occurred_at": "2026-01-10T09:00:00Z",
    }
    assert client.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
    created = int(datetime(2026, 1, 20, 15, 0, tzinfo=UTC).timestamp())
    event = with_metadata(
        load_event(CHECKOUT, account=ACCOUNT, created=created), {"svc_click_id": clicks["bob"]}
    )
    assert deliver(client, event).status_code == 200
    again = world.sale(
        transaction_id=CHECKOUT_PI, amount=999, currency="eur", occurred_at="2026-01-20T15:00:00Z"
    )
    assert (again.status_code, again.json()["error"]["code"]) == (409, "duplicate_transaction")
    assert (
        world.sale(
            transaction_id="in_2",
            customer_external_id="cust_2",
            amount=500,
            occurred_at="2026-01-21T00:00:00Z",
        ).status_code
        == 200
    )
    test_sale = {"additional_data": {"test_mode": True}, "amount": 100, "occurred_at": "2026-01-22T00:00:00Z"}
    assert client.post("/api/v1/track/sale", json=test_sale, headers=world.key).status_code == 200
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    return world


def summary_of(data: dict[str, Any], currency: str) -> dict[str, Any]:
    (row,) = [r for r in data["summary"] if r["currency"] == currency]
    return row


def test_finance_report_json_has_the_months_figures(shop: World) -> None:
    r = shop.client.get(finance_url(shop), headers=shop.owner)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json" and "content-disposition" not in r.headers
    data = r.json()["data"]
    assert (data["program_id"], data["program_name"], data["period"]) == (
        shop.program_id,
        "Brand partners",
        PERIOD,
    )
    assert data["currencies"] == ["eur", "usd"] and data["reconciled"] is True
    usd, eur = summary_of(data, "usd"), summary_of(data, "eur")
    assert {
        k: usd[k] for k in ("sales_count", "gross_sales", "refunds", "net_sales", "test_sales_count")
    } == {
        "sales_count": 2,
        "gross_sales": 10_500,
        "refunds": 2_500,
        "net_sales": 8_000,
        "test_sales_count": 1,
    }
    assert (usd["commissions"], usd["commissions_reversed"], usd["platform_fees"]) == (2_250, 750, 750)
    assert (usd["unattributed_sales_count"], usd["unattributed_sales"]) == (1, 500)
    assert (eur["gross_sales"], eur["tax"], eur["commissions"], eur["platform_fees"]) == (999, 65, 280, 93)
    assert (eur["double_counts_count"], eur["double_counts_amount"]) == (1, 999)
    statuses = {(s["currency"], s["status"]): s["commission"] for s in data["commissions_by_status"]}
    assert statuses[("usd", "approved")] == 2_250 and statuses[("eur", "pending")] == 280
    partners = [(p["currency"], p["partner_code"], p["commission"]) for p in data["commissions_by_partner"]]
    assert partners == [("eur", "bob", 280), ("usd", "alice", 2_250)]
    sales = shop.client.get(
        f"/api/v1/programs/{shop.program_id}/sales?transaction_id=in_2", headers=shop.owner
    )
    reason = sales.json()["data"][0]["unattributed_reason"]
    assert data["unattributed_by_reason"] == [
        {"currency": "usd", "reason": reason, "sales_count": 1, "amount": 500}
    ]
    assert data["double_counts"] == [{"currency": "eur", "kind": "ingest_refused", "count": 1, "amount": 999}]
    # 25 checks a currency, issue 49's held and void totals (shown apart from commissions) among them
    assert all(c["ok"] for c in data["checks"]) and len(data["checks"]) == 2 * 25
    checked = {(c["currency"], c["name"]) for c in data["checks"]}
    assert {(cur, f"statuses_{st}") for cur in ("eur", "usd") for st in ("held", "void")} <= checked
    assert (usd["held"], usd["void"], eur["held"], eur["void"]) == (0, 0, 0, 0)


def test_finance_report_in_every_format(shop: World) -> None:
    data = shop.client.get(finance_url(shop), headers=shop.owner).json()["data"]
    name = f"finance-{shop.program_id}-{PERIOD}"

    csv_r = shop.client.get(finance_url(shop, f"period={PERIOD}&format=csv"), headers=shop.owner)
    assert csv_r.status_code == 200 and csv_r.headers["content-type"] == "text/csv; charset=utf-8"
    assert csv_r.headers["content-disposition"] == f'attachment; filename="{name}.csv"'
    parsed = parse_finance_csv(csv_r.text)
    assert parsed["commissions_by_partner"] == [
        {k: as_cell(v) for k, v in row.items()} for row in data["commissions_by_partner"]
    ]

    xlsx_r = shop.client.get(finance_url(shop, f"period={PERIOD}&format=xlsx"), headers=shop.owner)
    assert xlsx_r.headers["content-type"] == XLSX
    assert xlsx_r.headers["content-disposition"] == f'attachment; filename="{name}.xlsx"'
    book = openpyxl.load_workbook(io.BytesIO(xlsx_r.content))
    assert book["Summary"]["B3"].value == PERIOD
    assert [r[:4] for r in book["By partner"].iter_rows(min_row=2, values_only=True)] == [
        ("eur", "bob", 1, 2.8),
        ("usd", "alice", 1, 22.5),
    ]

    html_r = shop.client.get(finance_url(shop, f"period={PERIOD}&format=html"), headers=shop.owner)
    assert html_r.headers["content-type"] == "text/html; charset=utf-8"
    assert html_r.headers["content-disposition"] == f'inline; filename="{name}.html"'
    assert html_r.headers["content-security-policy"] == DOCUMENT_CSP
    assert html_r.headers["x-content-type-options"] == "nosniff"
    html = html_r.text
    for code in ("eur", "usd"):
        assert f'id="chart-partners-{code}"' in html and f'id="chart-status-{code}"' in html
    assert "22.50 USD" in html and "2.80 EUR" in html and html.count("<svg ") == 4
    assert 'id="month-open"' in html and 'data-closed="false"' in html and "Generated <time" in html
    assert f'<code id="report-run-id">{report_run_id(html_r.content)}</code>' in html
    # the xlsx says the same beside its header: generated when, from which run, month open
    provenance = {book["Summary"].cell(r, 4).value: book["Summary"].cell(r, 5).value for r in (2, 3, 4)}
    assert set(provenance) == {"Generated", "Reconcile run", "Month"}
    assert str(provenance["Reconcile run"]).startswith(report_run_id(html_r.content) + " (finished ")
    assert str(provenance["Month"]).startswith("open") and str(provenance["Generated"]).endswith(" UTC")

    # the same data renders the same bytes, also after another reconcile run of the same log
    bodies = {
        fmt: shop.client.get(finance_url(shop, f"period={PERIOD}&format={fmt}"), headers=shop.owner).content
        for fmt in ("json", "csv", "xlsx", "html")
    }
    run = shop.client.post("/api/v1/operator/reconcile", headers=OP)
    assert run.status_code == 200
    for fmt, before in bodies.items():
        again = shop.client.get(
            finance_url(shop, f"period={PERIOD}&format={fmt}"), headers=shop.owner
        ).content
        if fmt == "html":  # the same figures; the provenance line names the newer run
            assert report_run_id(again) == run.json()["data"]["run_id"] != report_run_id(before)
            assert without_provenance(again) == without_provenance(before)
        elif fmt == "xlsx":  # the same cells, but for the provenance beside the header
            assert _cells_without_provenance(again) == _cells_without_provenance(before)
        else:
            assert again == before, fmt
    assert bodies["csv"] == csv_r.content
    assert without_provenance(bodies["html"]) == without_provenance(html_r.content)


def _cells_without_provenance(xlsx: bytes) -> dict[str, list[tuple[Any, ...]]]:
    book = openpyxl.load_workbook(io.BytesIO(xlsx))
    for row in (2, 3, 4):
        book["Summary"].cell(row, 5).value = None
    return {name: list(book[name].iter_rows(values_only=True)) for name in book.sheetnames}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("", "period"),
        ("period=2026-13", "period"),
        ("period=2026-1", "period"),
        (f"period={PERIOD}&format=pdf", "format"),
        (f"period={PERIOD}&format=JSON", "format"),
    ],
)
def test_finance_report_validation(world: World, query: str, field: str) -> None:
    r = world.client.get(finance_url(world, query), headers=world.owner)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "validation_error" and error["fields"][0]["field"] == field


def test_double_counting_formats_and_validation(world: World) -> None:
    r = world.client.get(doubles_url(world, "format=xlsx"), headers=world.owner)
    assert (r.status_code, r.json()["error"]["fields"][0]["field"]) == (422, "format")
    r = world.client.get(doubles_url(world, "period=26-01"), headers=world.owner)
    assert (r.status_code, r.json()["error"]["fields"][0]["field"]) == (422, "period")


def test_reports_need_an_account_of_the_workspace(world: World) -> None:
    stranger = world.client.post(
        "/api/v1/operator/accounts", json={"email": "x@other.test", "workspace_name": "Other"}, headers=OP
    ).json()["data"]["token"]
    member = world.member()
    for url in (finance_url(world), doubles_url(world)):
        r = world.client.get(url)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "missing_credentials")
        r = world.client.get(url, headers=world.key)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "account_token_required")
        r = world.client.get(url, headers=bearer(stranger))
        assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found")
        assert world.client.get(url, headers=member).status_code == 200
    r = world.client.get(
        finance_url(world, "period=2026-01").replace(world.program_id, "prog_nope"), headers=world.owner
    )
    assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found")


def test_before_the_first_run_the_report_is_empty(world: World) -> None:
    r = world.client.get(finance_url(world), headers=world.owner)
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["currencies"] == [] and data["summary"] == [] and data["reconciled"] is True
    html = world.client.get(finance_url(world, f"period={PERIOD}&format=html"), headers=world.owner)
    assert 'id="no-activity"' in html.text
    assert 'data-run-id=""' in html.text and "before the first reconcile run" in html.text
    assert world.client.get(doubles_url(world), headers=world.owner).json()["data"]["double_counts"] == []


def test_double_counting_report_lists_the_refused_duplicate(shop: World) -> None:
    r = shop.client.get(doubles_url(shop), headers=shop.owner)
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["period"] is None
    (row,) = data["double_counts"]
    assert (row["kind"], row["duplicate_transaction_id"], row["amount"], row["currency"]) == (
        "ingest_refused",
        CHECKOUT_PI,
        999,
        "eur",
    )
    assert row["occurred_at"] == "2026-01-20T15:00:00Z"
    csv_r = shop.client.get(doubles_url(shop, "format=csv&period=2026-01"), headers=shop.owner)
    assert (
        csv_r.headers["content-disposition"]
        == f'attachment; filename="double-counting-{shop.program_id}-2026-01.csv"'
    )
    assert csv_r.text.startswith("\ufeff")  # the one CSV format (reports/csvcells.py)
    lines = csv_r.text.removeprefix("\ufeff").splitlines()
    assert lines[0].split(",")[:3] == ["kind", "transaction_id", "sale_id"] and len(lines) == 2
    assert lines[0].endswith(",amount_decimal,distinct_amount_decimal")
    assert (
        shop.client.get(doubles_url(shop, "period=2026-02"), headers=shop.owner).json()["data"][
            "double_counts"
        ]
        == []
    )


# -- the dashboard's finance tab -----------------------------------------------------------------
def dashboard_path(world: World, suffix: str) -> str:
    return f"/dashboard/programs/{world.program_id}{suffix}"


def test_dashboard_finance_tab_shows_the_report_and_downloads(shop: World) -> None:
    client = shop.client
    assert client.get(dashboard_path(shop, "/finance"), follow_redirects=False).status_code == 303
    logged_in(client, shop.account_token)
    sales = client.get(dashboard_path(shop, "/sales"))
    assert f'href="/dashboard/programs/{shop.program_id}/finance">Finance</a>' in sales.text

    page = client.get(dashboard_path(shop, f"/finance?period={PERIOD}"))
    assert page.status_code == 200
    assert "script-src" not in page.headers["content-security-policy"]  # the dashboard's own CSP
    html = page.text
    assert 'class="current">Finance</a>' in html and f'value="{PERIOD}"' in html
    assert 'id="finance-report"' in html and html.count("<svg ") == 4 and " style=" not in html
    assert "22.50 USD" in html and 'id="partners-usd"' in html

    assert '<link rel="stylesheet" href="/dashboard/static/finance.css">' in html
    css = client.get("/dashboard/static/finance.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert ".finance-report" in css.text

    default = client.get(dashboard_path(shop, "/finance"))
    assert default.status_code == 200 and 'value="2026-02"' in default.text  # this month (frozen clock)

    for fmt, content_type in (
        ("csv", "text/csv; charset=utf-8"),
        ("xlsx", XLSX),
        ("html", "text/html; charset=utf-8"),
    ):
        r = client.get(dashboard_path(shop, f"/finance/export?period={PERIOD}&format={fmt}"))
        assert r.status_code == 200 and r.headers["content-type"] == content_type, fmt
        api = client.get(finance_url(shop, f"period={PERIOD}&format={fmt}"), headers=shop.owner)
        if fmt == "html":  # the same report; each says when it was generated
            assert without_provenance(r.content) == without_provenance(api.content)
        else:
            assert r.content == api.content, fmt
        assert r.headers["content-disposition"] == api.headers["content-disposition"]
    assert (
        f'href="/dashboard/programs/{shop.program_id}/finance/export?period={PERIOD}&amp;format=xlsx"' in html
    )

    bad = client.get(dashboard_path(shop, "/finance?period=2026-13"))
    assert bad.status_code == 422 and "validation_error" in bad.text
    bad = client.get(dashboard_path(shop, f"/finance/export?period={PERIOD}&format=json"))
    assert bad.status_code == 422


def test_dashboard_finance_of_another_workspace_is_a_404_page(shop: World, client: TestClient) -> None:
    other = make_world_in_new_workspace(client)
    logged_in(client, other)
    for suffix in (f"/finance?period={PERIOD}", f"/finance/export?period={PERIOD}&format=csv"):
        r = client.get(dashboard_path(shop, suffix))
        assert r.status_code == 404 and "program_not_found" in r.text


def make_world_in_new_workspace(client: TestClient | httpx.Client) -> str:
    r = client.post(
        "/api/v1/operator/accounts", json={"email": "finance@else.test", "workspace_name": "Else"}, headers=OP
    )
    token: str = r.json()["data"]["token"]
    return token


def test_reports_json_is_compact_and_stable(shop: World) -> None:
    body = shop.client.get(finance_url(shop), headers=shop.owner).content
    assert json.loads(body)["data"]["period"] == PERIOD
    assert b"generated" not in body and b"run_id" not in body


def test_reads_of_the_materialised_tables_run_off_the_event_loop(
    shop: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of the reconciled tables (API, dashboard, reports) runs in a worker thread:
    a large month never stalls the requests the event loop is serving meanwhile."""
    seen: list[tuple[str, bool]] = []

    def watched(name: str, read: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                on_loop = True
            except RuntimeError:
                on_loop = False
            seen.append((name, on_loop))
            return read(*args, **kwargs)

        return run

    for module, name in ((reads, "sales"), (reads, "explain"), (reads, "commissions"), (load, "finance")):
        monkeypatch.setattr(module, name, watched(name, getattr(module, name)))
    monkeypatch.setattr(load, "double_counting", watched("double_counting", load.double_counting))
    c, pid = shop.client, shop.program_id
    api = f"/api/v1/programs/{pid}"
    for path in (
        f"{api}/sales",
        f"{api}/sales/in_1/explain",
        f"{api}/commissions?period={PERIOD}",
        finance_url(shop),
        doubles_url(shop, f"period={PERIOD}"),
    ):
        assert c.get(path, headers=shop.owner).status_code == 200, path
    logged_in(c, shop.account_token)
    for page in ("/sales", "/sales/in_1", f"/finance?period={PERIOD}"):
        assert c.get(f"/dashboard/programs/{pid}{page}").status_code == 200, page
    assert {name for name, _ in seen} == {"sales", "explain", "commissions", "finance", "double_counting"}
    assert not any(on_loop for _, on_loop in seen), seen


def _csv_rows(r: httpx.Response) -> list[dict[str, str]]:
    """A CSV download's rows, after checking it is one (content type, attachment, BOM)."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.headers["content-disposition"].startswith("attachment; filename=")
    assert r.content.startswith("\ufeff".encode())  # a BOM: spreadsheets read UTF-8 names right
    return list(csv.DictReader(io.StringIO(r.content.decode("utf-8-sig"))))


def test_sales_and_commissions_as_csv_line_items(shop: World, client: TestClient) -> None:
    """The same rows as the JSON reads, one per line, with the JSON's columns and values (money
    in minor units), then each money column in whole units beside the currency (`_decimal`: the
    EUR checkout sale keeps its cents)."""
    base = f"/api/v1/programs/{shop.program_id}"
    sales = client.get(f"{base}/sales", headers=shop.owner).json()["data"]
    rows = _csv_rows(client.get(f"{base}/sales?format=csv", headers=shop.owner))
    assert [r["transaction_id"] for r in rows] == [s["transaction_id"] or "" for s in sales]
    by_txn = {r["transaction_id"]: r for r in rows}
    in_1 = by_txn["in_1"]
    assert (in_1["amount"], in_1["amount_decimal"], in_1["currency"]) == ("10000", "100.00", "usd")
    assert (in_1["commission"], in_1["commission_decimal"]) == ("2250", "22.50")
    assert (in_1["refunded"], in_1["refunded_decimal"]) == ("2500", "25.00")
    assert (in_1["partner_code"], in_1["test_mode"]) == ("alice", "false")
    assert by_txn["in_2"]["partner_code"] == ""
    (eur,) = [r for r in rows if r["currency"] == "eur"]
    assert (eur["gross_amount_decimal"], eur["tax_decimal"], eur["amount_decimal"]) == (
        "9.99",
        "0.65",
        "9.34",
    )
    assert (eur["gross_amount"], eur["tax"], eur["amount"]) == ("999", "65", "934")
    assert (eur["commission_decimal"], eur["platform_fee_decimal"]) == ("2.80", "0.93")

    lines = client.get(f"{base}/commissions?period=2026-01", headers=shop.owner).json()["data"]
    rows = _csv_rows(client.get(f"{base}/commissions?period=2026-01&format=csv", headers=shop.owner))
    assert len(rows) == len(lines) > 0
    money = ["amount", "gross", "reversed", "platform_fee"]
    # the JSON row's columns, in its order, then the money's whole-unit twins
    assert list(rows[0]) == [*lines[0], *(f"{m}_decimal" for m in money)]
    for row, line in zip(rows, lines, strict=True):
        assert int(row["amount"]) == line["amount"], (row, line)
        assert minor(Decimal(row["amount_decimal"]), row["currency"]) == line["amount"], (row, line)
        assert row["currency"] == line["currency"] and row["status"] == line["status"]

    r = client.get(f"{base}/sales?format=xlsx", headers=shop.owner)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == "format"


def test_line_item_money_follows_the_currency_decimals() -> None:
    from reports.lineitems import to_csv

    rows = [
        {"amount": 1500, "currency": "jpy", "when": None},
        {"amount": 12345, "currency": "kwd", "when": None},
        {"amount": -250, "currency": "usd", "when": None},
        {"amount": 7, "currency": None, "when": None},
    ]
    text = to_csv(rows, ("amount", "currency", "when"), ("amount",)).decode("utf-8-sig")
    assert text.splitlines() == [
        "amount,currency,when,amount_decimal",
        "1500,jpy,,1500",
        "12345,kwd,,12.345",
        "-250,usd,,-2.50",
        "7,,,7",
    ]


def test_commissions_are_paginated_like_sales(world: World, client: TestClient) -> None:
    """`limit` (default 100, at most 1000) and `offset`, as the sales read; the CSV pages alike."""
    click = client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
    ).json()["data"]["click_id"]
    lead = {"customer_external_id": "cust_1", "click_id": click}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    for n in range(105):
        assert world.sale(transaction_id=f"in_{n:03}", amount=1000 + n).status_code == 200
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    base = f"/api/v1/programs/{world.program_id}/commissions"

    def page(query: str) -> list[dict[str, Any]]:
        r = client.get(f"{base}?{query}", headers=world.owner)
        assert r.status_code == 200, r.text
        rows: list[dict[str, Any]] = r.json()["data"]
        return rows

    every = page("limit=1000")
    assert len(every) == 105 and {line["transaction_id"] for line in every} == {
        f"in_{n:03}" for n in range(105)
    }
    assert page("") == every[:100]  # the default page
    assert page("limit=40") + page("limit=40&offset=40") + page("offset=80&limit=40") == every
    assert page("offset=105") == []
    period = every[0]["period"]
    assert (
        page(f"period={period}&limit=5&offset=3") == [line for line in every if line["period"] == period][3:8]
    )
    for query, field in (("limit=1001", "limit"), ("limit=-1", "limit"), ("offset=x", "offset")):
        r = client.get(f"{base}?{query}", headers=world.owner)
        assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == field, r.text
    assert len(_csv_rows(client.get(f"{base}?format=csv", headers=world.owner))) == 100
    rows = _csv_rows(client.get(f"{base}?format=csv&limit=10&offset=100", headers=world.owner))
    assert [r["transaction_id"] for r in rows] == [line["transaction_id"] for line in every[100:]]
