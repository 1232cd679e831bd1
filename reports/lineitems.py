"""Line items for finance: the sales and commission rows of the JSON reads as CSV.

One row per line, in the JSON's order and with its columns; money as decimal numbers in whole
currency units (`12.34`, `1500` for yen, `12.345` for dinars), never as minor units, with the
currency in its own column; other cells as the finance CSV writes them (reports/render.py);
times in RFC 3339. UTF-8 with a byte order
mark, so spreadsheets read partners' names right.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from reports.money import NO_CURRENCY, units
from reports.render import csv_value

BOM = "\ufeff"
SALE_MONEY = ("amount", "gross_amount", "tax", "commission", "platform_fee", "refunded")
COMMISSION_MONEY = ("amount", "gross", "reversed", "platform_fee")


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return csv_value(value)


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str], money: Sequence[str]) -> bytes:
    """`rows` (dicts with `columns`, money in minor units beside a `currency`) as CSV bytes."""
    out = io.StringIO()
    out.write(BOM)
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        currency = row.get("currency") or NO_CURRENCY
        cells = []
        for name in columns:
            value = row.get(name)
            if name in money and isinstance(value, int) and not isinstance(value, bool):
                cells.append(str(units(value, currency)))
            else:
                cells.append(_cell(value))
        writer.writerow(cells)
    return out.getvalue().encode("utf-8")
