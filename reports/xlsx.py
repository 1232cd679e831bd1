"""The finance report as an Excel workbook (xlsxwriter).

Sheets: Summary (the figures per currency side by side, commissions by status, the checks),
By partner (with a native bar chart per currency), Adjustments, Unattributed, Double counts,
and, when the line items are given, Sales and Commissions: the rows `format=csv` gives for the
month (reports/lineitems.py), one line per row, headed by the CSV's column names, the header row
frozen and filters on every column; as in the CSV, a money column holds integer minor units and
its `_decimal` twin the whole-unit amount. A closed month's figures are its books as of the
close; its line items are the rows as they stand (a commission line of a closed month never
changes; a sale shows its refunds so far).
Elsewhere (and in the line items' `_decimal` columns) amounts are numbers in whole currency
units (the JSON's minor units / 10^decimals, exact to the currency's decimals) with a number
format naming the currency (each row its own); counts are integers; times are dates in UTC.
Currencies sit in separate columns or rows and are never added together. The file's creation
date is the first day of the period, so the same figures give the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import polars as pl
import xlsxwriter

from reports import csvcells, reads
from reports.csvcells import DECIMAL
from reports.finance import FinanceReport
from reports.labels import COLUMN_LABELS, COUNT_CHECKS, SUMMARY_LABELS, check_label, is_money
from reports.lineitems import COMMISSION_MONEY, SALE_MONEY, LineItems, columns_of
from reports.money import NO_CURRENCY, excel_format, units

SHEETS = ("Summary", "By partner", "Adjustments", "Unattributed", "Double counts")
LINE_SHEETS = ("Sales", "Commissions")
CHART_ROWS = 15


class _Book:
    """A workbook with one cached cell format per currency."""

    def __init__(self, out: io.BytesIO) -> None:
        # Strings stay strings: a transaction id like "=1+1" or "http://..." is not a formula or link.
        options = {"in_memory": True, "strings_to_formulas": False, "strings_to_urls": False}
        self.wb = xlsxwriter.Workbook(out, options)
        self.bold = self.wb.add_format({"bold": True})
        self.title = self.wb.add_format({"bold": True, "font_size": 14})
        self.header = self.wb.add_format({"bold": True, "bg_color": "#F0F2F5", "bottom": 1})
        self.bad = self.wb.add_format({"bold": True, "font_color": "#8A1C1C"})
        self.moment = self.wb.add_format({"num_format": "yyyy-mm-dd hh:mm:ss"})
        self._money: dict[str, Any] = {}

    def money(self, currency: str) -> Any:
        if currency not in self._money:
            self._money[currency] = self.wb.add_format({"num_format": excel_format(currency)})
        return self._money[currency]

    def cell(self, ws: Any, row: int, col: int, field: str, value: Any, currency: str) -> None:
        if value is None:
            return
        if isinstance(value, (bool, str)):
            ws.write_string(row, col, str(value).lower() if isinstance(value, bool) else value)
        elif is_money(field):
            ws.write_number(row, col, float(units(int(value), currency)), self.money(currency))
        else:
            ws.write_number(row, col, int(value))

    def table(self, ws: Any, top: int, frame: pl.DataFrame, fields: list[str]) -> int:
        """Header + rows of `frame` from row `top`; the next free row."""
        for col, field in enumerate(fields):
            ws.write(top, col, COLUMN_LABELS.get(field, field), self.header)
        for i, row in enumerate(frame.iter_rows(named=True), start=top + 1):
            for col, field in enumerate(fields):
                self.cell(ws, i, col, field, row[field], row["currency"])
        return top + frame.height + 2

    def lines(
        self, name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str], money: Sequence[str]
    ) -> None:
        """A sheet of line items: the CSV's header (frozen, filters on every column), then one
        row per line: minor units and counts as integers, the `_decimal` twins as numbers in the
        row's currency's format, times as UTC dates, everything else as the CSV writes it (text
        stays text)."""
        header = columns_of(columns, money)
        ws = self.wb.add_worksheet(name)
        ws.set_column(0, len(header) - 1, 16)
        for col, column in enumerate(header):
            ws.write_string(0, col, column, self.header)
        for i, row in enumerate(rows, start=1):
            currency = row.get("currency") or NO_CURRENCY
            for col, column in enumerate(header):
                twin = column.removesuffix(DECIMAL) if column.endswith(DECIMAL) else None
                value = row.get(column) if twin is None else row.get(twin)
                if value is None:
                    continue
                if twin is not None and isinstance(value, int) and not isinstance(value, bool):
                    ws.write_number(i, col, float(units(value, currency)), self.money(currency))
                elif isinstance(value, datetime):
                    ws.write_datetime(i, col, value.astimezone(UTC).replace(tzinfo=None), self.moment)
                elif isinstance(value, int) and not isinstance(value, bool):
                    ws.write_number(i, col, value)
                else:
                    ws.write_string(i, col, csvcells.value(value))
        ws.freeze_panes(1, 0)
        ws.autofilter(0, 0, len(rows), len(header) - 1)


def _provenance(book: _Book, ws: Any, report: FinanceReport) -> None:
    """Beside the header: when the report was generated, from which reconcile run, and whether
    the month is closed (as the html report says it)."""
    pv = report.provenance
    if pv is None:
        return
    stamp = "%Y-%m-%d %H:%M UTC"
    run = (
        f"{pv.run_id} (finished {pv.run_finished_at.strftime(stamp)})"
        if pv.run_id and pv.run_finished_at
        else (pv.run_id or "none yet")
    )
    closed = (
        f"closed on {pv.closed_at.strftime(stamp)}" + (f" by {pv.closed_by}" if pv.closed_by else "")
        if pv.closed_at
        else "open (figures may still change)"
    )
    for row, (label, value) in enumerate(
        (("Generated", pv.generated_at.strftime(stamp)), ("Reconcile run", run), ("Month", closed)), start=1
    ):
        ws.write(row, 3, label, book.bold)
        ws.write(row, 4, value)


def _summary(book: _Book, report: FinanceReport) -> None:
    ws = book.wb.add_worksheet("Summary")
    ws.set_column(0, 0, 36)
    ws.set_column(1, 8, 18)
    ws.write(0, 0, "Finance report", book.title)
    ws.write(1, 0, "Program", book.bold)
    ws.write(1, 1, f"{report.program_name or ''} ({report.program_id})".strip())
    ws.write(2, 0, "Period", book.bold)
    ws.write(2, 1, report.period)
    ws.write(3, 0, "Reconciled", book.bold)
    if report.checks.height == 0:  # an empty month passes no check: it has none
        ws.write(3, 1, "nothing to check: no sales, refunds or commissions this month")
    else:
        ws.write(
            3,
            1,
            "yes" if report.reconciled else "NO: see the failed checks",
            None if report.reconciled else book.bad,
        )
    _provenance(book, ws, report)
    ws.write(4, 0, "Amounts are in currency units; each currency has its own column and is never summed.")
    top = 6
    ws.write(top, 0, "Figure", book.header)
    for col, currency in enumerate(report.currencies, start=1):
        ws.write(top, col, currency.upper(), book.header)
    for i, (field, label) in enumerate(SUMMARY_LABELS.items(), start=top + 1):
        ws.write(i, 0, label)
        for col, row in enumerate(report.summary.iter_rows(named=True), start=1):
            book.cell(ws, i, col, field, row[field], row["currency"])
    top += len(SUMMARY_LABELS) + 2
    ws.write(top, 0, "Commissions by status", book.bold)
    fields = ["currency", "status", "lines", "commission", "commission_reversed", "platform_fee"]
    top = book.table(ws, top + 1, report.by_status, fields)
    ws.write(top, 0, "Checks", book.bold)
    for col, field in enumerate(["currency", "name", "expected", "actual", "ok"]):
        ws.write(top + 1, col, COLUMN_LABELS[field], book.header)
    for i, row in enumerate(report.checks.iter_rows(named=True), start=top + 2):
        ws.write(i, 0, row["currency"])
        ws.write(i, 1, check_label(row["name"]))
        kind = "count" if row["name"] in COUNT_CHECKS else "amount"
        book.cell(ws, i, 2, kind, row["expected"], row["currency"])
        book.cell(ws, i, 3, kind, row["actual"], row["currency"])
        ws.write(i, 4, "ok" if row["ok"] else "FAILED", None if row["ok"] else book.bad)


def _by_partner(book: _Book, report: FinanceReport) -> None:
    ws = book.wb.add_worksheet("By partner")
    fields = list(report.by_partner.columns)
    ws.set_column(0, len(fields) - 1, 15)
    book.table(ws, 0, report.by_partner, fields)
    currencies = report.by_partner.get_column("currency").to_list()
    code_col, amount_col = fields.index("partner_code"), fields.index("commission")
    chart_row = 0
    for currency in dict.fromkeys(currencies):
        first = currencies.index(currency) + 1  # +1: the header row
        last = min(first + currencies.count(currency), first + CHART_ROWS) - 1
        chart = book.wb.add_chart({"type": "bar"})
        chart.add_series(
            {
                "name": f"Commission ({currency.upper()})",
                "categories": ["By partner", first, code_col, last, code_col],
                "values": ["By partner", first, amount_col, last, amount_col],
                "fill": {"color": "#2F5FB3"},
            }
        )
        chart.set_title({"name": f"Commissions by partner ({currency.upper()})"})
        chart.set_legend({"none": True})
        chart.set_y_axis({"reverse": True})
        ws.insert_chart(chart_row, len(fields) + 1, chart)
        chart_row += 16


def finance_xlsx(report: FinanceReport, lines: LineItems | None = None) -> bytes:
    out = io.BytesIO()
    book = _Book(out)
    year, month = int(report.period[:4]), int(report.period[5:7])
    book.wb.set_properties(
        {
            "title": f"Finance report {report.period} {report.program_id}",
            "author": "tally",
            "created": datetime(year, month, 1),  # noqa: DTZ001 - xlsx stores a naive date
        }
    )
    _summary(book, report)
    _by_partner(book, report)
    for name, frame in (
        ("Adjustments", report.adjustments),
        ("Clawbacks", report.clawbacks),
        ("Unattributed", report.unattributed),
        ("Double counts", report.double_counts),
    ):
        ws = book.wb.add_worksheet(name)
        ws.set_column(0, len(frame.columns) - 1, 18)
        book.table(ws, 0, frame, list(frame.columns))
    if lines is not None:
        book.lines("Sales", lines.sales, reads.SALE_FIELDS, SALE_MONEY)
        book.lines("Commissions", lines.commissions, reads.COMMISSION_FIELDS, COMMISSION_MONEY)
    book.wb.close()
    return out.getvalue()
