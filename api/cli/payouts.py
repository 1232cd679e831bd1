"""`tally payouts create|list|export|mark-paid|cancel|row-failed`: payout batches, over HTTP with
a workspace owner's account credential (CONTRACT sections 7 and 15)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import click

from api.cli.books import program_path, write_file
from api.cli.client import call, call_status, fetch_bytes
from api.cli.options import CURRENCY, examples, json_option, output_option, program_option
from api.cli.output import Listing, emit, money, show

FORMATS = ("csv", "xlsx", "json")


def _path(program: str, suffix: str = "") -> str:
    return program_path(program, f"/payouts{suffix}")


def _payout(program: str, payout: str, suffix: str = "") -> str:
    return _path(program, f"/{quote(payout, safe='')}{suffix}")


def batch_listing(batch: dict[str, Any]) -> Listing:
    """One row per partner and currency: what the batch pays, to which account (as the batch
    recorded it when it was made), and the row's outcome (a failed row with why)."""
    listing = Listing(
        ("partner", "name", "pays to", "currency", "pays", "lines", "outcome"),
        title=f"payout {batch['payout_id'] or '(none)'}: up to {batch['up_to']}, {batch_status(batch)}",
        no_wrap=("partner", "pays"),
    )
    for row in batch["rows"]:
        failure = row.get("failure")
        outcome = row.get("outcome") or "-"
        listing.add(
            row["partner_code"],
            row["partner_name"],
            payee(row),
            row["currency"],
            money(row["amount"], row["currency"]),
            row["lines"],
            f"{outcome}: {failure['reason']}" if failure else outcome,
        )
    return listing


def payee(row: dict[str, Any]) -> str:
    """The account a row pays: `paypal alice@paypal.test`, else the partner's email, else `-`."""
    if row.get("payout_method"):
        return f"{row['payout_method']} {row['payout_email']}"
    return str(row.get("partner_email") or "-")


def batch_status(batch: dict[str, Any]) -> str:
    """`open`, `paid`, `paid, 1 row failed`, `cancelled`."""
    failed = sum(1 for row in batch["rows"] if row.get("outcome") == "failed")
    return f"{batch['status']}, {failed} row(s) failed" if failed else str(batch["status"])


NOT_PAID = {
    "below_minimum": "below the payout minimum",
    "no_payout_details": "no payout details",
    "currency_not_supported": "their payout currency or service cannot take this currency",
    "negative_balance": "owes more than is due",
    "nothing_due": "nothing due",
}


def not_paid_listing(batch: dict[str, Any]) -> Listing:
    """Who the batch does not pay, what stays owed to them and why (CONTRACT 15: their lines
    stay approved and unpaid for a later batch)."""
    listing = Listing(
        ("partner", "name", "currency", "owed", "lines", "why not paid"),
        title="not paid",
        no_wrap=("partner",),
    )
    for item in batch["not_paid"]:
        reason = str(item["reason"])
        lines = item.get("lines")
        listing.add(
            item["partner_code"],
            item.get("partner_name") or "-",
            item["currency"],
            money(item["balance"], item["currency"]),
            "-" if lines is None else lines,
            f"{reason} ({NOT_PAID[reason]})" if reason in NOT_PAID else reason,
        )
    return listing


@click.group(
    short_help="payout batches: create, list, export, mark paid, cancel, a row failed (owner)",
    epilog=examples(
        "tally payouts create --program prog_... --up-to 2026-01-31",
        "tally payouts export --program prog_... --payout po_... --format csv -o payout.csv",
    ),
)
def payouts() -> None:
    """Pay partners from tally: a batch takes every approved, unpaid line dated up to a date,
    netted per partner and currency, and records what it pays to whom; a partner it cannot pay
    (below the minimum, no payout details, a currency their service cannot take) keeps their
    lines for a later batch. An open batch can be cancelled; a paid batch's row whose payment
    failed is owed again. Needs a workspace owner's login."""


@payouts.command(
    "create",
    short_help="make a batch of every approved, unpaid line up to a date",
    epilog=examples("tally payouts create --program prog_... --up-to 2026-01-31"),
)
@program_option
@click.option(
    "--up-to", required=True, metavar="YYYY-MM-DD", help="cut-off day: lines dated up to it (included)"
)
@json_option("the batch")
def payouts_create(program: str, up_to: str, as_json: bool) -> None:
    """Make a payout batch, and say who it does not pay and why (their lines stay approved and
    unpaid for a later batch). Nothing new to pay: shows the batch that already has this
    cut-off (or says none was made); a line is never in two live batches."""
    status, batch = call_status("POST", _path(program), body={"up_to": up_to})
    if as_json:
        emit(batch)
        return
    if batch["rows"]:
        show(batch_listing(batch))
    if batch["not_paid"]:
        show(not_paid_listing(batch))
    if status == 201:
        print(f"new batch {batch['payout_id']}: {batch['lines']} line(s); mark it paid once paid")
    elif batch["payout_id"]:
        print(f"nothing new to pay: batch {batch['payout_id']} already has this cut-off")
    else:
        print("nothing new to pay up to this date: no batch made")


