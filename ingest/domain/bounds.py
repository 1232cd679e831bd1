"""Bounds at the edge, from one place (CONTRACT sections 4 and 6).

Every number, string and time tally takes in is bounded here, so nothing it acknowledges can
later fail to fit the raw log (DuckDB BIGINT, TIMESTAMPTZ), the reconciler (Polars Int64 and
month arithmetic) or a report. The request models (`ingest/domain/inputs.py`), the stored program
settings (`ingest/domain/records.py`), the query parameters of the reads and the processor payload
reader (`ingest/stripe.py`) all use the constants and types below.

- Amounts: integers, 1..10^12 minor units in our own inputs; processor amounts 0..10^12
  (a zero-amount invoice is simply not a sale).
- Times: RFC 3339 strings with an offset (never a number of seconds), from
  1970-01-01T00:00:00Z to 9999-12-30T23:59:59Z once converted to UTC (a day short of year
  9999's end, so any UTC offset can still show it); normalised to UTC.
- Characters every backend can store (issue 48): no string anywhere in a request body holds NUL
  (PostgreSQL text cannot) or a lone surrogate (not a character); ids, names, emails, codes and
  addresses hold no C0 control character (U+0000..U+001F) nor DEL: a CR/LF in a name must never
  reach a mail header. Free text (a reason, a description) keeps tab, newline and carriage return.
  An id is never only dots: `.` and `..` are path steps, so no id can be one (every id reaches a
  URL as one percent-encoded segment; `/` and any other character are allowed in it).
- Payout emails: not starting with `=`, `+`, `-` or `@` (a spreadsheet would read a formula, and
  the payout files would have to carry a different address).
- Ids, strings and emails: at most 255 characters, and an id is never whitespace only. A
  click's `url` and `referrer` keep 2048: real landing and referrer URLs (UTM parameters, ad
  click ids) often pass 255, and refusing them would lose the click.
- Dates are strings `YYYY-MM-DD` only and months `YYYY-MM` (never a number, an ISO week or a
  time); report periods and query dates: years 1970..9999.
- Program settings: basis points 0..10000, recurring months null or 0..1200, holding days
  0..3650, website an http(s) address. The flat commission and the payout minimum are amounts
  per currency (`PerCurrency`): an integer 0..10^12 of minor units that applies to every
  currency, or an object of 1..50 ISO 4217 codes (three letters, kept lowercase) to such
  integers that applies to the currencies it names (CONTRACT section 15).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BeforeValidator,
    Field,
    PlainValidator,
    StrictInt,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

MAX_AMOUNT = 10**12
MAX_BPS = 10_000
MAX_RECURRING_MONTHS = 1200
MAX_HOLDING_DAYS = 3650
MAX_ID = 255
MAX_TEXT = 255
MAX_URL = 2048
MAX_EMAIL = 255
MAX_CURRENCIES = 50  # currencies one per-currency setting may name
MIN_YEAR, MAX_YEAR = 1970, 9999
EARLIEST = datetime(MIN_YEAR, 1, 1, tzinfo=UTC)
LATEST = datetime(MAX_YEAR, 12, 30, 23, 59, 59, tzinfo=UTC)

TIME_RANGE = f"from {EARLIEST:%Y-%m-%dT%H:%M:%SZ} to {LATEST:%Y-%m-%dT%H:%M:%SZ} in UTC"
YEAR_RANGE = f"years {MIN_YEAR} to {MAX_YEAR}"


def utc_in_range(moment: datetime) -> datetime | None:
    """`moment` (aware) in UTC when it lies within the time bounds, else None."""
    try:
        utc = moment.astimezone(UTC)
    except (OverflowError, ValueError):  # a year before 1 or after 9999 once in UTC
        return None
    return utc if EARLIEST <= utc <= LATEST else None


def amount_in_range(value: int, low: int = 1) -> bool:
    return low <= value <= MAX_AMOUNT


# A date is exactly `YYYY-MM-DD`; a time starts with a date, `T` (or a space) and hh:mm, so
# neither a number of seconds nor an ISO week ever reads as one.
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}", re.ASCII)


def _rfc3339_text(value: Any) -> Any:
    if not isinstance(value, str) or not _TIME.match(value):
        raise PydanticCustomError("rfc3339", "must be an RFC 3339 time string with an offset")
    return value


def _date_text(value: Any) -> Any:
    if not isinstance(value, str) or not _DATE.fullmatch(value):
        raise PydanticCustomError("date_format", "must be a date string YYYY-MM-DD")
    return value


def _moment(value: datetime) -> datetime:
    utc = utc_in_range(value)
    if utc is None:
        raise PydanticCustomError("time_out_of_range", f"must be a time {TIME_RANGE}")
    return utc


def _not_blank(value: str) -> str:
    if value.isspace():
        raise PydanticCustomError("blank_id", "must not be blank (whitespace only)")
    return value


# Characters every backend can store ---------------------------------------------------------
_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")
_FREE_TEXT_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # tab, LF and CR kept
_SURROGATE = re.compile(r"[\ud800-\udfff]")
UNSTORABLE = "must not contain NUL (U+0000) or a lone surrogate"
CONTROL = "must not contain control characters (U+0000 to U+001F, U+007F)"
FREE_TEXT_CONTROL = "must not contain control characters other than tab and newline"


def unstorable(value: Any) -> bool:
    """Whether any string in `value` (a string, or lists and dicts of them, keys included) holds
    a character no backend can store: NUL or a lone surrogate. Iterative (deep JSON)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item or (not item.isascii() and _SURROGATE.search(item)):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def storable(value: Any) -> Any:
    """`value` unless it holds a string no backend can store (the rule of every request model,
    whatever its fields' types); raises the validation error otherwise."""
    if unstorable(value):
        raise PydanticCustomError("unstorable_character", UNSTORABLE)
    return value


