"""CLI verbs for operations: reconcile, backfill, report, explain, demo (all over HTTP)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from api.cli_http import CliError, call, emit, examples, fetch_bytes, operator_target, stream
from reports.money import NO_CURRENCY, amount_text

console = Console(stderr=True)


def progress_bar(console: Console = console) -> Progress:
    """The CLI's progress display for long work (on stderr): stage, bar, done/total, time."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def cmd_reconcile(args: argparse.Namespace) -> None:
    url, token = operator_target(args.url)
    summary: dict[str, Any] | None = None
    with progress_bar() as bar:
        task = bar.add_task("reconcile", total=1)
        for line in stream("POST", "/api/v1/operator/reconcile", url=url, token=token):
            if "progress" in line:
                p = line["progress"]
                bar.update(task, description=p["stage"], completed=p["done"], total=max(1, p["total"]))
            elif "error" in line:
                raise CliError(f"{line['error']['code']}: {line['error']['message']}")
            elif "data" in line:
                summary = line["data"]
                bar.update(task, completed=1, total=1, description="done")
    if summary is None:
        raise CliError("the server closed the stream without a result")
    if args.json:
        emit(summary)
        return
    unroutable = int(summary.get("unroutable", 0))
    print(
        f"run {summary['run_id']}: {summary['events_read']} events read, {summary['sales']} sales, "
        f"{summary['commissions']} commission lines, {unroutable} unroutable events "
        f"in {summary['duration_ms']} ms"
    )
    if unroutable:
        print("processor events routed to no program: `tally unroutable` lists them and why", file=sys.stderr)


def _count(text: str) -> int:
    """A non-negative whole number (argparse type)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


def cmd_unroutable(args: argparse.Namespace) -> None:
    url, token = operator_target(args.url)
    events: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = {"limit": "500"} | ({"cursor": cursor} if cursor else {})
        page = call("GET", f"/api/v1/operator/unroutable?{urlencode(query)}", url=url, token=token)
        events += page["events"]
        cursor = page["next_cursor"]
        if cursor is None or (args.limit and len(events) >= args.limit):
            break
    if args.limit:
        events = events[: args.limit]
    if args.json:
        emit(events)
        return
    table = Table(title=f"{len(events)} unroutable event(s), newest first (as of the last reconcile run)")
    for column in ("received", "event", "type", "account", "reason", "routes to"):
        table.add_column(column)
    for e in events:
        table.add_row(
            str(e["received_at"])[:19].replace("T", " "),
            str(e["event_id"] or "-"),
            str(e["type"] or "-"),
            str(e["account"] or "-"),
            e["reason"],
            str(e["routes_to"] or "-"),
        )
    Console().print(table)


def _money(minor: int | None, currency: str | None) -> str:
    """Minor units as money in the currency's decimals: `780, "usd"` -> `7.80 usd`,
    `1250, "kwd"` -> `1.250 kwd`, `500, "jpy"` -> `500 jpy`; no amount -> `-`."""
    if minor is None:
        return "-"
    code = currency or NO_CURRENCY
    return f"{amount_text(minor, code)} {code}"


def _delta(minor: int, currency: str | None) -> str:
    """A signed change as money: `+7.80 usd`, `-1.250 kwd`, `+0.00 usd`."""
    return ("-" if minor < 0 else "+") + _money(abs(minor), currency)


def diff_table(data: dict[str, Any]) -> Table:
    table = Table(title=f"{data['changes']} sale(s) would change" if data["dry_run"] else "applied changes")
    for column in ("transaction", "date", "partner", "rule", "commission"):
        table.add_column(column)
    for row in data["changed_sales"]:
        table.add_row(
            str(row["transaction_id"]),
            str(row["occurred_at"])[:10],
            f"{row['before_partner_code'] or '-'} -> {row['after_partner_code'] or '-'}",
            f"{row['before_attribution_rule'] or row['before_unattributed_reason'] or '-'} -> "
            f"{row['after_attribution_rule'] or row['after_unattributed_reason'] or '-'}",
            f"{_money(row['before_commission'], row['currency'])} -> "
            f"{_money(row['after_commission'], row['currency'])}",
        )
    return table


def partner_table(data: dict[str, Any]) -> Table:
    table = Table(title="per-partner commission totals")
    for column in ("partner", "currency", "before", "after", "delta"):
        table.add_column(column)
    for row in data["partner_totals"]:
        currency = row["currency"]
        table.add_row(
            row["partner_code"],
            currency,
            _money(row["before"], currency),
            _money(row["after"], currency),
            _delta(row["delta"], currency),
        )
    return table


def cmd_backfill(args: argparse.Namespace) -> None:
    body = {"from": args.start, "to": args.end, "dry_run": not args.apply}
    with console.status("re-running attribution over the range…"):
        data = call("POST", f"/api/v1/programs/{quote(args.program)}/backfill", body=body)
    if args.json:
        emit(data)
        return
    out = Console()
    out.print(diff_table(data))
    out.print(partner_table(data))
    picked = data.get("picked_up") or []
    if picked:
        verb = "picked up" if args.apply else "would pick up"
        ids = ", ".join(str(e["event_id"]) for e in picked)
        out.print(f"{verb} {len(picked)} unroutable processor event(s): {ids}")
    if args.apply:
        out.print(f"applied by {data['applied_by']} at {data['applied_at']} ({data['backfill_id']})")
    else:
        out.print("dry run: nothing changed. Re-run with --apply to apply it.")


def this_month() -> str:
    """The current month in UTC, `YYYY-MM`: the finance report's default period."""
    return datetime.now(UTC).strftime("%Y-%m")


