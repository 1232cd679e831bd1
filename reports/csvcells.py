"""Every CSV tally writes, in one format, and cells a spreadsheet never runs as formulas.

The format (finance, double counting, sales and commission line items, payout batches; one test,
tests/api/test_csv_formats.py, holds every CSV endpoint and download to it): UTF-8 with a byte
order mark (so spreadsheets read partners' names right), CRLF line ends, a header row. The
columns are the JSON rows' fields in the JSON's order with the JSON's values: money in integer
minor units, as CONTRACT section 1 fixes `amount` and as the payout rows of section 7 carry it
in every format. After them, for each money field, `<field>_decimal`: the same amount as a plain
decimal number in whole units of the row's currency (`12.34`, `1500` yen, `12.345` dinars), the
contract's own `amount_decimal` of a payout row (a row with no currency is shown in the minor
units it came in). The finance report's long table (`section,row,currency,metric,value`) has one
such column, `value_decimal`, filled on its money lines.

Formulas: every CSV goes through `writer`: a text cell starting with `=`, `+`, `-`, `@`, a tab
or a carriage return is prefixed with a single quote, so a transaction id `=HYPERLINK(...)` or a
partner named `=cmd|...` is shown as the text it is. A cell that is a plain number (`-12.50`, `-3`: money and
counts, negative ones included) is left as it is, so it stays a number in the spreadsheet.
The xlsx files need none of this: their cells are typed, strings are never formulas there.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from reports.money import NO_CURRENCY, units

BOM = "\ufeff"
DECIMAL = "_decimal"  # the suffix of a money field's whole-units twin

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def neutralise(cell: Any) -> Any:
    """`cell` as a spreadsheet will show it: text that would start a formula gets a leading
    `'`; numbers, and text that is a plain decimal number, are left alone."""
    if isinstance(cell, str) and cell.startswith(_FORMULA_START) and not _PLAIN_NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


class Writer:
    """`csv.writer` (CRLF line ends) whose every cell is neutralised."""

    def __init__(self, out: TextIO) -> None:
        self._rows = csv.writer(out, lineterminator="\r\n")

    def writerow(self, cells: Iterable[Any]) -> None:
        self._rows.writerow([neutralise(cell) for cell in cells])


def writer(out: TextIO) -> Writer:
    return Writer(out)


def document(header: Sequence[str], rows: Iterable[Iterable[Any]]) -> bytes:
    """A CSV file as tally writes every one: the BOM, the header row, the rows (CRLF)."""
    out = io.StringIO()
    out.write(BOM)
    rows_out = writer(out)
    rows_out.writerow(header)
    for row in rows:
        rows_out.writerow(row)
    return out.getvalue().encode("utf-8")


def decimal_columns(money: Sequence[str]) -> tuple[str, ...]:
    """The whole-units twins of `money` fields, in their order: `amount` -> `amount_decimal`."""
    return tuple(name + DECIMAL for name in money)


def decimal(amount: Any, currency: str | None) -> str:
    """A minor-units amount as its `_decimal` cell: whole units of `currency`, the currency's
    decimals (`1234, "usd"` -> `12.34`); empty for no amount."""
    if amount is None or isinstance(amount, bool):
        return ""
    return str(units(int(amount), currency or NO_CURRENCY))


def value(cell: Any) -> str:
    """A JSON value as a CSV cell: null empty, booleans `true`/`false`, a list space-separated,
    anything else as its text (reports/render.py says where each is used)."""
    if cell is None:
        return ""
    if isinstance(cell, bool):
        return "true" if cell else "false"
    if isinstance(cell, list):
        return " ".join(str(v) for v in cell)
    return str(cell)
