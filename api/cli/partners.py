"""`tally partners list|show|statement|adjust`: a program's partners, what each is owed, and
manual entries, over HTTP with the account credential (CONTRACT sections 14 and 15).

Money is shown in each currency's decimals and entered in whole units (`--amount 25.00
--currency usd` is sent as 2500 minor units; `"1.250 kwd"`, `500 jpy`: reports/money.py). The
reads take a workspace member's login, `adjust` an owner's."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

import click

from api.cli.books import program_path, write_file
from api.cli.client import call, fetch_bytes
from api.cli.options import CURRENCY, SIGNED_AMOUNT, examples, json_option, program_option
from api.cli.output import Listing, emit, money, show
from reports.money import exponent, minor


def _partner(program: str, code: str, suffix: str = "") -> str:
    return program_path(program, f"/partners/{quote(code, safe='')}{suffix}")


def _payee(partner: dict[str, Any]) -> str:
    """Where the partner is paid: `paypal alice@paypal.test (usd)`, or `-` when not set."""
    if not partner.get("payout_method"):
        return "-"
    return f"{partner['payout_method']} {partner['payout_email']} ({partner['payout_currency']})"


def balances_listing(partners: list[dict[str, Any]], title: str) -> Listing:
    """One row per partner and currency: what is owed (approved, unpaid: the next batch pays it,
    the minimum aside), pending and held; a partner without money has one row of `-`."""
    listing = Listing(
        ("partner", "name", "payout", "currency", "owed", "pending", "held"),
        title=title,
        no_wrap=("partner",),
    )
    for partner in partners:
        balances = partner.get("balances") or []
        if not balances:
            listing.add(partner["code"], partner["name"], _payee(partner), "-", "-", "-", "-")
        for b in balances:
            currency = b["currency"]
            listing.add(
                partner["code"],
                partner["name"],
                _payee(partner),
                currency,
                money(b["approved_unpaid"], currency),
                money(b["pending"], currency),
                money(b["held"], currency),
            )
    return listing


@click.group(
    short_help="partners: balances, statements, manual entries",
    epilog=examples(
        "tally partners list --program prog_...",
        "tally partners statement --program prog_... --partner alice --currency usd",
    ),
)
def partners() -> None:
    """A program's partners and what each is owed: every cent owed is an entry of the partner's
    statement, and the balance is their sum. Reads need a workspace member's login; `adjust`
    an owner's."""


@partners.command(
    "list",
    short_help="the program's partners with their balances per currency",
    epilog=examples(
        "tally partners list --program prog_...", "tally partners list --program prog_... --json"
    ),
)
@program_option
@json_option("the partners (an array)")
def partners_list(program: str, as_json: bool) -> None:
    """One row per partner and currency: code, name, where they are paid, and what they are
    owed (approved and unpaid: what the next payout batch pays, before the minimum), pending
    (within their holding days) and held."""
    found = call("GET", program_path(program, "/partners"))
    if as_json:
        emit(found)
        return
    show(balances_listing(found, f"partners of {program}"))


@partners.command(
    "show",
    short_help="one partner: details, payout details and balances",
    epilog=examples(
        "tally partners show --program prog_... --partner alice",
        "tally partners show --program prog_... --partner alice --json",
    ),
)
@program_option
@click.option("--partner", required=True, metavar="CODE", help="the partner's code (its ?aff= code)")
@json_option("the partner")
def partners_show(program: str, partner: str, as_json: bool) -> None:
    """A partner: code, name, email, where they are paid (the payout details the partner set
    in the portal, or an owner through the API), then their balances per currency."""
    found = call("GET", _partner(program, partner))
    if as_json:
        emit(found)
        return
    details = Listing(("field", "value"), title=f"partner {found['code']}")
    details.add("code", found["code"])
    details.add("name", found["name"])
    details.add("email", found["email"] or "-")
    details.add("created", found["created_at"])
    details.add("payout", _payee(found) if found.get("payout_method") else "- (no payout details)")
    if found.get("payout_method"):
        details.add("payout name", found["payout_name"])
    show(details, balances_listing([found], "balances"))


# -- statement -------------------------------------------------------------------------------------
def _when(value: Any) -> str:
    """An RFC 3339 time as `YYYY-MM-DD HH:MM:SS` (UTC), or `-`."""
    if value is None:
        return "-"
    return str(value).replace("T", " ").removesuffix("Z")[:19]


def statement_listing(found: dict[str, Any]) -> Listing:
    """The statement as rows: the opening balance, each entry with the balance after it, the
    closing balance (as the server's CSV has them)."""
    currency = found["currency"]

    def cash(amount: int) -> str:
        return money(amount, currency) if currency else str(amount)

    listing = Listing(
        ("date", "kind", "amount", "balance", "reference", "reason"),
        title=f"statement of {found['partner_code']} in {currency or '(no currency: nothing booked)'} (UTC)",
        no_wrap=("date", "amount", "balance", "reference"),
    )
    listing.add(_when(found["from"]), "opening balance", "", cash(found["opening_balance"]), "", "")
    for entry in found["entries"]:
        listing.add(
            _when(entry["booked_at"]),
            entry["kind"],
            cash(entry["amount"]),
            cash(entry["balance"]),
            entry["transaction_id"] or entry["payout_id"] or "-",
            entry["reason"] or "",
        )
    listing.add(_when(found["to"]), "closing balance", "", cash(found["closing_balance"]), "", "")
    return listing


