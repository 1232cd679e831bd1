"""Money for display: exact, with each currency's own decimals."""

from __future__ import annotations

from decimal import Decimal

import pytest

from reports.money import amount_text, excel_format, minor, money_text, units


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (123_456, "usd", "1,234.56 USD"),
        (-5, "eur", "-0.05 EUR"),
        (0, "usd", "0.00 USD"),
        (90_000, "jpy", "90,000 JPY"),
        (1_500, "KRW", "1,500 KRW"),
        (12_345, "kwd", "12.345 KWD"),
        (100, "xxx", "100 XXX"),
        (10**17 + 1, "usd", "1,000,000,000,000,000.01 USD"),
    ],
)
def test_money_text(amount: int, currency: str, text: str) -> None:
    assert money_text(amount, currency) == text
    assert minor(units(amount, currency), currency) == amount


def test_units_are_decimals_never_floats() -> None:
    assert units(1, "usd") == Decimal("0.01") and isinstance(units(1, "usd"), Decimal)
    assert amount_text(-123_456_789, "jpy") == "-123,456,789"
    with pytest.raises(ValueError, match="decimals"):
        minor(Decimal("0.001"), "usd")


def test_excel_formats_name_the_currency_with_its_decimals() -> None:
    assert excel_format("usd") == '#,##0.00 "USD";-#,##0.00 "USD"'
    assert excel_format("jpy") == '#,##0 "JPY";-#,##0 "JPY"'
