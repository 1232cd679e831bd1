"""Operator commands over HTTP with TALLY_OPERATOR_TOKEN: `tally reconcile`, `tally unroutable`,
`tally demo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import click

from api.cli.client import call, operator_target, stream, streamed_result
from api.cli.demo import run_demo
from api.cli.options import examples, json_option, url_option
from api.cli.output import Listing, Progress, emit, show


@click.command(
    short_help="run the reconciler now (operator)",
    epilog=examples("TALLY_OPERATOR_TOKEN=... tally reconcile", "tally reconcile --json"),
)
@url_option(operator=True)
@json_option("the run's summary")
def reconcile(url: str | None, as_json: bool) -> None:
    """Run the reconciler on the server now, with a progress display on a terminal's stderr.
    Needs TALLY_OPERATOR_TOKEN."""
    target, token = operator_target(url)
    with Progress("reconcile") as progress:
        summary = streamed_result(
            stream("POST", "/api/v1/operator/reconcile", url=target, token=token), progress
        )
    if as_json:
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


@click.command(
    short_help="list the processor events routed to no program (operator)",
    epilog=examples("TALLY_OPERATOR_TOKEN=... tally unroutable", "tally unroutable --limit 20 --json"),
)
@url_option(operator=True)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="show at most this many (default: all)",
)
@json_option("the events (an array)")
def unroutable(url: str | None, limit: int, as_json: bool) -> None:
    """List the processor events no program could be routed to, newest first, with the reason
    (as of the last reconcile run). `awaiting_backfill`: a program has the account now, and its
    next `tally backfill --apply` covering the event's date picks it up. Needs
    TALLY_OPERATOR_TOKEN."""
    target, token = operator_target(url)
    events: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = {"limit": "500"} | ({"cursor": cursor} if cursor else {})
        page = call("GET", f"/api/v1/operator/unroutable?{urlencode(query)}", url=target, token=token)
        events += page["events"]
        cursor = page["next_cursor"]
        if cursor is None or (limit and len(events) >= limit):
            break
    if limit:
        events = events[:limit]
    if as_json:
        emit(events)
        return
    listing = Listing(
        ("received", "event", "type", "account", "reason", "routes to"),
        title=f"{len(events)} unroutable event(s), newest first (as of the last reconcile run)",
    )
    for e in events:
        listing.add(
            str(e["received_at"])[:19].replace("T", " "),
            e["event_id"] or "-",
            e["type"] or "-",
            e["account"] or "-",
            e["reason"],
            e["routes_to"] or "-",
        )
    show(listing)


@click.command(
    short_help="create a demo program and drive realistic traffic (operator)",
    epilog=examples("TALLY_OPERATOR_TOKEN=... TALLY_STRIPE_WEBHOOK_SECRETS=whsec_... tally demo"),
)
@url_option(operator=True)
@click.option(
    "--state",
    default="data/demo.json",
    show_default=True,
    metavar="FILE",
    help="where the demo remembers what it made",
)
def demo(url: str | None, state: str) -> None:
    """Create a demo account and program and send it clicks, leads, sales and signed processor
    webhooks. Needs TALLY_OPERATOR_TOKEN and TALLY_STRIPE_WEBHOOK_SECRETS as the server has
    them."""
    target, token = operator_target(url)
    run_demo(target, token, Path(state))