def cmd_report(args: argparse.Namespace) -> None:
    period = args.period or (this_month() if args.kind == "finance" else None)
    params = {"format": args.format} | ({"period": period} if period else {})
    with console.status("building the report…"):
        content = fetch_bytes(
            f"/api/v1/programs/{quote(args.program)}/reports/{args.kind}?{urlencode(params)}"
        )
    if args.output == "-":
        sys.stdout.buffer.write(content)
    else:
        Path(args.output).write_bytes(content)
        print(
            f"wrote {len(content)} bytes to {args.output} ({args.kind}, {period or 'every period'})",
            file=sys.stderr,
        )


def cmd_explain(args: argparse.Namespace) -> None:
    path = f"/api/v1/programs/{quote(args.program)}/sales/{quote(args.transaction, safe='')}/explain"
    data = call("GET", path)
    if args.json:
        emit(data)
        return
    sale = data["sale"]
    out = Console()
    out.print(f"[bold]{sale['transaction_id']}[/bold] {sale['amount']} {sale['currency']} ({sale['source']})")
    table = Table()
    for column in ("step", "rule", "looked up", "found", "result"):
        table.add_column(column)
    for step in data["steps"]:
        table.add_row(
            str(step["step"]), step["rule"], step["looked_up"] or "", step["found"] or "", step["result"]
        )
    out.print(table)
    out.print(f"answer: {data['answer']}")
    status = sale.get("commission_status")
    commission = _money(sale.get("commission"), sale["currency"])
    out.print(f"commission: {commission} ({status})" if status else f"commission: {commission}")


def cmd_demo(args: argparse.Namespace) -> None:
    from api.demo import run_demo

    url, token = operator_target(args.url)
    run_demo(url, token, Path(args.state))