@partners.command(
    "statement",
    short_help="a partner's statement: every entry owed or paid, with the running balance",
    epilog=examples(
        "tally partners statement --program prog_... --partner alice --currency usd",
        "tally partners statement --program prog_... --partner alice --from 2026-01-01 --to 2026-03-31",
        "tally partners statement --program prog_... --partner alice --currency eur -o statement.csv",
    ),
)
@program_option
@click.option("--partner", required=True, metavar="CODE", help="the partner's code")
@click.option(
    "--currency",
    type=CURRENCY,
    metavar="CUR",
    help="the account's currency (needed when the partner has money in several)",
)
@click.option(
    "--from",
    "start",
    metavar="DATE",
    help="first day (YYYY-MM-DD) or an RFC 3339 time; what comes before is the opening balance",
)
@click.option("--to", "end", metavar="DATE", help="last day (YYYY-MM-DD, included) or an RFC 3339 time")
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="write the statement as CSV to FILE (`-`: stdout) instead of a table",
)
@json_option("the statement")
def partners_statement(
    program: str,
    partner: str,
    currency: str | None,
    start: str | None,
    end: str | None,
    output: str | None,
    as_json: bool,
) -> None:
    """A partner's account in one currency, oldest entry first: booked commissions, adjustments,
    clawbacks and manual entries (owed to the partner), payouts (paid to them) and failed
    payouts (owed again), each with the balance after it, between the opening and closing
    balances. The closing balance is what the next payout batch pays, before the minimum."""
    if output is not None and as_json:
        raise click.UsageError("give one of --json and --output")
    query = {"currency": currency, "from": start, "to": end}
    params = {k: v for k, v in query.items() if v is not None}
    if output is not None:
        content = fetch_bytes(
            _partner(program, partner, f"/statement?{urlencode(params | {'format': 'csv'})}")
        )
        write_file(content, output, f"statement of {partner}")
        return
    suffix = f"/statement?{urlencode(params)}" if params else "/statement"
    found = call("GET", _partner(program, partner, suffix))
    if as_json:
        emit(found)
        return
    show(statement_listing(found))


# -- manual entries --------------------------------------------------------------------------------
def to_minor(amount: Decimal, currency: str) -> int:
    """Whole units of `currency` in minor units (`25.00 usd` -> 2500); a usage error naming
    `--amount` when it has more decimals than the currency."""
    try:
        return minor(amount, currency)
    except ValueError:
        places = exponent(currency)
        allowed = "no decimals" if places == 0 else f"at most {places} decimals"
        raise click.BadParameter(
            f"{currency.upper()} amounts have {allowed}: {amount}", param_hint="'--amount'"
        ) from None


@partners.command(
    "adjust",
    short_help="book a manual entry (a bonus, a correction): approved at once (owner)",
    epilog=examples(
        "tally partners adjust --program prog_... --partner alice --amount 25.00 --currency usd "
        "--reason 'launch bonus'",
        "tally partners adjust --program prog_... --partner alice --amount -5.00 --currency usd "
        "--reason 'double-counted sale' --json",
    ),
)
@program_option
@click.option("--partner", required=True, metavar="CODE", help="the partner's code")
@click.option(
    "--amount",
    required=True,
    type=SIGNED_AMOUNT,
    metavar="AMOUNT",
    help="in whole units of --currency: 25.00 (a bonus), -5.00 (a correction against the partner); "
    "sent in minor units",
)
@click.option("--currency", required=True, type=CURRENCY, metavar="CUR", help="the entry's currency (usd)")
@click.option("--reason", required=True, help="why (kept in the log, shown on the statement)")
@json_option("the booked line")
def partners_adjust(
    program: str, partner: str, amount: Decimal, currency: str, reason: str, as_json: bool
) -> None:
    """Book a manual entry for a partner (POST .../partners/{code}/adjustments): a `manual`
    line, approved at once, logged with who and why; it enters the partner's balance and
    statement and the next payout batch like any approved line. Never edited: a mistake is
    corrected by another entry."""
    body = {"amount": to_minor(amount, currency), "currency": currency, "reason": reason}
    line = call("POST", _partner(program, partner, "/adjustments"), body=body)
    if as_json:
        emit(line)
        return
    listing = Listing(("entry", "partner", "kind", "amount", "status", "reason", "by", "at"), title="booked")
    listing.add(
        line["entry_id"],
        line["partner_code"],
        line["kind"],
        money(line["amount"], line["currency"]),
        line["status"],
        line["status_reason"] or "",
        line["created_by"],
        line["created_at"],
    )
    show(listing)
