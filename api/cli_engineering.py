"""CLI verbs for finance and engineers, over HTTP with the stored login (a workspace owner's
account token), like the other account commands: `tally periods close`, `tally fixes add`, and the
program settings `tally programs create` takes as options.

Settings are given as people think of them and sent as the API takes them (CONTRACT section 6):
rates in percent (`--commission-percent 12.5` -> `commission_bps` 1250), the flat commission as
money with its currency (`--commission-flat "12.50 usd"` -> `commission_flat` 1250; `"1.250 kwd"`
-> 1250, `"500 jpy"` -> 500: the currency's decimals, reports/money.py), days and months as whole
numbers (`--recurring-months lifetime` is null). Bounds are the server's (422 naming the field)."""

from __future__ import annotations

import argparse
import re
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

from api.cli_http import CliError, call, emit, examples
from reports.money import exponent, minor

_PERCENT = re.compile(r"^(\d{1,3})(?:\.(\d{1,2}))?$")
_MONEY = re.compile(r"^(?P<amount>\d[\d,]*(?:\.\d+)?)\s*(?P<currency>[A-Za-z]{3})$")


def percent(text: str) -> int:
    """`"30"` -> 3000 basis points, `"12.5"` -> 1250, `"0.01"` -> 1 (argparse type)."""
    raw = text.strip().removesuffix("%").strip()
    found = _PERCENT.match(raw)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"not a percentage: {text!r} (0 to 100, at most two decimals, like 30 or 12.5)"
        )
    bps = int(found.group(1)) * 100 + int((found.group(2) or "").ljust(2, "0"))
    if bps > 10_000:
        raise argparse.ArgumentTypeError(f"more than 100 %: {text!r}")
    return bps


