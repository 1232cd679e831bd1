"""Money for display: integer minor units in, text or a Decimal of whole currency units out.

Reports compute in integer minor units only; renderers call these helpers at the very end. The
number of decimals is the processor's: zero-decimal currencies (jpy, krw, ...) are already whole
units, a few currencies have three decimals, every other one has two.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

# Currencies whose minor unit is the whole unit, as the processor defines them.
ZERO_DECIMAL = frozenset(
    {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv", "xaf"}
    | {"xof", "xpf"}
)
THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})
# ISO 4217's code for "no currency": rows that arrived without one (a refund of an unknown sale).
# Their amounts are shown as the minor units they came in.
NO_CURRENCY = "xxx"


def exponent(currency: str) -> int:
    """Decimal places of `currency`'s minor unit."""
    code = currency.lower()
    if code in ZERO_DECIMAL or code == NO_CURRENCY:
        return 0
    if code in THREE_DECIMAL:
        return 3
    return 2


def units(amount: int, currency: str) -> Decimal:
    """`1234, "usd"` -> `Decimal("12.34")`: exact, never through a float."""
    return Decimal(amount).scaleb(-exponent(currency))


def minor(value: Decimal, currency: str) -> int:
    """The inverse of `units`: whole units back to integer minor units (exact or ValueError)."""
    scaled = value.scaleb(exponent(currency))
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{value} {currency} has more decimals than its minor unit")
    return int(scaled)


def amount_text(amount: int, currency: str) -> str:
    """`123456, "usd"` -> `1,234.56` (grouped, the currency's decimals)."""
    return f"{units(amount, currency):,.{exponent(currency)}f}"


def money_text(amount: int | None, currency: str | None) -> str:
    """`123456, "usd"` -> `1,234.56 USD`; `12345, "kwd"` -> `12.345 KWD`; no amount -> `—`.

    The one money formatter of every page: the reports and the dashboard (api/pages.py)."""
    if amount is None:
        return "—"
    code = currency or NO_CURRENCY
    return f"{amount_text(amount, code)} {code.upper()}"


def per_currency_text(setting: int | Mapping[str, int]) -> str:
    """A per-currency setting (the flat commission, the payout minimum: minor units in every
    currency, or an object by currency) as people read it: `5000` -> `5,000 minor units in every
    currency (50.00 USD, 5,000 JPY)`; `{"jpy": 500, "usd": 5000}` -> `5,000 JPY, 50.00 USD` (the
    currencies named, and no others)."""
    if isinstance(setting, int):
        examples = ", ".join(money_text(setting, code) for code in ("usd", "jpy"))
        return f"{setting:,} minor units in every currency ({examples})"
    return ", ".join(money_text(amount, code) for code, amount in sorted(setting.items()))


def minimum_text(setting: int | Mapping[str, int]) -> str | None:
    """A payout minimum as the payout pages state it (`per_currency_text`; by currency, with no
    minimum in the others: ProgramSettings.payout_minimum_for), None when there is none."""
    if isinstance(setting, int):
        return per_currency_text(setting) if setting > 0 else None
    if not any(amount > 0 for amount in setting.values()):
        return None
    return f"{per_currency_text(setting)}; no minimum in other currencies"


def excel_format(currency: str) -> str:
    """An Excel number format showing whole units with the currency's decimals and code."""
    places = exponent(currency)
    digits = "#,##0" + ("." + "0" * places if places else "")
    return f'{digits} "{currency.upper()}";-{digits} "{currency.upper()}"'
