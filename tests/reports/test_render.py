"""Renderers: csv and xlsx parsed back and compared with the json; the html page and its charts."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import zipfile
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import openpyxl
import polars as pl
import pytest

from reports import charts, reads
from reports.finance import FinanceReport, from_result, rechecked
from reports.html import DOCUMENT_CSP, STYLESHEET
from reports.labels import COLUMN_LABELS, SUMMARY_LABELS, check_label, is_money
from reports.lineitems import COMMISSION_MONEY, LineItems, columns_of
from reports.money import excel_format, minor
from reports.render import REPORT_FIELDS, SECTIONS, finance_data, render
from tests.helpers import as_cell, parse_finance_csv
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reports.scenario import FEBRUARY, JANUARY, PROGRAM, january, run


def _february() -> FinanceReport:
    """A month with adjustment lines: January closed, then a refund of a January sale in February."""
    rows = [
        *january(),
        b.period_close("close_jan", JANUARY),
        b.track_refund("re_1b", "tx_1", 6_667, occurred_at=at(26)),
        b.track_sale("s10", "tx_10", 12_000, customer_key="ck_1", occurred_at=at(27)),
        b.track_sale("s11", "tx_11", 90_000, customer_key="ck_1", currency="jpy", occurred_at=at(28)),
    ]
    return from_result(run(rows), PROGRAM, FEBRUARY, "Brand partners")


REPORTS = {
    "january": lambda: from_result(run(january()), PROGRAM, JANUARY, "Brand partners"),
    "february": _february,
}


@pytest.fixture(scope="module", params=sorted(REPORTS))
def report(request: pytest.FixtureRequest) -> FinanceReport:
    built: FinanceReport = REPORTS[request.param]()
    return built


def test_json_is_the_contract_envelope(report: FinanceReport) -> None:
    body, content_type, filename = render(report, "json")
    assert content_type == "application/json"
    assert filename == f"finance-{PROGRAM}-{report.period}.json"
    parsed = json.loads(body)
    assert list(parsed) == ["data"]
    assert parsed["data"] == finance_data(report)
    assert list(parsed["data"])[:5] == ["program_id", "program_name", "period", "currencies", "reconciled"]


def test_csv_parses_back_to_the_json(report: FinanceReport) -> None:
    body, content_type, filename = render(report, "csv")
    assert (content_type, filename) == ("text/csv; charset=utf-8", f"finance-{PROGRAM}-{report.period}.csv")
    parsed = parse_finance_csv(body.decode())
    data = finance_data(report)
    assert parsed.pop("report") == [{k: as_cell(data[k]) for k in REPORT_FIELDS}]
    expected = {
        section: [{k: as_cell(v) for k, v in row.items()} for row in data[section]]
        for section in SECTIONS
        if data[section]
    }
    assert parsed == expected
    assert sum(len(rows) for rows in parsed.values()) > 10


def test_february_has_adjustments_in_every_format() -> None:
    feb = _february()
    assert feb.adjustments.height == 1
    assert "adjustments" in parse_finance_csv(render(feb, "csv")[0].decode())
    assert b'id="adjustments-usd"' in render(feb, "html")[0]


# -- xlsx ------------------------------------------------------------------------------------------
def money_cells(row: tuple[Any, ...], currency: str) -> list[Any]:
    """Cell values with amounts (floats/ints in currency units) turned back into minor units."""
    return [minor(Decimal(str(v)), currency) if isinstance(v, (int, float)) else v for v in row]


def sheet_rows(book: Any, name: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in book[name].iter_rows(values_only=True) if any(v is not None for v in r)]


def test_xlsx_parses_back_to_the_json(report: FinanceReport) -> None:
    body, content_type, filename = render(report, "xlsx")
    assert content_type == "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    assert filename.endswith(".xlsx")
    data = finance_data(report)
    book = openpyxl.load_workbook(io.BytesIO(body))
    assert book.sheetnames == [
        "Summary",
        "By partner",
        "Adjustments",
        "Clawbacks",
        "Unattributed",
        "Double counts",
    ]

    summary = book["Summary"]
    assert summary["B3"].value == report.period
    assert summary["B4"].value == "yes"
    header = [c.value for c in summary[7]]
    assert header[: 1 + len(report.currencies)] == ["Figure", *(c.upper() for c in report.currencies)]
    for offset, (field, label) in enumerate(SUMMARY_LABELS.items(), start=8):
        cells = [c.value for c in summary[offset]]
        assert cells[0] == label
        for col, row in enumerate(data["summary"], start=1):
            value = cells[col]
            assert isinstance(value, (int, float)), (field, value)
            got = minor(Decimal(str(value)), row["currency"]) if is_money(field) else value
            assert got == row[field], (field, row["currency"])

    partners = sheet_rows(book, "By partner")
    fields = list(data["commissions_by_partner"][0]) if data["commissions_by_partner"] else []
    assert partners[0][: len(fields)] == tuple(COLUMN_LABELS[f] for f in fields)
    back = [dict(zip(fields, _typed(fields, r[: len(fields)]), strict=True)) for r in partners[1:]]
    assert back == data["commissions_by_partner"]

    for sheet, section in (
        ("Adjustments", "adjustments"),
        ("Clawbacks", "clawbacks"),
        ("Unattributed", "unattributed_by_reason"),
        ("Double counts", "double_counts"),
    ):
        rows = sheet_rows(book, sheet)
        frame_fields = list(getattr(report, SECTIONS[section]).columns)
        assert rows[0] == tuple(COLUMN_LABELS[f] for f in frame_fields)
        assert [dict(zip(frame_fields, _typed(frame_fields, r), strict=True)) for r in rows[1:]] == data[
            section
        ]

    checks = [
        r for r in sheet_rows(book, "Summary") if r[1] in {check_label(c["name"]) for c in data["checks"]}
    ]
    assert len(checks) == len(data["checks"]) and all(r[4] == "ok" for r in checks)

    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        charts_in_book = [n for n in archive.namelist() if n.startswith("xl/charts/chart")]
    with_partners = report.by_partner.get_column("currency").unique().len()
    assert len(charts_in_book) == with_partners >= 1


def _typed(fields: list[str], cells: tuple[Any, ...]) -> list[Any]:
    """Cells back to JSON values: amounts to minor units of the row's currency, counts to int."""
    currency = cells[fields.index("currency")]
    out = []
    for field, value in zip(fields, cells, strict=True):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(minor(Decimal(str(value)), currency) if is_money(field) else int(value))
        else:
            out.append(None if value == "" else value)
    return out


