"""CLI verbs for operations: reconcile, backfill, report, explain, demo (all over HTTP)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from api.cli_http import CliError, call, fetch_bytes, operator_target, stream

console = Console(stderr=True)


def _progress() -> Progress:
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
    with _progress() as bar:
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
    print(
        f"run {summary['run_id']}: {summary['events_read']} events read, {summary['sales']} sales, "
        f"{summary['commissions']} commission lines in {summary['duration_ms']} ms"
    )


def _money(minor: int | None, currency: str | None) -> str:
    return "-" if minor is None else f"{minor} {currency or ''}".strip()


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
        table.add_row(
            row["partner_code"], row["currency"], str(row["before"]), str(row["after"]), f"{row['delta']:+d}"
        )
    return table


def cmd_backfill(args: argparse.Namespace) -> None:
    body = {"from": args.start, "to": args.end, "dry_run": not args.apply}
    with console.status("re-running attribution over the range…"):
        data = call("POST", f"/api/v1/programs/{quote(args.program)}/backfill", body=body)
    out = Console()
    out.print(diff_table(data))
    out.print(partner_table(data))
    if args.apply:
        out.print(f"applied by {data['applied_by']} at {data['applied_at']} ({data['backfill_id']})")
    else:
        out.print("dry run: nothing changed. Re-run with --apply to apply it.")


def cmd_report(args: argparse.Namespace) -> None:
    query = urlencode({"period": args.period, "format": args.format})
    with console.status("building the report…"):
        content = fetch_bytes(f"/api/v1/programs/{quote(args.program)}/reports/{args.kind}?{query}")
    if args.output == "-":
        sys.stdout.buffer.write(content)
    else:
        Path(args.output).write_bytes(content)
        print(f"wrote {len(content)} bytes to {args.output}", file=sys.stderr)


def cmd_explain(args: argparse.Namespace) -> None:
    path = f"/api/v1/programs/{quote(args.program)}/sales/{quote(args.transaction, safe='')}/explain"
    data = call("GET", path)
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


def cmd_demo(args: argparse.Namespace) -> None:
    from api.demo import run_demo

    url, token = operator_target(args.url)
    run_demo(url, token, Path(args.state))


def add_operations(sub: Any) -> None:
    rec = sub.add_parser("reconcile", help="run the reconciler now (operator)")
    rec.add_argument("--url")
    rec.set_defaults(func=cmd_reconcile)

    back = sub.add_parser("backfill", help="re-run attribution over a date range (dry run unless --apply)")
    back.add_argument("--program", required=True)
    back.add_argument("--from", dest="start", required=True)
    back.add_argument("--to", dest="end", required=True)
    back.add_argument("--apply", action="store_true")
    back.set_defaults(func=cmd_backfill)

    report = sub.add_parser("report", help="download a report")
    report.add_argument("kind", choices=["finance", "double-counting"])
    report.add_argument("--program", required=True)
    report.add_argument("--period")
    report.add_argument("--format", default="json", choices=["json", "csv", "html", "xlsx"])
    report.add_argument("-o", "--output", required=True)
    report.set_defaults(func=cmd_report)

    explain = sub.add_parser("explain", help="the attribution ladder, step by step, for one sale")
    explain.add_argument("--program", required=True)
    explain.add_argument("--transaction", required=True)
    explain.set_defaults(func=cmd_explain)

    demo = sub.add_parser("demo", help="create a demo program and drive realistic traffic (operator)")
    demo.add_argument("--url")
    demo.add_argument("--state", default="data/demo.json", help="where the demo remembers what it made")
    demo.set_defaults(func=cmd_demo)