def one_line(value: str) -> str:
    """An id, a name, an email, a code or an address: no control character at all."""
    if _CONTROLS.search(value):
        raise PydanticCustomError("control_character", CONTROL)
    return value


def free_text(value: str) -> str:
    """Free text (a reason, a description): tab, newline and carriage return, no other control."""
    if _FREE_TEXT_CONTROLS.search(value):
        raise PydanticCustomError("control_character", FREE_TEXT_CONTROL)
    return value


def _not_dots(value: str) -> str:
    if not value.strip("."):
        raise PydanticCustomError("dots_id", "must not be only dots ('.' and '..' are path steps)")
    return value


_FORMULA_START = ("=", "+", "-", "@")


def _no_formula_start(value: str) -> str:
    if value.startswith(_FORMULA_START):
        raise PydanticCustomError("formula_start", "must not start with =, +, - or @")
    return value


def _day(value: date) -> date:
    if not MIN_YEAR <= value.year <= MAX_YEAR:
        raise PydanticCustomError("date_out_of_range", f"must be a date in {YEAR_RANGE}")
    return value


# Our inputs ---------------------------------------------------------------------------------
Amount = Annotated[StrictInt, Field(ge=1, le=MAX_AMOUNT)]
Id = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID, json_schema_extra={"pattern": r"\S"}),
    AfterValidator(_not_blank),
    AfterValidator(one_line),
    AfterValidator(_not_dots),
]
Text = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(free_text)]  # free text
Line = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(one_line)]  # one line (a person's name)
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(one_line)]
Url = Annotated[str, Field(max_length=MAX_URL), AfterValidator(one_line)]
Email = Annotated[
    str,
    Field(min_length=3, max_length=MAX_EMAIL, pattern=r"^[^@\s]+@[^@\s]+$"),
    AfterValidator(one_line),
]
# A partner's payout email goes into PayPal and Wise files a spreadsheet may open (issue 48).
PayoutEmail = Annotated[Email, AfterValidator(_no_formula_start)]
# A finance action's, a cancel's or a manual entry's reason.
Reason = Annotated[str, Field(min_length=1, max_length=500, pattern=r"\S"), AfterValidator(free_text)]
Moment = Annotated[AwareDatetime, BeforeValidator(_rfc3339_text), AfterValidator(_moment)]
Day = Annotated[date, BeforeValidator(_date_text), AfterValidator(_day)]

# Program settings ---------------------------------------------------------------------------
Bps = Annotated[StrictInt, Field(ge=0, le=MAX_BPS)]
RecurringMonths = Annotated[StrictInt, Field(ge=0, le=MAX_RECURRING_MONTHS)]
HoldingDays = Annotated[StrictInt, Field(ge=0, le=MAX_HOLDING_DAYS)]

# An amount setting by currency: minor units for every currency, or for the currencies named.
PerCurrencyValue = int | dict[str, int]
_CURRENCY_CODE = re.compile(r"[A-Za-z]{3}", re.ASCII)
PER_CURRENCY_WANTED = (
    f"must be an integer from 0 to {MAX_AMOUNT} (minor units, in every currency) or an object of "
    f'1 to {MAX_CURRENCIES} currency codes to such integers, like {{"usd": 5000, "jpy": 500}}'
)


