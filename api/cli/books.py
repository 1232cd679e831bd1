"""A program's books over HTTP with the account credential: `tally explain`, `tally backfill`,
`tally report finance|double-counting`."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import click

from api.cli.client import call, fetch_bytes
from api.cli.errors import ApiError, CliError
from api.cli.options import examples, json_option, output_option, program_option
from api.cli.output import Listing, Progress, delta, emit, money, show


def program_path(program: str, suffix: str = "") -> str:
    return f"/api/v1/programs/{quote(program, safe='')}{suffix}"


def lines_listing(lines: list[dict[str, Any]], title: str | None = None) -> Listing:
    """A sale's commission lines: kind, partner, month, amount as money, status (with its
    reason), booking and payout."""
    listing = Listing(("kind", "partner", "period", "amount", "status", "booked", "payout"), title=title)
    for line in lines:
        why = f" ({line['status_reason']})" if line.get("status_reason") else ""
        listing.add(
            line["kind"],
            line["partner_code"],
            line["period"],
            money(line["amount"], line["currency"]),
            f"{line['status']}{why}",
            str(line.get("booked_at") or "-"),
            line.get("payout_id") or "-",
        )
    return listing


# -- explain -------------------------------------------------------------------------------------
RECONCILE_HINT = (
    "run `tally reconcile` (operator) or wait for the next scheduled run "
    "(TALLY_RECONCILE_INTERVAL_SECONDS), then try again"
)
LOG_PAGES = 4  # how far back the tracking log is searched for the sale (pages of 500 lines)


def logged_sale(program: str, transaction: str) -> str | None:
    """When the program's tracking log accepted a sale with this transaction id (`track/sale`),
    or None when it did not (among its newest lines) or cannot be read."""
    before: int | None = None
    for _ in range(LOG_PAGES):
        query = {"limit": "500"} | ({"before": str(before)} if before else {})
        try:
            page = call("GET", program_path(program, f"/tracking-log?{urlencode(query)}"))
        except CliError:
            return None
        for entry in page["entries"]:
            detail = str(entry.get("detail") or "")
            if entry.get("outcome") == "accepted" and detail.startswith(f"sale {transaction} "):
                return str(entry["at"])
        before = page.get("next_before")
        if not before:
            return None
    return None


def not_reconciled(exc: ApiError, program: str, transaction: str) -> str | None:
    """What to add to a `sale_not_found` when the sale is only waiting for the reconciler: the
    server's hint when it gives one, else a hint when the tracking log has the sale."""
    hint = exc.extra.get("hint")
    if exc.extra.get("recorded") is False:  # never recorded: the server's hint says what to check
        return hint if isinstance(hint, str) and hint.strip() else None
    if isinstance(hint, str) and hint.strip():
        return hint if "tally reconcile" in hint else f"{hint.rstrip('. ')}: {RECONCILE_HINT}"
    if "tally reconcile" in exc.message:
        return None  # the message says it already
    if exc.extra.get("reconciled") is False or "not reconciled yet" in exc.message:
        return f"not reconciled yet: {RECONCILE_HINT}"
    logged = logged_sale(program, transaction)
    if logged is not None:
        return f"the sale is in the raw log (accepted at {logged}) but not reconciled yet: {RECONCILE_HINT}"
    return None


@click.command(
    short_help="the attribution ladder, step by step, for one sale",
    epilog=examples(
        "tally explain --program prog_... --transaction in_1234",
        "tally explain --program prog_... --transaction in_1234 --json",
    ),
)
@program_option
@click.option("--transaction", required=True, metavar="ID", help="the sale's transaction id")
@json_option("the explanation")
def explain(program: str, transaction: str, as_json: bool) -> None:
    """Why a sale was (or was not) attributed: each rung of the ladder, what it looked up and
    what it found; then its commission lines with their bookings. A sale accepted but not yet
    reconciled is said to be so."""
    try:
        data = call("GET", program_path(program, f"/sales/{quote(transaction, safe='')}/explain"))
    except ApiError as exc:
        hint = not_reconciled(exc, program, transaction) if exc.code == "sale_not_found" else None
        if hint is None:
            raise
        raise CliError(f"{exc}; {hint}") from None
    if as_json:
        emit(data)
        return
    sale = data["sale"]
    print(f"{sale['transaction_id']} {money(sale['amount'], sale['currency'])} ({sale['source']})")
    steps = Listing(("step", "rule", "looked up", "found", "result"), title="attribution")
    for step in data["steps"]:
        steps.add(step["step"], step["rule"], step["looked_up"], step["found"], step["result"])
    show(steps)
    print(f"answer: {data['answer']}")
    status = sale.get("commission_status")
    commission = money(sale.get("commission"), sale["currency"])
    print(f"commission: {commission} ({status})" if status else f"commission: {commission}")
    if data.get("lines"):
        show(lines_listing(data["lines"], title="commission lines"))


# -- backfill --------------------------------------------------------------------------------------
def diff_listing(data: dict[str, Any]) -> Listing:
    listing = Listing(
        ("transaction", "date", "partner", "rule", "commission"),
        title="sales whose attribution or commission would change" if data["dry_run"] else "changed sales",
    )
    for row in data["changed_sales"]:
        listing.add(
            row["transaction_id"],
            str(row["occurred_at"])[:10],
            f"{row['before_partner_code'] or '-'} -> {row['after_partner_code'] or '-'}",
            f"{row['before_attribution_rule'] or row['before_unattributed_reason'] or '-'} -> "
            f"{row['after_attribution_rule'] or row['after_unattributed_reason'] or '-'}",
            f"{money(row['before_commission'], row['currency'])} -> "
            f"{money(row['after_commission'], row['currency'])}",
        )
    return listing