def money(text: str) -> int:
    """`"12.50 usd"` -> 1250 minor units, `"1.250 kwd"` -> 1250, `"500 jpy"` -> 500 (argparse
    type). The currency is required: it says where the decimal point is."""
    found = _MONEY.match(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(
            f'not an amount with its currency: {text!r} (like "12.50 usd", "1.250 kwd" or "500 jpy")'
        )
    currency = found.group("currency").lower()
    try:
        return minor(Decimal(found.group("amount").replace(",", "")), currency)
    except (ValueError, InvalidOperation):
        places = exponent(currency)
        allowed = "no decimals" if places == 0 else f"at most {places} decimals"
        raise argparse.ArgumentTypeError(f"{currency.upper()} amounts have {allowed}: {text!r}") from None


def whole(text: str) -> int:
    """A non-negative whole number (argparse type)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


def months(text: str) -> int | None:
    """`lifetime` (null: every payment of the customer) or a whole number of months."""
    return None if text.strip().lower() == "lifetime" else whole(text)


# option dest -> the API's setting (CONTRACT section 6)
SETTINGS = {
    "commission_type": "commission_type",
    "commission_percent": "commission_bps",
    "commission_flat": "commission_flat",
    "platform_fee_percent": "platform_fee_bps",
    "holding_days": "holding_days",
    "recurring_months": "recurring_months",
    "requires_server_side_leads": "requires_server_side_leads",
    "stripe_account": "stripe_account_id",
}
_UNSET = object()


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """The program settings as options (each left out keeps the server's default)."""
    group = parser.add_argument_group("settings (each optional; the defaults are 30 %, 30 holding days)")
    group.add_argument(
        "--commission-type",
        choices=("percent", "flat"),
        default=_UNSET,
        help="how the commission is reckoned (default: flat when only --commission-flat is "
        "given, else percent)",
    )
    group.add_argument(
        "--commission-percent",
        type=percent,
        default=_UNSET,
        metavar="PERCENT",
        help="commission in percent of the sale net of tax, at most two decimals "
        "(12.5 = 12.5 %%; default 30)",
    )
    group.add_argument(
        "--commission-flat",
        type=money,
        default=_UNSET,
        metavar='"AMOUNT CUR"',
        help='flat commission per sale as money with its currency: "12.50 usd", "1.250 kwd", '
        '"500 jpy" (sent in minor units: 1250, 1250, 500)',
    )
    group.add_argument(
        "--platform-fee-percent",
        type=percent,
        default=_UNSET,
        metavar="PERCENT",
        help="platform fee in percent of the sale net of tax (default 0)",
    )
    group.add_argument(
        "--holding-days",
        type=whole,
        default=_UNSET,
        metavar="DAYS",
        help="days a commission is pending before it is approved (default 30)",
    )
    group.add_argument(
        "--recurring-months",
        type=months,
        default=_UNSET,
        metavar="N|lifetime",
        help="months of a referred customer's payments that earn: 0 = the first sale only, N = "
        "sales before the first + N calendar months, lifetime = every one (default lifetime)",
    )
    group.add_argument(
        "--requires-server-side-leads",
        action="store_const",
        const=True,
        default=_UNSET,
        help="browser leads stay provisional until a server-mode lead settles them",
    )
    group.add_argument(
        "--stripe-account",
        default=_UNSET,
        metavar="ACCOUNT",
        help="the payment processor's connected account id (acct_...) whose events are this program's",
    )


def settings_body(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, as the API's fields."""
    body = {api: getattr(args, dest) for dest, api in SETTINGS.items() if getattr(args, dest) is not _UNSET}
    if "commission_type" not in body and "commission_flat" in body:
        if "commission_bps" in body:
            raise CliError(
                "both --commission-percent and --commission-flat: say which applies with --commission-type"
            )
        body["commission_type"] = "flat"
    return body


# -- periods and fixes ---------------------------------------------------------------------------
def _program(program: str) -> str:
    return f"/api/v1/programs/{quote(program, safe='')}"


def cmd_periods_close(args: argparse.Namespace) -> None:
    path = f"{_program(args.program)}/periods/{quote(args.period, safe='')}/close"
    data = call("POST", path)
    if args.json:
        emit(data)
        return
    print(
        f"{data['period']} closed at {data['closed_at']} by {data['closed_by']} ({data['close_id']}); "
        f"books recomputed by reconcile run {data['reconcile_run_id']}. Later corrections to it "
        "become adjustment lines in the first open month."
    )


FIX_FIELDS = ("subscription_id", "transaction_id", "svc_customer_key", "svc_click_id")


def cmd_fixes_add(args: argparse.Namespace) -> None:
    fix = {name: getattr(args, name) for name in FIX_FIELDS if getattr(args, name) is not None}
    data = call("POST", f"{_program(args.program)}/metadata-fixes", body={"fixes": [fix]})
    if args.json:
        emit(data)
        return
    for recorded in data["fixes"]:
        target = (
            f"subscription {recorded['subscription_id']}"
            if recorded.get("subscription_id")
            else f"transaction {recorded['transaction_id']}"
        )
        values = ", ".join(
            f"{k}={recorded[k]}" for k in ("svc_customer_key", "svc_click_id") if recorded.get(k)
        )
        print(f"fix {recorded['fix_id']} recorded for {target}: {values}")
    print(
        "it takes effect when a backfill covering its sales is applied: "
        "`tally backfill --program ... --from D --to D` previews it, `--apply` applies it"
    )


def add_engineering(sub: Any) -> None:
    periods = sub.add_parser(
        "periods",
        help="close a month (owner)",
        description="Periods of a program's books. Needs a workspace owner's login.",
        epilog=examples("tally periods close --program prog_... --period 2026-01"),
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    close = periods.add_parser(
        "close",
        help="close a month: its figures never change again",
        description="Close a month of a program's books (POST .../periods/{YYYY-MM}/close). Its "
        "figures never change again; later corrections to it appear as adjustment lines in the "
        "first open month. Closing it again changes nothing.",
        epilog=examples(
            "tally periods close --program prog_... --period 2026-01",
            "tally periods close --program prog_... --period 2026-01 --json",
        ),
    )
    close.add_argument("--program", required=True, help="program id (prog_...)")
    close.add_argument(
        "--period", required=True, metavar="YYYY-MM", help="the month to close (one that has begun)"
    )
    close.add_argument("--json", action="store_true", help="print the close as JSON")
    close.set_defaults(func=cmd_periods_close)

    fixes = sub.add_parser(
        "fixes",
        help="record metadata fixes for a later backfill (owner)",
        description="Metadata fixes: appended to the raw log, never edited into it. Needs a "
        "workspace owner's login.",
        epilog=examples("tally fixes add --program prog_... --transaction-id in_123 --svc-click-id clk_..."),
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    add = fixes.add_parser(
        "add",
        help="record a metadata fix (a sale's or subscription's customer key or click id)",
        description="Record one metadata fix (POST .../metadata-fixes): for one subscription or "
        "one transaction, the svc_customer_key and/or svc_click_id to use. It takes effect when a "
        "backfill covering its sales is applied (`tally backfill --apply`); the backfill's dry "
        "run previews it.",
        epilog=examples(
            "tally fixes add --program prog_... --transaction-id in_123 --svc-click-id clk_...",
            "tally fixes add --program prog_... --subscription-id sub_1 --svc-customer-key cust_42 --json",
        ),
    )
    add.add_argument("--program", required=True, help="program id (prog_...)")
    target = add.add_mutually_exclusive_group(required=True)
    target.add_argument("--subscription-id", metavar="ID", help="fix every sale of this subscription")
    target.add_argument("--transaction-id", metavar="ID", help="fix this sale (its transaction id)")
    add.add_argument("--svc-customer-key", metavar="KEY", help="the customer key (svc_customer_key) to use")
    add.add_argument("--svc-click-id", metavar="CLICK", help="the click id (svc_click_id) to use")
    add.add_argument("--json", action="store_true", help="print the recorded fix as JSON")
    add.set_defaults(func=cmd_fixes_add)


# -- finance actions on a sale's commission lines ------------------------------------------------
def cmd_commissions_act(args: argparse.Namespace) -> None:
    path = f"{_program(args.program)}/commissions/{quote(args.transaction, safe='')}/{args.action}"
    data = call("POST", path, body={"reason": args.reason})
    if args.json:
        emit(data)
        return
    for line in data["lines"]:
        why = f" ({line['status_reason']})" if line.get("status_reason") else ""
        print(
            f"{line['kind']} {line['partner_code']} {line['period']}: {line['amount']} {line['currency']}"
            f" minor units, {line['status']}{why}"
        )


def add_commissions(sub: Any) -> None:
    commissions = sub.add_parser(
        "commissions",
        help="hold, release or void a sale's commission lines (owner)",
        description="Finance actions on a sale's unpaid commission lines, appended to the raw log "
        "with who and why. Needs a workspace owner's login.",
        epilog=examples("tally commissions hold --program prog_... --transaction tx_1 --reason 'dispute'"),
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, summary in (
        ("hold", "hold the sale's unpaid lines: never approved or batched until released"),
        ("release", "release a held sale: pending, then approved once its holding days have passed"),
        ("void", "void the sale's unpaid lines: never payable, their platform fee void too"),
    ):
        parser = commissions.add_parser(
            action,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]} (POST .../commissions/{{transaction_id}}/"
            f"{action}). A sale with a line in a payout batch cannot be held or voided (line_paid).",
            epilog=examples(f"tally commissions {action} --program prog_... --transaction tx_1 --reason why"),
        )
        parser.add_argument("--program", required=True, help="program id (prog_...)")
        parser.add_argument("--transaction", required=True, help="the sale's transaction id")
        parser.add_argument("--reason", required=True, help="why (kept in the log, shown in explain)")
        parser.add_argument("--json", action="store_true", help="print the sale's lines as JSON")
        parser.set_defaults(func=cmd_commissions_act)
