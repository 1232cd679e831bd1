"""Options several commands share, the value types the CLI parses, and the examples every
command's help ends with."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import click
import httpx
from click.shell_completion import CompletionItem

from api.cli.client import account_credential
from api.cli.errors import CliError
from reports.money import exponent, minor

F = TypeVar("F", bound=Callable[..., Any])


def examples(*lines: str, after: str = "") -> str:
    """A command's epilog: its examples (every command has at least one), kept as written."""
    head = "example" + ("s" if len(lines) > 1 else "") + ":"
    text = "\b\n" + head + "\n" + "\n".join(f"  {line}" for line in lines)
    return text + (f"\n\n\b\n{after}" if after else "")


# -- shared options ------------------------------------------------------------------------------
def json_option(what: str) -> Callable[[F], F]:
    """`--json`: print `what` as JSON (for scripts) instead of a table or sentence."""
    return click.option("--json", "as_json", is_flag=True, help=f"print {what} as JSON")


def url_option(*, operator: bool = False) -> Callable[[F], F]:
    who = " (the operator token goes there)" if operator else ""
    return click.option(
        "--url",
        envvar="TALLY_URL",
        metavar="URL",
        help=f"the server's base URL{who} (default: TALLY_URL, else the login's, else TALLY_BASE_URL, "
        "else http://127.0.0.1:8000)",
    )


def _complete_programs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The program ids the account credential sees, for shell completion (nothing when there
    is no login or the server does not answer within two seconds)."""
    try:
        credential = account_credential()
        response = httpx.get(
            credential.url + "/api/v1/programs",
            headers={"Authorization": f"Bearer {credential.token}"},
            timeout=2,
        )
        programs = response.json()["data"]
        return [
            CompletionItem(p["program_id"], help=p.get("name"))
            for p in programs
            if str(p["program_id"]).startswith(incomplete)
        ]
    except (CliError, httpx.HTTPError, ValueError, KeyError, TypeError):
        return []


def program_option(f: F) -> F:
    return click.option(
        "--program",
        required=True,
        metavar="PROGRAM",
        help="program id (prog_...)",
        shell_complete=_complete_programs,
    )(f)


def output_option(f: F) -> F:
    return click.option(
        "-o", "--output", required=True, metavar="FILE", help="where to write it; `-` writes to stdout"
    )(f)


# -- value types -----------------------------------------------------------------------------------
_PERCENT = re.compile(r"^(\d{1,3})(?:\.(\d{1,2}))?$")
_MONEY = re.compile(r"^(?P<amount>\d[\d,]*(?:\.\d+)?)\s*(?P<currency>[A-Za-z]{3})$")
_SIGNED = re.compile(r"^[+-]?\d[\d,]*(?:\.\d+)?$")
_CURRENCY = re.compile(r"^[A-Za-z]{3}$")


class Percent(click.ParamType[int]):
    """`"30"` -> 3000 basis points, `"12.5"` -> 1250, `"0.01"` -> 1."""

    name = "percent"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        found = _PERCENT.match(text.strip().removesuffix("%").strip())
        if found is None:
            self.fail(
                f"not a percentage: {text!r} (0 to 100, at most two decimals, like 30 or 12.5)", param, ctx
            )
        bps = int(found.group(1)) * 100 + int((found.group(2) or "").ljust(2, "0"))
        if bps > 10_000:
            self.fail(f"more than 100 %: {text!r}", param, ctx)
        return bps


class Money(click.ParamType[int]):
    """`"12.50 usd"` -> 1250 minor units, `"1.250 kwd"` -> 1250, `"500 jpy"` -> 500. The currency
    is required: it says where the decimal point is."""

    name = "money"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        found = _MONEY.match(text.strip())
        if found is None:
            self.fail(
                f'not an amount with its currency: {text!r} (like "12.50 usd", "1.250 kwd" or "500 jpy")',
                param,
                ctx,
            )
        currency = found.group("currency").lower()
        try:
            return minor(Decimal(found.group("amount").replace(",", "")), currency)
        except (ValueError, InvalidOperation):
            places = exponent(currency)
            allowed = "no decimals" if places == 0 else f"at most {places} decimals"
            self.fail(f"{currency.upper()} amounts have {allowed}: {text!r}", param, ctx)


_PAIR = re.compile(r"^(?P<currency>[A-Za-z]{3})=(?P<amount>\d+)$")


class PerCurrency(click.ParamType[int | dict[str, int]]):
    """An amount per currency as the API takes it (CONTRACT 15): `500` -> 500 minor units in every
    currency; `usd=5000,jpy=500` -> {"usd": 5000, "jpy": 500}, minor units in the currencies
    named; `"12.50 usd"` -> {"usd": 1250}, money in its currency's decimals (`Money`)."""

    name = "per_currency"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | dict[str, int]:
        if isinstance(value, int | dict):
            return value
        text = str(value).strip()
        if text.isascii() and text.isdigit():
            return int(text)
        if "=" not in text:
            if not _MONEY.match(text):
                self.fail(
                    f"not an amount: {text!r} (minor units in every currency like 500, per currency like "
                    'usd=5000,jpy=500, or money in one currency like "12.50 usd")',
                    param,
                    ctx,
                )
            found = MONEY.convert(text, param, ctx)
            currency = text[-3:].lower()
            return {currency: found}
        amounts: dict[str, int] = {}
        for part in text.split(","):
            pair = _PAIR.match(part.strip())
            if pair is None:
                self.fail(
                    f"not a currency=minor-units pair: {part.strip()!r} (like usd=5000 for 50.00 USD)",
                    param,
                    ctx,
                )
            currency = pair.group("currency").lower()
            if currency in amounts:
                self.fail(f"{currency} given twice: {text!r}", param, ctx)
            amounts[currency] = int(pair.group("amount"))
        return amounts


class SignedAmount(click.ParamType[Decimal]):
    """`"25.00"` -> `Decimal("25.00")`, `"-5"`, `"1,250.5"`: an amount in whole units, either
    sign, without its currency (another option names it; `api.cli.partners.to_minor` converts)."""

    name = "amount"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Decimal:
        if isinstance(value, Decimal):
            return value
        text = str(value).strip()
        if _SIGNED.match(text) is None:
            self.fail(f"not an amount: {value!r} (whole units, like 25.00 or -5.00)", param, ctx)
        return Decimal(text.replace(",", ""))


class Currency(click.ParamType[str]):
    """A three-letter currency code, in lower case as the API keeps it: `USD` -> `usd`."""

    name = "currency"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if _CURRENCY.match(text) is None:
            self.fail(f"not a currency code: {value!r} (three letters, like usd)", param, ctx)
        return text.lower()


class Whole(click.ParamType[int]):
    """A non-negative whole number, digits only."""

    name = "whole"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and value >= 0:
            return value
        text = str(value)
        if not (text.isascii() and text.isdigit()):
            self.fail(f"not a whole number: {text!r}", param, ctx)
        return int(text)


class Months(click.ParamType[int | None]):
    """`lifetime` (None: every payment of the customer) or a whole number of months."""

    name = "months"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or str(value).strip().lower() == "lifetime":
            return None
        return WHOLE.convert(value, param, ctx)


PERCENT, MONEY, WHOLE = Percent(), Money(), Whole()
MONTHS, PER_CURRENCY = Months(), PerCurrency()
SIGNED_AMOUNT, CURRENCY = SignedAmount(), Currency()
