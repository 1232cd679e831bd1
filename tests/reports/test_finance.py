"""The finance report builder and loader: exact figures from a real reconcile of a small log
(tests/reports/scenario.py), currencies kept apart, checks that catch tampering, closed months
that stay byte-identical, and the same report whether built from frames or read from DuckDB."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import openpyxl
import polars as pl
import pytest

from ingest.storage import migrations
from ingest.storage.duckdb.reader import DuckReader
from reconcile.run import job
from reports import load
from reports.finance import FinanceReport, from_result, rechecked
from reports.render import FINANCE_FORMATS, REPORT_FIELDS, SECTIONS, finance_data, render
from tests.helpers import as_cell, parse_finance_csv
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reports.scenario import FEBRUARY, JANUARY, NOW, PROGRAM, january, only, run


@pytest.fixture(scope="module")
def report() -> FinanceReport:
    return from_result(run(january()), PROGRAM, JANUARY, "Brand partners")


def test_usd_summary_has_exact_figures(report: FinanceReport) -> None:
    usd = only(report.summary, currency="usd")
    assert usd == {
        "currency": "usd",
        # s1 100 + s2 200 + s3 50 + s4 40 + cs_9 30 + s5 7 + s6 8 (the self-hosted pi_9 is not counted)
        "sales_count": 7,
        "gross_sales": 43_500,
        "tax": 0,
        # refunds that occurred in January: 33.33 of s1 and all 40 of s4 (s2's is in February)
        "refunds_count": 2,
        "refunds": 7_333,
        "net_sales": 36_167,
        "attributed_sales_count": 5,
        "attributed_sales": 42_000,
        "unattributed_sales_count": 2,
        "unattributed_sales": 1_500,
        "test_sales_count": 1,
        "test_sales": 900,
        "unmatched_refunds_count": 0,
        "unmatched_refunds": 0,
        "commission_lines": 5,
        # 30.00-10.00 (s1) + 60.00-6.00 (s2) + 12.00-12.00 (s4) + 9.00 (cs_9); s3's 15.00 is
        # a held self-referral: apart, in `held`
        "commissions": 8_300,
        "commissions_reversed": 2_800,
        # 5.00-1.67 + 10.00-1.00 + 2.50 + 2.00-2.00 + 1.50
        "platform_fees": 1_383,  # the held self-referral line's 250 is held with it
        "platform_fees_reversed": 467,
        "adjustments_count": 0,
        "adjustments": 0,
        "clawbacks_count": 0,
        "clawbacks": 0,
        # no payout batch yet: every commission (no clawback) is still unpaid
        "paid": 0,
        "unpaid": 8_300,
        "held": 1_500,
        "void": 0,
        # the connect/self-hosted pair (30.00) and the duplicate refused at ingest (100.00)
        "double_counts_count": 2,
        "double_counts_amount": 13_000,
    }


def test_commissions_by_status_and_by_partner(report: FinanceReport) -> None:
    usd = report.by_status.filter(pl.col("currency") == "usd")
    assert usd.select("status", "lines", "commission", "commission_reversed", "platform_fee").rows() == [
        ("pending", 2, 6_300, 600, 1_050),
        ("approved", 1, 2_000, 1_000, 333),
        ("held", 1, 1_500, 0, 250),
        ("reversed", 1, 0, 1_200, 0),
        ("void", 0, 0, 0, 0),
        ("paid", 0, 0, 0, 0),
    ]
    partners = report.by_partner.filter(pl.col("currency") == "usd").drop("currency")
    assert partners.to_dicts() == [
        {
            "partner_code": "p2",
            "lines": 3,
            "commission": 6_300,
            "commission_reversed": 1_800,
            "platform_fee": 1_050,
            "adjustments": 0,
            "clawbacks": 0,
            "pending": 6_300,
            "approved": 0,
            "held": 0,
            "reversed": 0,
            "void": 0,
            "paid": 0,
        },
        {
            "partner_code": "p1",
            "lines": 2,
            "commission": 2_000,  # the held line's 1_500 is in "held", not owed
            "commission_reversed": 1_000,
            "platform_fee": 333,
            "adjustments": 0,
            "clawbacks": 0,
            "pending": 0,
            "approved": 2_000,
            "held": 1_500,
            "reversed": 0,
            "void": 0,
            "paid": 0,
        },
    ]


def test_unattributed_reasons_double_counts_and_unknown_currency(report: FinanceReport) -> None:
    assert report.unattributed.rows() == [
        ("usd", "click_not_found", 1, 800),
        ("usd", "no_attribution_data", 1, 700),
    ]
    assert report.double_counts.rows() == [
        ("usd", "connect_and_self_hosted", 1, 3_000),
        ("usd", "ingest_refused", 1, 10_000),
    ]
    # a self-hosted refund of an unknown transaction has no currency: kept apart as `xxx`
    unknown = only(report.summary, currency="xxx")
    assert (unknown["unmatched_refunds_count"], unknown["unmatched_refunds"]) == (1, 100)
    assert unknown["refunds"] == unknown["commissions"] == 0


def test_currencies_are_never_summed(report: FinanceReport) -> None:
    assert report.currencies == ("eur", "usd", "xxx")
    eur = only(report.summary, currency="eur")
    assert (eur["sales_count"], eur["gross_sales"], eur["commissions"], eur["platform_fees"]) == (
        1,
        5_000,
        1_500,
        250,
    )
    assert report.by_partner.filter(pl.col("currency") == "eur").select("partner_code", "pending").rows() == [
        ("p1", 1_500)
    ]
    # no row of any section mixes currencies, and the usd figures are those of usd alone
    alone = from_result(run([r for r in january() if r.get("currency") != "eur"]), PROGRAM, JANUARY)
    assert only(alone.summary, currency="usd") == only(report.summary, currency="usd")
    data = finance_data(report)
    for section in ("summary", "commissions_by_status", "commissions_by_partner", "checks"):
        assert all(row["currency"] in {"eur", "usd", "xxx"} for row in data[section])
    assert "total" not in str(data.keys())


def test_checks_pass_for_the_real_report(report: FinanceReport) -> None:
    assert report.reconciled
    assert report.checks.height == 3 * 25
    assert report.checks.filter(pl.col("name") == "partners_commissions").select(
        "currency", "expected", "actual"
    ).rows() == [("eur", 1_500, 1_500), ("usd", 8_300, 8_300), ("xxx", 0, 0)]


def failed(report: FinanceReport) -> list[tuple[str, str]]:
    checks = rechecked(report).checks
    return checks.filter(~pl.col("ok")).select("currency", "name").rows()


def test_checks_fail_when_a_partner_line_is_tampered(report: FinanceReport) -> None:
    tampered = report.by_partner.with_columns(
        commission=pl.when(pl.col("partner_code") == "p1")
        .then(pl.col("commission") + 1)
        .otherwise("commission")
    )
    assert failed(replace(report, by_partner=tampered)) == [
        ("eur", "partners_commissions"),
        ("usd", "partners_commissions"),
    ]
    usd_p1 = (pl.col("partner_code") == "p1") & (pl.col("currency") == "usd")
    moved = report.by_partner.with_columns(  # the same total, under another status
        approved=pl.when(usd_p1).then(0).otherwise("approved"),
        held=pl.when(usd_p1).then(3_500).otherwise("held"),
    )
    assert failed(replace(report, by_partner=moved)) == [
        ("usd", "partners_approved"),
        ("usd", "partners_held"),
    ]
    dropped = report.by_partner.filter(pl.col("partner_code") != "p2")
    assert ("usd", "partners_commissions") in failed(replace(report, by_partner=dropped))
    assert not rechecked(replace(report, by_partner=dropped)).reconciled


def test_checks_fail_when_a_total_is_tampered(report: FinanceReport) -> None:
    summary = report.summary.with_columns(
        commissions=pl.when(pl.col("currency") == "usd")
        .then(pl.col("commissions") - 1)
        .otherwise("commissions"),
        net_sales=pl.when(pl.col("currency") == "eur").then(4_999).otherwise("net_sales"),
    )
    assert failed(replace(report, summary=summary)) == [
        ("eur", "net_sales"),
        ("usd", "partners_commissions"),
        ("usd", "payouts_commissions"),
        ("usd", "statuses_commissions"),
    ]
    statuses = report.by_status.with_columns(
        commission=pl.when(pl.col("status") == "held").then(0).otherwise("commission")
    )
    assert failed(replace(report, by_status=statuses)) == [  # held is apart from commissions
        ("usd", "statuses_held"),
        ("usd", "partners_held"),
    ]
    data = finance_data(rechecked(replace(report, by_status=statuses)))
    assert data["reconciled"] is False
    assert [c["name"] for c in data["checks"] if not c["ok"]] == ["statuses_held", "partners_held"]


# -- closed months, determinism ---------------------------------------------------------------
def test_a_closed_month_is_byte_identical_after_later_changes() -> None:
    """Closing January freezes its ledger lines; refunds and sales occurring later land in
    February (the refund as an adjustment), so every format of January's report is unchanged."""
    closed = [*january(), b.period_close("close_jan", JANUARY)]
    later = [
        *closed,
        b.track_refund("re_1b", "tx_1", 6_667, occurred_at=at(26)),  # empties s1, in February
        b.track_sale("s10", "tx_10", 12_000, customer_key="ck_1", occurred_at=at(27)),
    ]
    before, after = run(closed), run(later)
    for fmt in FINANCE_FORMATS:
        first = render(from_result(before, PROGRAM, JANUARY, "Brand"), fmt)
        assert render(from_result(after, PROGRAM, JANUARY, "Brand"), fmt) == first, fmt
    feb = from_result(after, PROGRAM, FEBRUARY)
    assert feb.adjustments.select(
        "currency", "sale_period", "transaction_id", "partner_code", "commission"
    ).rows() == [("usd", JANUARY, "tx_1", "p1", -2_000)]
    usd = only(feb.summary, currency="usd")
    assert (usd["refunds"], usd["sales_count"], usd["adjustments"], usd["commissions"]) == (
        2_000 + 6_667,  # s2's refund of Feb 4 and s1's of Feb 5
        1,
        -2_000,
        3_600 - 2_000,
    )
    assert feb.reconciled