@payouts.command(
    "list",
    short_help="the program's payout batches, newest first",
    epilog=examples("tally payouts list --program prog_...", "tally payouts list --program prog_... --json"),
)
@program_option
@json_option("the batches (an array)")
def payouts_list(program: str, as_json: bool) -> None:
    """One row per batch: number, id, cut-off, status (open, paid, cancelled; how many rows of a
    paid batch failed), when made and paid, lines, what it pays (failed rows left out; a
    cancelled batch nothing)."""
    batches = call("GET", _path(program))
    if as_json:
        emit(batches)
        return
    listing = Listing(
        ("#", "payout", "up to", "status", "made", "paid", "lines", "pays"),
        title=f"payout batches of {program}",
        no_wrap=("payout", "pays"),
    )
    for b in batches:
        totals = [] if b["status"] == "cancelled" else b["totals"]  # a cancelled batch pays nothing
        pays = ", ".join(f"{t['amount_decimal']} {t['currency'].upper()}" for t in totals) or "-"
        listing.add(
            b["number"],
            b["payout_id"],
            b["up_to"],
            batch_status(b),
            str(b["created_at"])[:10],
            str(b["paid_at"] or "")[:10],
            b["lines"],
            pays,
        )
    show(listing)


@payouts.command(
    "export",
    short_help="download a batch (csv, xlsx or json) to pay from",
    epilog=examples(
        "tally payouts export --program prog_... --payout po_... --format xlsx -o payout.xlsx",
        "tally payouts export --program prog_... --payout po_... --format csv -o -",
    ),
)
@program_option
@click.option("--payout", required=True, metavar="PAYOUT", help="payout batch id (po_...)")
@click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="csv", show_default=True, help="file format"
)
@output_option
def payouts_export(program: str, payout: str, fmt: str, output: str) -> None:
    """Download a payout batch: one row per partner and currency with name, email, amount and
    lines. csv: UTF-8 with a BOM, money as decimal numbers."""
    content = fetch_bytes(f"{_payout(program, payout)}?{urlencode({'format': fmt})}")
    write_file(content, output, f"payout {payout}, {fmt}")


@payouts.command(
    "mark-paid",
    short_help="mark a batch paid: its lines become paid",
    epilog=examples("tally payouts mark-paid --program prog_... --payout po_..."),
)
@program_option
@click.option("--payout", required=True, metavar="PAYOUT", help="payout batch id (po_...)")
@json_option("the batch")
def payouts_mark_paid(program: str, payout: str, as_json: bool) -> None:
    """Record that a batch was paid. Its lines become `paid`; a later refund is a clawback the
    next batch nets, and a row whose payment failed is owed again (`tally payouts row-failed`).
    Marking it again changes nothing; a cancelled batch cannot be paid (invalid_transition)."""
    batch = call("POST", _payout(program, payout, "/paid"))
    if as_json:
        emit(batch)
        return
    print(f"payout {batch['payout_id']} paid (marked by {batch['paid_by']} at {batch['paid_at']})")


@payouts.command(
    "cancel",
    short_help="cancel an open batch: its lines are due again",
    epilog=examples("tally payouts cancel --program prog_... --payout po_... --reason 'wrong cut-off'"),
)
@program_option
@click.option("--payout", required=True, metavar="PAYOUT", help="payout batch id (po_...)")
@click.option("--reason", required=True, help="why (kept in the log and on the batch)")
@json_option("the batch")
def payouts_cancel(program: str, payout: str, reason: str, as_json: bool) -> None:
    """Cancel an open batch (POST .../payouts/{payout_id}/cancel): its lines are approved and
    unpaid again, for a later batch; the batch stays listed as cancelled, with who and why.
    Cancelling it again changes nothing. A paid batch cannot be cancelled (batch_paid): mark
    the row whose payment failed with `tally payouts row-failed`."""
    batch = call("POST", _payout(program, payout, "/cancel"), body={"reason": reason})
    if as_json:
        emit(batch)
        return
    print(
        f"payout {batch['payout_id']} cancelled by {batch['cancelled_by']} at {batch['cancelled_at']} "
        f"({batch['cancel_reason']}): its {batch['lines']} line(s) are due again"
    )


@payouts.command(
    "row-failed",
    short_help="mark one row of a paid batch failed: its lines are owed again",
    epilog=examples(
        "tally payouts row-failed --program prog_... --payout po_... --partner alice --currency usd "
        "--reason 'PayPal returned it: account closed'"
    ),
)
@program_option
@click.option("--payout", required=True, metavar="PAYOUT", help="payout batch id (po_...)")
@click.option("--partner", required=True, metavar="CODE", help="the row's partner code")
@click.option("--currency", required=True, type=CURRENCY, metavar="CUR", help="the row's currency (usd)")
@click.option("--reason", required=True, help="why the payment failed (kept in the log and on the row)")
@json_option("the batch")
def payouts_row_failed(
    program: str, payout: str, partner: str, currency: str, reason: str, as_json: bool
) -> None:
    """Record that one row of a paid batch was not received (a payment that bounced): POST
    .../payouts/{payout_id}/rows/{partner_code}/{currency}/failed. The row shows `failed` with
    the reason; its lines are owed again (the partner's statement books `payout_failed`) and a
    later batch pays them; the batch's other rows and its files do not change. Again: no change.
    An open batch's row cannot fail (invalid_transition): cancel the batch instead."""
    suffix = f"/rows/{quote(partner, safe='')}/{quote(currency, safe='')}/failed"
    batch = call("POST", _payout(program, payout, suffix), body={"reason": reason})
    if as_json:
        emit(batch)
        return
    show(batch_listing(batch))
    row = next(r for r in batch["rows"] if (r["partner_code"], r["currency"]) == (partner, currency))
    print(
        f"{partner}'s {money(row['amount'], currency)} in payout {batch['payout_id']} failed: "
        "owed again, a later batch pays it"
    )
