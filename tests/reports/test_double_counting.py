"""The double-counting report: every sale seen twice, json and csv agreeing, a month at a time."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import polars as pl
import pytest

from reports.double_counting import DoubleCountingReport, build_double_counting
from reports.load import month_bounds
from reports.money import units
from reports.render import UnknownFormat, render
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reports.scenario import JANUARY, PROGRAM, january, run


def report_for(period: str | None = None) -> DoubleCountingReport:
    rows = [*january(), b.track_sale("s1_feb", "tx_1", 500, outcome="duplicate", occurred_at=at(30))]
    frame = run(rows).double_counts.filter(pl.col("program_id") == PROGRAM)
    if period is not None:
        start, end = month_bounds(period)
        frame = frame.filter((pl.col("occurred_at") >= start) & (pl.col("occurred_at") < end))
    return build_double_counting(frame, program_id=PROGRAM, period=period)


def test_rows_and_summary() -> None:
    report = report_for()
    assert report.rows.select(
        "kind", "transaction_id", "sale_id", "duplicate_id", "matched_on", "amount"
    ).rows() == [
        ("ingest_refused", "tx_1", "s1", "s1_again", "transaction_id", 10_000),
        ("connect_and_self_hosted", "pi_9", "cs_9", "s9", "payment_intent_id", 3_000),
        ("ingest_refused", "tx_1", "s1", "s1_feb", "transaction_id", 500),
    ]
    # s1's two refused retries are one sale: its money once (the first line's), not 10,500
    assert report.rows.get_column("distinct_amount").to_list() == [10_000, 3_000, 0]
    assert report.summary.rows() == [
        ("usd", "connect_and_self_hosted", 1, 3_000, 0),
        ("usd", "ingest_refused", 2, 10_000, 0),
    ]
    assert report.totals.rows() == [("usd", 3, 2, 13_000, 0)]
    # the partners each record named: a retry without a customer key names nobody (no mismatch)
    assert report.rows.select("partner_code", "duplicate_partner_code", "partner_mismatch").rows() == [
        ("p1", "p1", False),
        ("p2", None, False),
        ("p1", None, False),
    ]
    january_only = report_for(JANUARY)
    assert january_only.rows.get_column("duplicate_id").to_list() == ["s1_again", "s9"]
    february = report_for("2026-02")  # s1's money was counted in January, on its first line
    assert february.totals.rows() == [("usd", 1, 1, 0, 0)]
    assert render(january_only, "csv")[2] == f"double-counting-{PROGRAM}-{JANUARY}.csv"


def test_csv_parses_back_to_the_json() -> None:
    report = report_for()
    data = json.loads(render(report, "json")[0])["data"]
    assert data["program_id"] == PROGRAM and data["period"] is None
    assert data["double_counts"][1]["occurred_at"] == "2026-01-18T12:00:00Z"
    body, content_type, filename = render(report, "csv")
    assert (content_type, filename) == ("text/csv; charset=utf-8", f"double-counting-{PROGRAM}.csv")
    assert body.startswith("\ufeff".encode())  # the one CSV format (reports/csvcells.py)
    rows = list(csv.DictReader(io.StringIO(body.decode("utf-8-sig"))))
    assert len(rows) == len(data["double_counts"]) == 3
    for row, expected in zip(rows, data["double_counts"], strict=True):
        # the JSON's fields in its order, then the money's whole-unit twins
        assert list(row) == [*expected, "amount_decimal", "distinct_amount_decimal"]
        for money in ("amount", "distinct_amount"):
            assert Decimal(row[f"{money}_decimal"]) == units(expected[money], expected["currency"])
        for key, value in expected.items():
            if isinstance(value, list):
                assert row[key].split() == value
            elif isinstance(value, bool):
                assert row[key] == ("true" if value else "false"), key
            else:
                assert row[key] == ("" if value is None else str(value)), key


def test_only_json_and_csv() -> None:
    with pytest.raises(UnknownFormat):
        render(report_for(), "xlsx")
