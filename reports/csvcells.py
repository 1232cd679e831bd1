"""CSV cells a spreadsheet never runs as formulas (OWASP, "CSV Injection").

Every CSV tally writes (finance, double counting, sales and commission line items, payout
batches) goes through `writer`: a text cell starting with `=`, `+`, `-`, `@`, a tab or a carriage
return is prefixed with a single quote, so a transaction id `=HYPERLINK(...)` or a partner named
`=cmd|...` is shown as the text it is. A cell that is a plain number (`-12.50`, `-3`: money and
counts, negative ones included) is left as it is, so it stays a number in the spreadsheet.
The xlsx files need none of this: their cells are typed, strings are never formulas there.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from typing import Any, TextIO

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
