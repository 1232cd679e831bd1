"""`tally payouts create|list|export|mark-paid`: payout batches, over HTTP with a workspace
owner's account credential."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import click

from api.cli.books import program_path, write_file
from api.cli.client import call, call_status, fetch_bytes
from api.cli.options import examples, json_option, output_option, program_option
from api.cli.output import Listing, emit, show

FORMATS = ("csv", "xlsx", "json")


def _path(program: str, suffix: str = "") -> str:
    return program_path(program, f"/payouts{suffix}")


def _payout(program: str, payout: str, suffix: str = "") -> str:
    return _path(program, f"/{quote(payout, safe='')}{suffix}")


def batch_listing(batch: dict[str, Any]) -> Listing:
    """One row per partner and currency: what the batch pays and what it carries forward."""
    listing = Listing(
        ("partner", "name", "email", "currency", "pays", "lines", "net", "carried in", "carried on"),
        title=f"payout {batch['payout_id'] or '(none)'}: up to {batch['up_to']}, {batch['status']}",
    )
    for row in batch["rows"]:
        listing.add(
            row["partner_code"],
            row["partner_name"],
            row["partner_email"],
            row["currency"],
            row["amount_decimal"],
            row["lines"],
            row["net"],
            row["carried_in"],
            row["carried_forward"],
        )
    return listing


@click.group(
    short_help="payout batches: create, list, export, mark paid (owner)",
    epilog=examples(
        "tally payouts create --program prog_... --up-to 2026-01-31",
        "tally payouts export --program prog_... --payout po_... --format csv -o payout.csv",
    ),
)
def payouts() -> None:
    """Pay partners from tally: a batch takes every approved, unpaid commission line dated up
    to a date, netted per partner and currency (a negative balance carries to the next batch).
    Needs a workspace owner's login."""


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
    """Make a payout batch. Nothing new to pay: shows the batch that already has this cut-off
    (or says none was made); a line is never in two batches."""
    status, batch = call_status("POST", _path(program), body={"up_to": up_to})
    if as_json:
        emit(batch)
        return
    show(batch_listing(batch))
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
    """One row per batch: number, id, cut-off, status, when made and paid, lines, totals."""
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
        pays = ", ".join(f"{t['amount_decimal']} {t['currency'].upper()}" for t in b["totals"]) or "-"
        listing.add(
            b["number"],
            b["payout_id"],
            b["up_to"],
            b["status"],
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
    """Record that a batch was paid. Its lines become `paid` and never change; a later refund is
    a clawback the next batch nets. Marking it again changes nothing."""
    batch = call("POST", _payout(program, payout, "/paid"))
    if as_json:
        emit(batch)
        return
    print(f"payout {batch['payout_id']} paid (marked by {batch['paid_by']} at {batch['paid_at']})")
