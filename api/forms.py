"""Reading dashboard forms and query strings into the services' inputs, and validation errors
back into lines a page can show.

Program settings are entered as people think of them and converted here, on the server: rates
as percent (`30`, `12.5`, at most two decimals: `commission_percent` -> `commission_bps`). The
flat commission and the payout minimum are amounts per currency (CONTRACT 15), entered as rows
of an amount and a currency (`per_currency_rows`): money in a chosen currency (`12.50` USD,
`1.250` KWD, `500` JPY -> minor units by the currency's decimals in reports/money.py), one row
per currency, making an object by currency (`{"jpy": 500, "usd": 1250}`); or one row for
`every` currency, whose amount is minor units, the same number in each (an integer setting).
Blank rows are left out; no row at all is 0 in every currency. What is stored and what the JSON
API takes stay basis points and minor units. A value that cannot be converted is refused with a
field message; bounds are the services' (ingest/domain/inputs.py)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request

from api.http import read_body
from ingest.domain.bounds import MAX_AMOUNT, MAX_CURRENCIES, PerCurrencyValue
from ingest.domain.errors import TallyError, ValidationFailed
from reports.money import exponent, minor, units

INT_SETTINGS = ("recurring_months", "holding_days")
PERCENT_SETTINGS = {"commission_percent": "commission_bps", "platform_fee_percent": "platform_fee_bps"}
MAX_FLAT = MAX_AMOUNT  # minor units (CONTRACT section 6)
FLAT_CURRENCIES = ("usd", "eur", "gbp", "chf", "cad", "aud", "jpy", "krw", "kwd", "bhd", "jod", "omr")
# The currency choice of a per-currency row that applies to every currency (in minor units).
EVERY = "every"
# Each per-currency setting: its amount and currency inputs (the first row's names; row n > 1
# appends `_n`, `row_names`).
PER_CURRENCY = {"commission_flat": "flat_currency", "payout_minimum": "minimum_currency"}
# The settings form holds, besides its dozen fields, up to MAX_CURRENCIES + 1 rows of two inputs
# for each per-currency setting.
MAX_FORM_FIELDS = 32 + 2 * len(PER_CURRENCY) * (MAX_CURRENCIES + 1)
# What each settings field is called on the form (the service's field names map to the form's).
SETTINGS_LABELS = {
    "name": "Name",
    "commission_type": "Commission type",
    "commission_percent": "Commission (%)",
    "commission_bps": "Commission (%)",
    "commission_flat": "Flat commission",
    "flat_currency": "Currency of the flat commission",
    "recurring_months": "Recurring months",
    "platform_fee_percent": "Platform fee (%)",
    "platform_fee_bps": "Platform fee (%)",
    "holding_days": "Holding days",
    "requires_server_side_leads": "Requires server-side leads",
    "stripe_account_id": "Payment-processor account id",
    "payout_minimum": "Payout minimum",
    "minimum_currency": "Currency of the payout minimum",
    "website_url": "Website",
}
# The service's field -> the form input it came from.
FORM_FIELD = {"commission_bps": "commission_percent", "platform_fee_bps": "platform_fee_percent"}
_PERCENT = re.compile(r"^(\d{1,3})(?:[.,](\d{1,2}))?$")
_MONEY = re.compile(r"^(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?$")


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (at most 1 MiB); any other body reads as an empty form."""
    raw = await read_body(request)
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return {}
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        return {}
    return dict(pairs)


def problems(exc: TallyError) -> list[str]:
    fields: list[dict[str, str]] = exc.extra.get("fields", [])
    return [f"{f['field']}: {f['message']}" for f in fields] or [exc.message]


