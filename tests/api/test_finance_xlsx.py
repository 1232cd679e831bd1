"""The finance xlsx carries the month's line items (issue 13): the same rows as the sales and
commissions CSVs, each on its own sheet with a frozen header row and filters, money as numbers
in each row's currency format. Read back with openpyxl through the real app."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import openpyxl
import time_machine
from starlette.testclient import TestClient

from reports.money import excel_format, exponent, minor
from tests.conftest import OP, World, make_world

PERIOD = "2026-03"
NOW = datetime(2026, 4, 20, 12, 0, tzinfo=UTC)
SALES = [  # transaction, currency, amount in minor units, day of March
    ("in_usd", "usd", 12_345, 2),
    ("in_jpy", "jpy", 90_000, 3),
    ("in_kwd", "kwd", 12_345, 4),
    ("in_lone", "usd", 700, 5),
]


def _csv(client: TestClient, world: World, path: str) -> list[dict[str, str]]:
    r = client.get(f"/api/v1/programs/{world.program_id}/{path}", headers=world.owner)
    assert r.status_code == 200, r.text
    return list(csv.DictReader(io.StringIO(r.content.decode("utf-8-sig"))))


def _cell_text(column: str, value: Any, number_format: str, currency: str) -> str:
    """A cell as the CSV writes the same value: a money column's `_decimal` twin in whole units
    with the currency's decimals (and its number format), other numbers (minor units, counts)
    as integers, times in RFC 3339 (UTC), text as it is, empty as ''."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if column.endswith("_decimal"):
            assert number_format == excel_format(currency), (column, value, number_format)
            return f"{Decimal(str(value)):.{exponent(currency)}f}"
        assert isinstance(value, int) and number_format == "General", (column, value, number_format)
        return str(value)
    return str(value)


def _sheet(book: Any, name: str) -> tuple[Any, list[str], list[list[Any]]]:
    ws = book[name]
    header = [c.value for c in ws[1]]
    rows = [list(r) for r in ws.iter_rows(min_row=2)]
    return ws, header, rows


def test_the_finance_xlsx_has_the_line_items_of_the_month(client: TestClient) -> None:
    world = make_world(client, commission_bps=2500)
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    r = client.post(
        "/api/v1/track/lead",
        json={"customer_external_id": "u1", "click_id": click.json()["data"]["click_id"]},
        headers=world.key,
    )
    assert r.status_code == 200, r.text
    for txn, currency, amount, day in SALES:
        customer = "u_nobody" if txn == "in_lone" else "u1"
        r = world.sale(
            transaction_id=txn,
            customer_external_id=customer,
            amount=amount,
            currency=currency,
            occurred_at=f"2026-03-{day:02d}T10:00:00Z",
        )
        assert r.status_code == 200, r.text
    # a sale of another month stays out of March's sheets
    assert (
        world.sale(
            transaction_id="in_april",
            customer_external_id="u1",
            amount=100,
            occurred_at="2026-04-02T10:00:00Z",
        ).status_code
        == 200
    )
    r = client.post(
        "/api/v1/track/refund",
        json={"transaction_id": "in_usd", "refund_id": "re_1", "amount": 345},
        headers=world.key,
    )
    assert r.status_code == 200, r.text
    with time_machine.travel(NOW, tick=False):
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        r = client.get(
            f"/api/v1/programs/{world.program_id}/reports/finance",
            params={"period": PERIOD, "format": "xlsx"},
            headers=world.owner,
        )
        assert r.status_code == 200, r.text
        sales_csv = _csv(client, world, "sales?format=csv&from=2026-03-01&to=2026-03-31")
        lines_csv = _csv(client, world, f"commissions?format=csv&period={PERIOD}")
    book = openpyxl.load_workbook(io.BytesIO(r.content))
    assert book.sheetnames == [
        "Summary",
        "By partner",
        "Adjustments",
        "Clawbacks",
        "Unattributed",
        "Double counts",
        "Sales",
        "Commissions",
    ]

    for name, expected in (("Sales", sales_csv), ("Commissions", lines_csv)):
        ws, header, rows = _sheet(book, name)
        assert header == list(expected[0])  # the CSV's columns, in its order
        assert ws.freeze_panes == "A2"  # the header row stays in view
        assert ws.auto_filter.ref == f"A1:{openpyxl.utils.get_column_letter(len(header))}{len(rows) + 1}"
        assert len(rows) == len(expected)
        for cells, line in zip(rows, expected, strict=True):
            currency = line["currency"]
            got = {
                h: _cell_text(h, c.value, c.number_format, currency)
                for h, c in zip(header, cells, strict=True)
            }
            assert got == line, name

    ws, header, rows = _sheet(book, "Sales")
    assert [r[header.index("transaction_id")].value for r in rows] == [
        "in_usd",
        "in_jpy",
        "in_kwd",
        "in_lone",
    ]
    money = {r[header.index("transaction_id")].value: r[header.index("amount_decimal")] for r in rows}
    # numbers, not text, each in its currency's format: 123.45 USD, 90,000 JPY, 12.345 KWD
    assert [money[t].data_type for t in ("in_usd", "in_jpy", "in_kwd")] == ["n", "n", "n"]
    assert money["in_kwd"].number_format == '#,##0.000 "KWD";-#,##0.000 "KWD"'
    assert money["in_jpy"].number_format == '#,##0 "JPY";-#,##0 "JPY"'
    assert minor(Decimal(str(money["in_kwd"].value)), "kwd") == 12_345
    assert money["in_jpy"].value == 90_000
    refunded = {
        r[header.index("transaction_id")].value: r[header.index("refunded_decimal")].value for r in rows
    }
    assert refunded["in_usd"] == 3.45 and refunded["in_lone"] == 0
    ws, header, rows = _sheet(book, "Commissions")
    got = sorted(
        (r[header.index("transaction_id")].value, r[header.index("amount_decimal")].value) for r in rows
    )
    # 25 %, half-even; in_usd's line was approved (March 2 + 30 days) before its refund arrived,
    # so it keeps 30.86 and the refund is a clawback line in the refund's own month
    assert got == [("in_jpy", 22_500), ("in_kwd", 3.086), ("in_usd", 30.86)]
