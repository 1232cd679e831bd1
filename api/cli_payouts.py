"""`tally payouts create|list|export|mark-paid`: payout batches from the CLI, over HTTP with the
stored login (a workspace owner's account token), like the other account commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from rich.console import Console
from rich.table import Table

from api.cli_http import call, call_status, emit, examples, fetch_bytes

FORMATS = ("csv", "xlsx", "json")


def _path(program: str, suffix: str = "") -> str:
    return f"/api/v1/programs/{quote(program, safe='')}/payouts{suffix}"


def batch_table(batch: dict[str, Any]) -> Table:
    """One row per partner and currency: what the batch pays and what it carries forward."""
    title = f"payout {batch['payout_id'] or '(none)'}: up to {batch['up_to']}, {batch['status']}"
    table = Table(title=title)
    for column in (
        "partner",
        "name",
        "email",
        "currency",
        "pays",
        "lines",
        "net",
        "carried in",
        "carried on",
    ):
        table.add_column(column)
    for row in batch["rows"]:
        table.add_row(
            row["partner_code"],
            row["partner_name"] or "",
            row["partner_email"] or "",
            row["currency"],
            row["amount_decimal"],
            str(row["lines"]),
            str(row["net"]),
            str(row["carried_in"]),
            str(row["carried_forward"]),
        )
    return table


def cmd_create(args: argparse.Namespace) -> None:
    status, batch = call_status("POST", _path(args.program), body={"up_to": args.up_to})
    if args.json:
        emit(batch)
        return
    out = Console()
    out.print(batch_table(batch))
    if status == 201:
        out.print(f"new batch {batch['payout_id']}: {batch['lines']} line(s); mark it paid once paid")
    elif batch["payout_id"]:
        out.print(f"nothing new to pay: batch {batch['payout_id']} already has this cut-off")
    else:
        out.print("nothing new to pay up to this date: no batch made")


def cmd_list(args: argparse.Namespace) -> None:
    batches = call("GET", _path(args.program))
    if args.json:
        emit(batches)
        return
    table = Table(title=f"payout batches of {args.program}")
    for column in ("#", "payout", "up to", "status", "made", "paid", "lines", "pays"):
        table.add_column(column, no_wrap=column in ("payout", "pays"))
    for b in batches:
        pays = ", ".join(f"{t['amount_decimal']} {t['currency'].upper()}" for t in b["totals"]) or "-"
        table.add_row(
            str(b["number"]),
            b["payout_id"],
            b["up_to"],
            b["status"],
            str(b["created_at"])[:10],
            str(b["paid_at"] or "")[:10],
            str(b["lines"]),
            pays,
        )
    Console().print(table)


def cmd_export(args: argparse.Namespace) -> None:
    query = urlencode({"format": args.format})
    content = fetch_bytes(f"{_path(args.program, '/' + quote(args.payout, safe=''))}?{query}")
    if args.output == "-":
        sys.stdout.buffer.write(content)
    else:
        Path(args.output).write_bytes(content)
        print(
            f"wrote {len(content)} bytes to {args.output} (payout {args.payout}, {args.format})",
            file=sys.stderr,
        )


def cmd_mark_paid(args: argparse.Namespace) -> None:
    batch = call("POST", _path(args.program, f"/{quote(args.payout, safe='')}/paid"))
    if args.json:
        emit(batch)
        return
    print(f"payout {batch['payout_id']} paid (marked by {batch['paid_by']} at {batch['paid_at']})")


def add_payouts(sub: Any) -> None:
    payouts = sub.add_parser(
        "payouts",
        help="payout batches: create, list, export, mark paid (owner)",
        description="Pay partners from tally: a batch takes every approved, unpaid commission "
        "line dated up to a date, netted per partner and currency (a negative balance carries "
        "to the next batch). Needs a workspace owner's login.",
        epilog=examples(
            "tally payouts create --program prog_... --up-to 2026-01-31",
            "tally payouts export --program prog_... --payout po_... --format csv -o payout.csv",
        ),
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    create = payouts.add_parser(
        "create",
        help="make a batch of every approved, unpaid line up to a date",
        description="Make a payout batch. Nothing new to pay: shows the batch that already has "
        "this cut-off (or says none was made); a line is never in two batches.",
        epilog=examples("tally payouts create --program prog_... --up-to 2026-01-31"),
    )
    create.add_argument("--program", required=True, help="program id (prog_...)")
    create.add_argument(
        "--up-to",
        dest="up_to",
        required=True,
        metavar="YYYY-MM-DD",
        help="cut-off day: lines dated up to it (included)",
    )
    create.add_argument("--json", action="store_true", help="print the batch as JSON")
    create.set_defaults(func=cmd_create)
    plist = payouts.add_parser(
        "list",
        help="the program's payout batches, newest first",
        description="One line per batch: number, id, cut-off, status, when made and paid, lines, totals.",
        epilog=examples(
            "tally payouts list --program prog_...", "tally payouts list --program prog_... --json"
        ),
    )
    plist.add_argument("--program", required=True, help="program id (prog_...)")
    plist.add_argument("--json", action="store_true", help="print the batches as a JSON array")
    plist.set_defaults(func=cmd_list)
    export = payouts.add_parser(
        "export",
        help="download a batch (csv, xlsx or json) to pay from",
        description="Download a payout batch: one row per partner and currency with name, "
        "email, amount and lines. csv: UTF-8 with a BOM, money as decimal numbers.",
        epilog=examples(
            "tally payouts export --program prog_... --payout po_... --format xlsx -o payout.xlsx",
            "tally payouts export --program prog_... --payout po_... --format csv -o -",
        ),
    )
    export.add_argument("--program", required=True, help="program id (prog_...)")
    export.add_argument("--payout", required=True, help="payout batch id (po_...)")
    export.add_argument("--format", default="csv", choices=FORMATS, help="file format (default: %(default)s)")
    export.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="where to write it; `-` writes to stdout"
    )
    export.set_defaults(func=cmd_export)
    paid = payouts.add_parser(
        "mark-paid",
        help="mark a batch paid: its lines become paid",
        description="Record that a batch was paid. Its lines become `paid` and never change; a "
        "later refund is a clawback the next batch nets. Marking it again changes nothing.",
        epilog=examples("tally payouts mark-paid --program prog_... --payout po_..."),
    )
    paid.add_argument("--program", required=True, help="program id (prog_...)")
    paid.add_argument("--payout", required=True, help="payout batch id (po_...)")
    paid.add_argument("--json", action="store_true", help="print the batch as JSON")
    paid.set_defaults(func=cmd_mark_paid)