def test_xlsx_amounts_are_numbers_in_currency_units() -> None:
    feb = _february()
    book = openpyxl.load_workbook(io.BytesIO(render(feb, "xlsx")[0]))
    rows = {r[1]: r for r in sheet_rows(book, "By partner")[1:] if r[0] == "jpy"}
    assert rows["p1"][3] == 27_000  # 30 % of 90,000 JPY: zero decimals, whole yen
    usd = {r[1]: r for r in sheet_rows(book, "By partner")[1:] if r[0] == "usd"}
    assert usd["p1"][3] == pytest.approx(16.0)  # 36.00 for s10 - 20.00 adjustment
    assert book["By partner"].cell(2, 4).number_format.startswith("#,##0")


def test_xlsx_keeps_text_as_text() -> None:
    """A transaction id or program name that looks like a formula or a link stays a string."""
    feb = _february()
    sneaky = replace(
        feb,
        program_name='=HYPERLINK("http://evil.test")',
        adjustments=feb.adjustments.with_columns(transaction_id=pl.lit("=1+1")),
    )
    book = openpyxl.load_workbook(io.BytesIO(render(sneaky, "xlsx")[0]))
    cell = book["Adjustments"]["C2"]
    assert (cell.value, cell.data_type) == ("=1+1", "s")
    program = book["Summary"]["B2"]
    assert program.data_type == "s" and program.value.startswith("=HYPERLINK") and program.hyperlink is None


# -- html -------------------------------------------------------------------------------------------
def test_html_page_is_self_contained_with_charts_and_tables(report: FinanceReport) -> None:
    body, content_type, filename = render(report, "html")
    html = body.decode()
    assert content_type == "text/html; charset=utf-8" and filename.endswith(".html")
    assert html.startswith("<!doctype html>")
    for code in report.by_partner.get_column("currency").unique().to_list():
        assert f'id="chart-partners-{code}"' in html and f'id="chart-status-{code}"' in html
        assert f'id="partners-{code}"' in html and f'id="checks-{code}"' in html
    assert html.count("<svg ") == 2 * report.by_partner.get_column("currency").n_unique()
    assert 'id="summary"' in html and 'id="reconciled"' in html
    # nothing to fetch, nothing to run, nothing the CSP would refuse
    assert "<script" not in html and " style=" not in html and "<img" not in html
    assert not re.search(r'(src|href)="(https?:)?//', html)
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert style and style.group(1) == STYLESHEET and html.count("<style") == 1
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    assert f"'sha256-{digest}'" in DOCUMENT_CSP
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "ids are unique across the page's charts and tables"