def partner_listing(data: dict[str, Any]) -> Listing:
    listing = Listing(
        ("partner", "currency", "before", "after", "delta"), title="per-partner commission totals"
    )
    for row in data["partner_totals"]:
        currency = row["currency"]
        listing.add(
            row["partner_code"],
            currency,
            money(row["before"], currency),
            money(row["after"], currency),
            delta(row["delta"], currency),
        )
    return listing


@click.command(
    short_help="re-run attribution over a date range (dry run unless --apply)",
    epilog=examples(
        "tally backfill --program prog_... --from 2026-10-01 --to 2026-10-31",
        "tally backfill --program prog_... --from 2026-10-01 --to 2026-10-31 --apply",
    ),
)
@program_option
@click.option("--from", "start", required=True, metavar="YYYY-MM-DD", help="first day")
@click.option("--to", "end", required=True, metavar="YYYY-MM-DD", help="last day, included")
@click.option("--apply", is_flag=True, help="apply the changes (default: dry run)")
@json_option("the diff")
def backfill(program: str, start: str, end: str, apply: bool, as_json: bool) -> None:
    """Show which sales' attribution or commission would change if attribution were re-run over
    the range (with the metadata fixes recorded so far); --apply applies it."""
    body = {"from": start, "to": end, "dry_run": not apply}
    with Progress("re-running attribution over the range"):
        data = call("POST", program_path(program, "/backfill"), body=body)
    if as_json:
        emit(data)
        return
    show(diff_listing(data), partner_listing(data))
    picked = data.get("picked_up") or []
    if picked:
        verb = "picked up" if apply else "would pick up"
        ids = ", ".join(str(e["event_id"]) for e in picked)
        print(f"{verb} {len(picked)} unroutable processor event(s): {ids}")
    if apply:
        print(f"applied changes to {data['changes']} sale(s)")
        print(f"applied by {data['applied_by']} at {data['applied_at']} ({data['backfill_id']})")
    else:
        print(f"{data['changes']} sale(s) would change")
        print("dry run: nothing changed. Re-run with --apply to apply it.")


# -- reports ---------------------------------------------------------------------------------------
def this_month() -> str:
    """The current month in UTC, `YYYY-MM`: the finance report's default period."""
    return datetime.now(UTC).strftime("%Y-%m")


def write_file(content: bytes, output: str, what: str) -> None:
    """A downloaded file to `output` (`-`: stdout), saying so on stderr."""
    if output == "-":
        sys.stdout.buffer.write(content)
        return
    Path(output).write_bytes(content)
    print(f"wrote {len(content)} bytes to {output} ({what})", file=sys.stderr)


# The formats the server renders (reports/render.py FINANCE_FORMATS, DOUBLE_COUNTING_FORMATS;
# tests/test_cli_click.py holds them equal). Not imported from there: that module loads Polars.
REPORT_FORMATS = {"finance": ("json", "csv", "html", "xlsx"), "double-counting": ("json", "csv")}
REPORT_PERIOD_HELP = {
    "finance": "the month (default: the current month in UTC)",
    "double-counting": "only the double counts whose record occurred in this month (default: every month)",
}
REPORT_EXAMPLES = {
    "finance": (
        "tally report finance --program prog_... --period 2026-11 --format xlsx -o finance-2026-11.xlsx",
        "tally report finance --program prog_... --format csv -o - | head",
    ),
    "double-counting": (
        "tally report double-counting --program prog_... -o double-counts.json",
        "tally report double-counting --program prog_... --period 2026-11 --format csv -o -",
    ),
}


@click.group(
    short_help="download a report (finance, double-counting)",
    epilog=examples(*REPORT_EXAMPLES["finance"][:1], *REPORT_EXAMPLES["double-counting"][:1]),
)
def report() -> None:
    """Download a report of one program (finance, double-counting)."""


def _report_command(kind: str, formats: tuple[str, ...]) -> click.Command:
    @click.command(
        kind,
        short_help=f"the {kind} report ({', '.join(formats)})",
        epilog=examples(*REPORT_EXAMPLES[kind]),
    )
    @program_option
    @click.option("--period", metavar="YYYY-MM", help=REPORT_PERIOD_HELP[kind])
    @click.option(
        "--format", "fmt", type=click.Choice(formats), default="json", show_default=True, help="file format"
    )
    @output_option
    def command(program: str, period: str | None, fmt: str, output: str) -> None:
        period = period or (this_month() if kind == "finance" else None)
        params = {"format": fmt} | ({"period": period} if period else {})
        with Progress("building the report"):
            content = fetch_bytes(program_path(program, f"/reports/{kind}?{urlencode(params)}"))
        write_file(content, output, f"{kind}, {period or 'every period'}")

    command.help = f"Download the {kind} report of a program as {', '.join(formats)}."
    return command


for _kind, _formats in REPORT_FORMATS.items():
    report.add_command(_report_command(_kind, _formats))