def _minor_units(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_AMOUNT


def per_currency(value: Any) -> PerCurrencyValue:
    """An amount setting as tally takes it: an integer 0..10^12 as it is, or an object of 1 to
    MAX_CURRENCIES three-letter currency codes (any case; returned lowercase, in code order) to
    integers 0..10^12. Raises ValueError saying what is wanted (and which entry is wrong)."""
    if _minor_units(value):
        return int(value)
    if not isinstance(value, dict) or not value:
        raise ValueError(PER_CURRENCY_WANTED)
    if len(value) > MAX_CURRENCIES:
        raise ValueError(f"names {len(value)} currencies; at most {MAX_CURRENCIES}")
    amounts: dict[str, int] = {}
    for code, amount in value.items():
        if not isinstance(code, str) or not _CURRENCY_CODE.fullmatch(code):
            raise ValueError(f"{str(code)[:20]!r} is not a currency code: use three letters, like usd or jpy")
        if code.lower() in amounts:
            raise ValueError(f"names {code.lower()} twice")
        if not _minor_units(amount):
            raise ValueError(f"{code.lower()} must be an integer from 0 to {MAX_AMOUNT} (minor units)")
        amounts[code.lower()] = int(amount)
    return dict(sorted(amounts.items()))


def amount_for(setting: PerCurrencyValue, currency: str | None) -> int | None:
    """The amount `setting` (`per_currency`'s) gives `currency`: an integer's for every
    currency, else the object's entry for it (any case), None when it names none."""
    if isinstance(setting, int):
        return setting
    return setting.get(currency.lower()) if currency is not None else None


def _per_currency_setting(value: Any) -> PerCurrencyValue:
    try:
        return per_currency(value)
    except ValueError as exc:
        raise PydanticCustomError("per_currency", str(exc)) from None


_AMOUNT_SCHEMA: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT}
PER_CURRENCY_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {**_AMOUNT_SCHEMA, "description": "minor units, in every currency"},
        {
            "type": "object",
            "description": "minor units by ISO 4217 code (kept lowercase), for the currencies named",
            "propertyNames": {"pattern": "^[A-Za-z]{3}$"},
            "additionalProperties": _AMOUNT_SCHEMA,
            "minProperties": 1,
            "maxProperties": MAX_CURRENCIES,
        },
    ],
}
# The flat commission and the payout minimum (CONTRACT sections 6 and 15).
PerCurrency = Annotated[
    PerCurrencyValue, PlainValidator(_per_currency_setting), WithJsonSchema(PER_CURRENCY_SCHEMA)
]
FlatCommission = PerCurrency
PayoutMinimum = PerCurrency


def _web_address(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise ValueError("must be an http:// or https:// address, like https://brand.test")
    return value


# The brand's site, where partners' referral links point (`?aff=<code>`, CONTRACT 14).
WebsiteUrl = Annotated[str, Field(max_length=MAX_URL), AfterValidator(one_line), AfterValidator(_web_address)]
# Each bounded integer setting and its (low, high): `ProgramSettings.from_stored` clamps to them
# (each amount of a per-currency object too).
SETTING_RANGES: dict[str, tuple[int, int]] = {
    "commission_bps": (0, MAX_BPS),
    "commission_flat": (0, MAX_AMOUNT),
    "recurring_months": (0, MAX_RECURRING_MONTHS),
    "platform_fee_bps": (0, MAX_BPS),
    "holding_days": (0, MAX_HOLDING_DAYS),
    "payout_minimum": (0, MAX_AMOUNT),
}

# Query parameters ---------------------------------------------------------------------------
_PERIOD = re.compile(r"(\d{4})-(0[1-9]|1[0-2])", re.ASCII)


def period(raw: str) -> str:
    """A report period `YYYY-MM` with its year in bounds; raises ValueError with the reason."""
    found = _PERIOD.fullmatch(raw)
    if found is None:
        raise ValueError("must be YYYY-MM")
    if not MIN_YEAR <= int(found.group(1)) <= MAX_YEAR:
        raise ValueError(f"must be YYYY-MM in {YEAR_RANGE}")
    return raw


def query_moment(raw: str, end: bool) -> datetime:
    """A query bound: a date `YYYY-MM-DD` (a whole day: `end` takes the next midnight) or an RFC
    3339 time with an offset, in UTC; years in bounds. Raises ValueError with the reason."""
    try:
        day = date.fromisoformat(raw) if _DATE.fullmatch(raw) else None
        if day is None and not _TIME.match(raw):
            raise ValueError(raw)
        moment = None if day else datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("must be YYYY-MM-DD or an RFC 3339 time") from None
    if day is not None:
        _check_year(day.year)
        if not end:
            return datetime.combine(day, time(), UTC)
        try:
            return datetime.combine(day + timedelta(days=1), time(), UTC)
        except OverflowError:  # 9999-12-31: the range runs to the end of time
            return datetime.max.replace(tzinfo=UTC)
    assert moment is not None
    if moment.tzinfo is None:
        raise ValueError("an RFC 3339 time needs an offset")
    try:
        utc = moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValueError(f"must be in {YEAR_RANGE} in UTC") from None
    _check_year(utc.year)
    return utc


def _check_year(year: int) -> None:
    if not MIN_YEAR <= year <= MAX_YEAR:
        raise ValueError(f"must be in {YEAR_RANGE}")