def test_html_shows_money_in_currency_units_and_failed_checks() -> None:
    report = from_result(run(january()), PROGRAM, JANUARY, "Brand partners")
    html = render(report, "html")[0].decode()
    assert "83.00 USD" in html and "15.00 USD" in html and "15.00 EUR" in html and "435.00 USD" in html
    broken = report.by_partner.with_columns(commission=pl.col("commission") + 1)
    bad = render(rechecked(replace(report, by_partner=broken)), "html")[0].decode()
    assert 'id="not-reconciled"' in bad and "FAILED" in bad and 'class="bad"' in bad


# -- charts -------------------------------------------------------------------------------------------
def partner_rows(n: int) -> list[dict[str, Any]]:
    return [{"partner_code": f"partner_{i:02d}", "commission": 10_000 - i * 100} for i in range(n)]


def test_chart_svg_is_inline_safe_and_deterministic() -> None:
    svg = charts.partners_chart(partner_rows(3), "usd")
    assert svg.startswith("<svg ") and svg.endswith("</svg>")
    assert "style=" not in svg and "<style" not in svg and "<?xml" not in svg
    assert 'fill="#2f5fb3"' in svg
    assert all(i.startswith("partners-usd-") for i in re.findall(r'\bid="([^"]+)"', svg))
    refs = re.findall(r'(?:url\(#|xlink:href="#)([^")]+)', svg)
    assert refs and all(r.startswith("partners-usd-") for r in refs)
    assert charts.partners_chart(partner_rows(3), "usd") == svg
    assert charts.partners_chart(partner_rows(3), "eur") != svg


def test_chart_groups_partners_beyond_the_largest_twelve() -> None:
    svg = charts.partners_chart(partner_rows(20), "jpy")
    assert "<!-- 8 others -->" in svg
    assert "<!-- partner_11 -->" in svg and "<!-- partner_12 -->" not in svg


def test_style_declarations_without_a_presentation_attribute_are_refused() -> None:
    with pytest.raises(ValueError, match="font"):
        charts.inline_svg('<svg x="1"><text style="font: 10px sans">a</text></svg>', "p-")


def test_xlsx_line_item_sheets_keep_text_as_text_and_filter_an_empty_month() -> None:
    """The line-item sheets: an id that looks like a formula stays a string; warnings read as
    the CSV writes them; a month without commission lines still has its header and filters."""
    sale = dict.fromkeys(reads.SALE_FIELDS)
    sale |= {
        "sale_id": "s1",
        "transaction_id": "=1+1",
        "amount": 1_250,
        "currency": "eur",
        "warnings": ["click_not_found", "metadata_fixed"],
        "test_mode": False,
        "occurred_at": datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC),
    }
    body = render(_february(), "xlsx", LineItems(sales=[sale], commissions=[]))[0]
    book = openpyxl.load_workbook(io.BytesIO(body))
    sales = book["Sales"]
    columns = [c.value for c in sales[1]]
    row = dict(zip(columns, sales[2], strict=True))
    assert (row["transaction_id"].value, row["transaction_id"].data_type) == ("=1+1", "s")
    assert row["warnings"].value == "click_not_found metadata_fixed" and row["test_mode"].value == "false"
    # minor units as in the CSV, and the whole-unit twin in the currency's format
    assert (row["amount"].value, row["amount"].number_format) == (1_250, "General")
    assert (row["amount_decimal"].value, row["amount_decimal"].number_format) == (12.5, excel_format("eur"))
    # a time is a date cell, in UTC (a spreadsheet has no time zones)
    assert row["occurred_at"].value.replace(tzinfo=UTC) == sale["occurred_at"]
    assert row["partner_code"].value is None
    empty = book["Commissions"]
    assert [c.value for c in empty[1]] == list(columns_of(reads.COMMISSION_FIELDS, COMMISSION_MONEY))
    assert empty.max_row == 1
    assert empty.freeze_panes == "A2" and empty.auto_filter.ref.endswith("1")
    assert "Sales" not in openpyxl.load_workbook(io.BytesIO(render(_february(), "xlsx")[0])).sheetnames