def partner_data(form: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The partner fields as typed (to refill the form) and as PartnerIn input (no blank email)."""
    fields = {name: form.get(name, "").strip() for name in ("code", "name", "email")}
    return fields, {k: v for k, v in fields.items() if v or k != "email"}


def percent_to_bps(text: str) -> int:
    """`"30"` -> 3000, `"12.5"` -> 1250, `"0,01"` -> 1; blank is 0. ValueError says why not."""
    raw = text.strip().removesuffix("%").strip()
    if raw == "":
        return 0
    found = _PERCENT.match(raw)
    if found is None:
        raise ValueError("enter a percentage from 0 to 100 with at most two decimals, like 30 or 12.5")
    whole, fraction = found.group(1), (found.group(2) or "").ljust(2, "0")
    bps = int(whole) * 100 + int(fraction)
    if bps > 10_000:
        raise ValueError("must be at most 100 %")
    return bps


def bps_to_percent(bps: int) -> str:
    """3000 -> `"30"`, 1250 -> `"12.5"`, 1 -> `"0.01"` (what the form shows)."""
    whole, fraction = divmod(bps, 100)
    return f"{whole}.{fraction:02d}".rstrip("0").rstrip(".") if fraction else str(whole)


def money_to_minor(text: str, currency: str) -> int:
    """`"12.50", "usd"` -> 1250, `"1.250", "kwd"` -> 1250, `"500", "jpy"` -> 500, `"1,000"` ->
    100000 (USD); blank is 0. ValueError says why not (too many decimals for the currency, ...)."""
    raw = text.strip().replace(" ", "")
    if raw.upper().endswith(currency.upper()):
        raw = raw[: -len(currency)].strip()
    if raw == "":
        return 0
    found = _MONEY.match(raw)
    places = exponent(currency)
    if found is None:
        example = "1250" if places == 0 else f"12.{'5'.ljust(places, '0')}"
        raise ValueError(f"enter an amount like {example} (a dot before the decimals)")
    if found.group(2) is not None and len(found.group(2).rstrip("0")) > places:
        allowed = "no decimals" if places == 0 else f"at most {places} decimals"
        raise ValueError(f"{currency.upper()} amounts have {allowed}")
    value = minor(Decimal(raw.replace(",", "")), currency)
    if value > MAX_FLAT:
        raise ValueError(f"must be at most {money_for_form(MAX_FLAT, currency)} {currency.upper()}")
    return value


def money_for_form(amount: int, currency: str) -> str:
    """Minor units as the form shows them: 1250 USD -> `"12.50"`, 1250 KWD -> `"1.250"`."""
    return f"{units(amount, currency):.{exponent(currency)}f}"


_CODE = re.compile(r"[a-z]{3}", re.ASCII)


def row_names(amount: str, index: int) -> tuple[str, str]:
    """The amount and currency inputs of row `index` (from 0) of per-currency setting `amount`:
    `commission_flat`, `flat_currency`; then `commission_flat_2`, `flat_currency_2`, ..."""
    currency = PER_CURRENCY[amount]
    return (amount, currency) if index == 0 else (f"{amount}_{index + 1}", f"{currency}_{index + 1}")


def posted_rows(form: dict[str, str], amount: str) -> list[dict[str, str]]:
    """The rows of per-currency setting `amount` as posted: `amount` and `currency` strings."""
    rows = []
    for index in range(MAX_CURRENCIES + 1):
        names = row_names(amount, index)
        if index and not any(name in form for name in names):
            break
        rows.append({"amount": form.get(names[0], ""), "currency": form.get(names[1], "").strip().lower()})
    return rows


def setting_rows(setting: PerCurrencyValue) -> list[dict[str, str]]:
    """The rows the form shows for a per-currency setting: an integer in one `every` row (minor
    units), an object a row per currency (money in its decimals); then one blank row to add a
    currency."""
    if isinstance(setting, int):
        rows = [{"amount": str(setting), "currency": EVERY}]
    else:
        rows = [{"amount": money_for_form(v, code), "currency": code} for code, v in sorted(setting.items())]
    if len(rows) <= MAX_CURRENCIES:
        rows.append({"amount": "", "currency": ""})
    return rows


def per_currency_rows(form: dict[str, str], amount: str) -> PerCurrencyValue:
    """Per-currency setting `amount` from its posted rows (the module docstring): an `every`
    row's whole minor units, or {currency: minor units} of the rows that name one; 0 when every
    row is blank. ValueError says why not (a row without a currency, too many decimals, a
    currency twice, `every` beside single currencies)."""
    every: int | None = None
    by_currency: dict[str, int] = {}
    for row in posted_rows(form, amount):
        text, code = row["amount"].strip(), row["currency"]
        if text == "":
            continue
        if code == EVERY:
            digits = text.replace(",", "").replace(" ", "")
            if not (digits.isascii() and digits.isdigit()):
                raise ValueError("for every currency, enter whole minor units, like 500 (5.00 USD, 500 JPY)")
            if int(digits) > MAX_FLAT:
                raise ValueError(f"must be at most {MAX_FLAT} minor units")
            every = int(digits)
        elif not _CODE.fullmatch(code):
            raise ValueError(f"choose the currency of {text}")
        elif code in by_currency:
            raise ValueError(f"{code.upper()} is given twice: one amount per currency")
        else:
            by_currency[code] = money_to_minor(text, code)
    if every is not None and by_currency:
        raise ValueError("an amount for every currency cannot be combined with amounts for single currencies")
    if every is not None:
        return every
    return by_currency or 0


def settings_data(form: dict[str, str]) -> dict[str, Any]:
    """Form strings as SettingsPatch input: percent -> basis points, rows of money -> an amount
    per currency in minor units (see the module docstring), digits become ints, a blank
    `recurring_months` is lifetime (null); anything else is passed on for the model to refuse
    with a field message. ValidationFailed (with every field that could not be converted) when a
    percent or amount is not one."""
    data: dict[str, Any] = {"name": form.get("name", "").strip()}
    data["commission_type"] = form.get("commission_type", "")
    fields: list[dict[str, str]] = []
    for name, target in PERCENT_SETTINGS.items():
        try:
            data[target] = percent_to_bps(form.get(name, ""))
        except ValueError as exc:
            fields.append({"field": name, "message": str(exc)})
    try:
        data["commission_flat"] = per_currency_rows(form, "commission_flat")
    except ValueError as exc:
        fields.append({"field": "commission_flat", "message": str(exc)})
    for name in INT_SETTINGS:
        raw = form.get(name, "").strip()
        data[name] = int(raw) if raw.isdigit() else (raw or None)
    data["requires_server_side_leads"] = form.get("requires_server_side_leads") == "on"
    data["stripe_account_id"] = form.get("stripe_account_id", "").strip() or None
    try:
        data["payout_minimum"] = per_currency_rows(form, "payout_minimum")
    except ValueError as exc:
        fields.append({"field": "payout_minimum", "message": str(exc)})
    data["website_url"] = form.get("website_url", "").strip() or None
    if fields:
        raise ValidationFailed("the settings form has values that are not valid", fields=fields)
    return data


def settings_problems(exc: TallyError) -> dict[str, str]:
    """A refusal of the settings form as {form field: message} (the form's own field names)."""
    fields: list[dict[str, str]] = exc.extra.get("fields", [])
    found = {FORM_FIELD.get(f["field"], f["field"]): f["message"] for f in fields}
    return found or {"": exc.message}
