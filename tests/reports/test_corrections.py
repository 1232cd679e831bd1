"""The finance report lists its corrections where its summary counts them: the adjustment lines
in `adjustments`, the clawback lines in `clawbacks`, in every format; and says whether the month
is closed (when, by whom) in the JSON and CSV as the html does."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from datetime import UTC, datetime

import openpyxl

from reports.finance import FinanceReport, Provenance, from_result
from reports.render import finance_data, render
from tests.helpers import parse_finance_csv
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reports.scenario import FEBRUARY, JANUARY, PROGRAM, january, run


def _february() -> FinanceReport:
    """January closed; in February a refund of s2 (pending in the closed month: an adjustment)
    and, after s1's approval on Feb 9, a refund of s1 (a clawback)."""
    rows = [
        *january(),
        b.period_close("close_jan", JANUARY),
        b.track_refund("re_2b", "tx_2", 2_000, occurred_at=at(26)),
        b.track_refund("re_1c", "tx_1", 1_000, occurred_at=at(31)),
        b.track_sale("s10", "tx_10", 12_000, customer_key="ck_1", occurred_at=at(27)),
    ]
    return from_result(run(rows), PROGRAM, FEBRUARY, "Brand partners")


def test_adjustments_list_the_adjustment_lines_and_clawbacks_the_clawback_lines() -> None:
    report = _february()
    data = finance_data(report)
    [usd] = [s for s in data["summary"] if s["currency"] == "usd"]
    assert (usd["adjustments_count"], usd["adjustments"], usd["clawbacks_count"], usd["clawbacks"]) == (
        1,
        -600,
        1,
        -300,
    )
    adjustments = [(r["transaction_id"], r["kind"], r["commission"]) for r in data["adjustments"]]
    clawbacks = [(r["transaction_id"], r["kind"], r["commission"]) for r in data["clawbacks"]]
    assert adjustments == [("tx_2", "adjustment", -600)]
    assert clawbacks == [("tx_1", "clawback", -300)]
    checks = {c["name"]: c["ok"] for c in data["checks"] if c["currency"] == "usd"}
    assert {name: checks[name] for name in ("adjustment_lines", "adjustment_lines_count")} == {
        "adjustment_lines": True,
        "adjustment_lines_count": True,
    }
    assert checks["clawback_lines"] and checks["clawback_lines_count"] and report.reconciled

    # the CSV's sections are the JSON's
    parsed = parse_finance_csv(render(report, "csv")[0].decode())
    assert [row["transaction_id"] for row in parsed["adjustments"]] == ["tx_2"]
    assert [row["transaction_id"] for row in parsed["clawbacks"]] == ["tx_1"]

    # the html: one table each, in the currency's section
    html = render(report, "html")[0].decode()

    def table(table_id: str) -> str:
        found = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.DOTALL)
        assert found is not None, table_id
        return found.group(1)

    assert "tx_2" in table("adjustments-usd") and "tx_1" not in table("adjustments-usd")
    assert "tx_1" in table("clawbacks-usd") and "tx_2" not in table("clawbacks-usd")
    assert table("adjustments-usd").count("<tr>") == 1 + 1  # the header, one line
    assert table("clawbacks-usd").count("<tr>") == 1 + 1

    # the xlsx: a sheet each
    book = openpyxl.load_workbook(io.BytesIO(render(report, "xlsx")[0]))
    sheets = {
        name: [r for r in book[name].iter_rows(min_row=2, values_only=True) if any(r)]
        for name in ("Adjustments", "Clawbacks")
    }
    assert [(r[2], r[4]) for r in sheets["Adjustments"]] == [("tx_2", "adjustment")]
    assert [(r[2], r[4]) for r in sheets["Clawbacks"]] == [("tx_1", "clawback")]


CLOSED_AT = datetime(2026, 2, 1, 9, 30, tzinfo=UTC)


def test_the_json_and_csv_say_whether_the_month_is_closed_when_and_by_whom() -> None:
    report = from_result(run(january()), PROGRAM, JANUARY, "Brand partners")
    generated = datetime(2026, 2, 14, tzinfo=UTC)
    open_month = replace(report, provenance=Provenance(generated, "run_1", generated, None))
    closed = replace(report, provenance=Provenance(generated, "run_1", generated, CLOSED_AT, "acc_owner"))

    data = json.loads(render(open_month, "json")[0])["data"]
    assert (data["closed"], data["closed_at"], data["closed_by"]) == (False, None, None)
    data = json.loads(render(closed, "json")[0])["data"]
    assert (data["closed"], data["closed_at"], data["closed_by"]) == (
        True,
        "2026-02-01T09:30:00Z",
        "acc_owner",
    )
    [scalars] = parse_finance_csv(render(closed, "csv")[0].decode())["report"]
    assert (scalars["closed"], scalars["closed_at"], scalars["closed_by"]) == (
        "true",
        "2026-02-01T09:30:00Z",
        "acc_owner",
    )
    html = render(closed, "html")[0].decode()
    assert 'id="month-closed"' in html and '<code id="closed-by">acc_owner</code>' in html
    book = openpyxl.load_workbook(io.BytesIO(render(closed, "xlsx")[0]))
    assert book["Summary"]["E4"].value == "closed on 2026-02-01 09:30 UTC by acc_owner"
    # nothing in the JSON or CSV depends on when the report was generated
    later = replace(closed, provenance=replace(closed.provenance, generated_at=CLOSED_AT, run_id="run_2"))  # type: ignore[type-var]
    for fmt in ("json", "csv"):
        assert render(later, fmt)[0] == render(closed, fmt)[0]