def test_the_same_data_renders_the_same_bytes() -> None:
    for fmt in FINANCE_FORMATS:
        one = render(from_result(run(january()), PROGRAM, JANUARY, "Brand"), fmt)
        two = render(from_result(run(list(reversed(january()))), PROGRAM, JANUARY, "Brand"), fmt)
        assert one == two, fmt


# -- read back from DuckDB ------------------------------------------------------------------------
@pytest.fixture
def con(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(str(tmp_path / "tally.duckdb"))
    migrations.apply(connection)
    yield connection
    connection.close()


def test_the_loader_reads_the_same_report_the_pipeline_built(con: duckdb.DuckDBPyConnection) -> None:
    raw = b.frame(january())
    result = run(january())
    job.write(con, result, run_id="rcr_test", raw=raw, now=NOW, started=0.0)
    for period in (JANUARY, FEBRUARY, "2025-12"):
        read = load.finance(DuckReader(con.cursor()), PROGRAM, period, "Brand")
        built = from_result(result, PROGRAM, period, "Brand")
        assert finance_data(read) == finance_data(built), period
    assert load.finance(DuckReader(con.cursor()), "prog_other", JANUARY).currencies == ()


def _filled(sheet: Any) -> list[tuple[Any, ...]]:
    """The rows of an xlsx sheet with anything in them."""
    return [tuple(r) for r in sheet.iter_rows(values_only=True) if any(v is not None for v in r)]


def test_before_the_first_run_the_report_is_empty(con: duckdb.DuckDBPyConnection) -> None:
    """Every format renders the empty report: the program and month, no currency, no row."""
    empty = load.finance(DuckReader(con.cursor()), PROGRAM, JANUARY)
    assert empty.currencies == () and empty.reconciled is True and empty.checks.is_empty()
    head = dict.fromkeys(REPORT_FIELDS) | {"program_id": PROGRAM, "period": JANUARY, "reconciled": True}
    head["closed"] = False
    assert json.loads(render(empty, "json")[0]) == {
        "data": {**head, "currencies": [], **{section: [] for section in SECTIONS}}
    }
    assert parse_finance_csv(render(empty, "csv")[0].decode()) == {
        "report": [{k: as_cell(v) for k, v in head.items()}]
    }
    book = openpyxl.load_workbook(io.BytesIO(render(empty, "xlsx")[0]))
    summary, *tables = book.sheetnames
    assert all(len(_filled(book[name])) == 1 for name in tables)  # each sheet's headings alone
    figures = _filled(book[summary])
    figures = figures[figures.index(("Figure", None, None, None, None, None)) + 1 :]
    assert figures and all(row[1:] == (None,) * 5 for row in figures if row[0] != "Currency")
    assert b'id="no-activity"' in render(empty, "html")[0]
    assert load.double_counting(DuckReader(con.cursor()), PROGRAM).rows.is_empty()
