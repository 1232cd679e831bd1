"""Rendering reports: `render(report, fmt) -> (body, content_type, filename)`.

Formats (the same figures in each; nothing in a body depends on when it was rendered, except
the html's provenance line, which says when the loader built the report and from which reconcile
run, and whether the month is closed: see `FinanceReport.provenance`):

- `json`: the contract's envelope, `{"data": ...}`; amounts are integer minor units.
Every CSV is in the one format of reports/csvcells.py (a BOM, CRLF, the JSON's values with money
in minor units, and whole-unit `_decimal` twins of the money):

- `csv` (finance): one long table `section,row,currency,metric,value,value_decimal`. `section`
  is a key of the JSON data (`report` for its scalar fields), `row` the 1-based index of the row
  in that JSON array, `metric` a field of that row (every field but `currency`) and `value` its
  JSON value: integers (minor units for money) as digits, booleans `true`/`false`, null empty.
  Grouping the lines by (section, row) gives back the JSON rows exactly. `value_decimal` is the
  money of a money line in whole units of its currency, empty on every other line.
- `csv` (double counting): one row per double count with the JSON fields as columns, then
  `amount_decimal` and `distinct_amount_decimal`; `connect_record_ids` space-separated,
  `occurred_at` RFC 3339, `partner_mismatch` true/false; summing `distinct_amount` counts each
  sale seen twice once (reports/double_counting.py).
- `xlsx` (finance): see reports/xlsx.py; amounts are whole currency units there, and the month's
  sales and commission lines (the `format=csv` line items) have sheets of their own.
- `html` (finance): a standalone page with its charts inline (reports/html.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import polars as pl

from reports import csvcells
from reports.double_counting import DoubleCountingReport
from reports.finance import FinanceReport
from reports.html import finance_document
from reports.labels import COUNT_CHECKS, is_money
from reports.xlsx import finance_xlsx

if TYPE_CHECKING:
    from reports.lineitems import LineItems

FINANCE_FORMATS = ("json", "csv", "html", "xlsx")
DOUBLE_COUNTING_FORMATS = ("json", "csv")
CONTENT_TYPES = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}
# JSON key -> FinanceReport attribute, in the order every format shows them.
SECTIONS = {
    "summary": "summary",
    "commissions_by_status": "by_status",
    "commissions_by_partner": "by_partner",
    "adjustments": "adjustments",
    "clawbacks": "clawbacks",
    "unattributed_by_reason": "unattributed",
    "double_counts": "double_counts",
    "checks": "checks",
}
CSV_HEADER = ("section", "row", "currency", "metric", "value", "value_decimal")
DOUBLE_COUNT_MONEY = ("amount", "distinct_amount")
# The JSON's scalar fields, as the CSV's `report` rows.
REPORT_FIELDS = ("program_id", "program_name", "period", "reconciled", "closed", "closed_at", "closed_by")


class UnknownFormat(ValueError):
    """Raised by `render` when a report has no renderer for the requested format."""


def _rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.items()} for row in frame.iter_rows(named=True)]


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return value


def finance_data(report: FinanceReport) -> dict[str, Any]:
    """The JSON `data` of a finance report. `closed`: whether the month is closed (its figures
    are then the books as of the close), with `closed_at` and `closed_by` (null while open)."""
    pv = report.provenance
    closed_at = pv.closed_at if pv is not None else None
    data: dict[str, Any] = {
        "program_id": report.program_id,
        "program_name": report.program_name,
        "period": report.period,
        "currencies": list(report.currencies),
        "reconciled": report.reconciled,
        "closed": closed_at is not None,
        "closed_at": _plain(closed_at),
        "closed_by": pv.closed_by if pv is not None and closed_at is not None else None,
    }
    for key, attribute in SECTIONS.items():
        data[key] = _rows(getattr(report, attribute))
    return data


def double_counting_data(report: DoubleCountingReport) -> dict[str, Any]:
    return {
        "program_id": report.program_id,
        "period": report.period,
        "summary": _rows(report.summary),
        "totals": _rows(report.totals),
        "double_counts": _rows(report.rows),
    }


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps({"data": data}, ensure_ascii=False, separators=(",", ":")).encode()


def is_money_line(section: str, row: dict[str, Any], metric: str) -> bool:
    """Whether a line of the finance CSV is money: an integer field that counts nothing (a
    check's totals are money unless the check counts lines, reports/labels.py)."""
    value = row[metric]
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    if section == "checks" and metric in ("expected", "actual"):
        return row["name"] not in COUNT_CHECKS
    return is_money(metric)


def _finance_lines(report: FinanceReport) -> Iterator[tuple[Any, ...]]:
    data = finance_data(report)
    for metric in REPORT_FIELDS:
        yield ("report", 1, "", metric, csvcells.value(data[metric]), "")
    for section in SECTIONS:
        for number, row in enumerate(data[section], start=1):
            currency = row["currency"]
            for metric, value in row.items():
                if metric != "currency":
                    money = csvcells.decimal(value, currency) if is_money_line(section, row, metric) else ""
                    yield (section, number, currency, metric, csvcells.value(value), money)


def finance_csv(report: FinanceReport) -> bytes:
    return csvcells.document(CSV_HEADER, _finance_lines(report))


def double_counting_csv(report: DoubleCountingReport) -> bytes:
    header = (*report.rows.columns, *csvcells.decimal_columns(DOUBLE_COUNT_MONEY))
    return csvcells.document(
        header,
        (
            [csvcells.value(v) for v in row.values()]
            + [csvcells.decimal(row[m], row["currency"]) for m in DOUBLE_COUNT_MONEY]
            for row in _rows(report.rows)
        ),
    )


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def filename(report: FinanceReport | DoubleCountingReport, fmt: str) -> str:
    if isinstance(report, FinanceReport):
        return f"finance-{_safe(report.program_id)}-{report.period}.{fmt}"
    suffix = f"-{report.period}" if report.period else ""
    return f"double-counting-{_safe(report.program_id)}{suffix}.{fmt}"


def render(
    report: FinanceReport | DoubleCountingReport, fmt: str, lines: LineItems | None = None
) -> tuple[bytes, str, str]:
    """The report as `fmt`: (body, content type, file name). The finance xlsx carries the
    month's line items (`lines`, reports/lineitems.py) on sheets of their own when given."""
    body: bytes
    if isinstance(report, DoubleCountingReport):
        if fmt == "json":
            body = _json(double_counting_data(report))
        elif fmt == "csv":
            body = double_counting_csv(report)
        else:
            raise UnknownFormat(f"the double-counting report has no {fmt} format")
    elif fmt == "json":
        body = _json(finance_data(report))
    elif fmt == "csv":
        body = finance_csv(report)
    elif fmt == "xlsx":
        body = finance_xlsx(report, lines)
    elif fmt == "html":
        body = finance_document(report).encode()
    else:
        raise UnknownFormat(f"the finance report has no {fmt} format")
    return body, CONTENT_TYPES[fmt], filename(report, fmt)