# The formats the server renders (reports/render.py FINANCE_FORMATS, DOUBLE_COUNTING_FORMATS; a
# test holds them equal). Not imported from there: that module loads Polars.
REPORT_FORMATS = {"finance": ("json", "csv", "html", "xlsx"), "double-counting": ("json", "csv")}
REPORT_PERIOD_HELP = {
    "finance": "the month, YYYY-MM (default: the current month in UTC)",
    "double-counting": "only the double counts whose record occurred in this month, YYYY-MM "
    "(default: every month)",
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


def add_operations(sub: Any) -> None:
    rec = sub.add_parser(
        "reconcile",
        help="run the reconciler now (operator)",
        description="Run the reconciler on the server now, with a progress bar on stderr. Needs "
        "TALLY_OPERATOR_TOKEN.",
        epilog=examples("TALLY_OPERATOR_TOKEN=... tally reconcile", "tally reconcile --json"),
    )
    rec.add_argument("--url", help="the server's base URL (default: the login's, else TALLY_BASE_URL)")
    rec.add_argument("--json", action="store_true", help="print the run's summary as JSON")
    rec.set_defaults(func=cmd_reconcile)

    lost = sub.add_parser(
        "unroutable",
        help="list the processor events routed to no program (operator)",
        description="List the processor events no program could be routed to, newest first, with "
        "the reason (as of the last reconcile run). `awaiting_backfill`: a program has the account "
        "now, and its next `tally backfill --apply` covering the event's date picks it up. Needs "
        "TALLY_OPERATOR_TOKEN.",
        epilog=examples("TALLY_OPERATOR_TOKEN=... tally unroutable", "tally unroutable --limit 20 --json"),
    )
    lost.add_argument("--url", help="the server's base URL (default: the login's, else TALLY_BASE_URL)")
    lost.add_argument("--limit", type=_count, default=0, help="show at most this many (default: all)")
    lost.add_argument("--json", action="store_true", help="print the events as a JSON array")
    lost.set_defaults(func=cmd_unroutable)

    back = sub.add_parser(
        "backfill",
        help="re-run attribution over a date range (dry run unless --apply)",
        description="Show which sales' attribution or commission would change if attribution were "
        "re-run over the range (with the metadata fixes recorded so far); --apply applies it.",
        epilog=examples(
            "tally backfill --program prog_... --from 2026-10-01 --to 2026-10-31",
            "tally backfill --program prog_... --from 2026-10-01 --to 2026-10-31 --apply",
        ),
    )
    back.add_argument("--program", required=True, help="program id (prog_...)")
    back.add_argument("--from", dest="start", required=True, help="first day, YYYY-MM-DD")
    back.add_argument("--to", dest="end", required=True, help="last day, YYYY-MM-DD, included")
    back.add_argument("--apply", action="store_true", help="apply the changes (default: dry run)")
    back.add_argument("--json", action="store_true", help="print the diff as JSON instead of tables")
    back.set_defaults(func=cmd_backfill)

    reports = sub.add_parser(
        "report",
        help="download a report (finance, double-counting)",
        description="Download a report of one program.",
        epilog=examples(*REPORT_EXAMPLES["finance"][:1], *REPORT_EXAMPLES["double-counting"][:1]),
    ).add_subparsers(dest="action", required=True, metavar="REPORT")
    for kind, formats in REPORT_FORMATS.items():
        report = reports.add_parser(
            kind,
            help=f"the {kind} report ({', '.join(formats)})",
            description=f"Download the {kind} report of a program as {', '.join(formats)}.",
            epilog=examples(*REPORT_EXAMPLES[kind]),
        )
        report.add_argument("--program", required=True, help="program id (prog_...)")
        report.add_argument("--period", metavar="YYYY-MM", help=REPORT_PERIOD_HELP[kind])
        report.add_argument(
            "--format", default="json", choices=formats, help="file format (default: %(default)s)"
        )
        report.add_argument(
            "-o", "--output", required=True, metavar="FILE", help="where to write it; `-` writes to stdout"
        )
        report.set_defaults(func=cmd_report, kind=kind)

    explain = sub.add_parser(
        "explain",
        help="the attribution ladder, step by step, for one sale",
        description="Why a sale was (or was not) attributed: each rung of the ladder, what it "
        "looked up and what it found.",
        epilog=examples(
            "tally explain --program prog_... --transaction in_1234",
            "tally explain --program prog_... --transaction in_1234 --json",
        ),
    )
    explain.add_argument("--program", required=True, help="program id (prog_...)")
    explain.add_argument("--transaction", required=True, help="the sale's transaction id")
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")
    explain.set_defaults(func=cmd_explain)

    demo = sub.add_parser(
        "demo",
        help="create a demo program and drive realistic traffic (operator)",
        description="Create a demo account and program and send it clicks, leads, sales and "
        "signed processor webhooks. Needs TALLY_OPERATOR_TOKEN and TALLY_STRIPE_WEBHOOK_SECRETS "
        "as the server has them.",
        epilog=examples("TALLY_OPERATOR_TOKEN=... TALLY_STRIPE_WEBHOOK_SECRETS=whsec_... tally demo"),
    )
    demo.add_argument("--url", help="the server's base URL (default: the login's, else TALLY_BASE_URL)")
    demo.add_argument("--state", default="data/demo.json", help="where the demo remembers what it made")
    demo.set_defaults(func=cmd_demo)
