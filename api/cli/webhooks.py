"""`tally webhooks list|create|update|delete|rotate|ping|deliveries|resend`: a program's webhook
endpoints and their deliveries (CONTRACT section 13), over HTTP with a workspace owner's account
credential. The signing secret is printed once, by `create` and `rotate`."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import click

from api.cli.books import program_path
from api.cli.client import call, call_status
from api.cli.options import examples, json_option, program_option
from api.cli.output import Listing, emit, show
from ingest.webhooks_out.events import EVENT_TYPES

STATUSES = ("pending", "succeeded", "failed")


def _path(program: str, suffix: str = "") -> str:
    return program_path(program, f"/webhook-endpoints{suffix}")


def _one(program: str, endpoint: str, suffix: str = "") -> str:
    return _path(program, f"/{quote(endpoint, safe='')}{suffix}")


def _endpoint_listing(found: list[dict[str, Any]], title: str) -> Listing:
    listing = Listing(("endpoint", "url", "events", "enabled", "secret", "disabled because"), title=title)
    for e in found:
        listing.add(
            e["endpoint_id"],
            e["url"],
            ",".join(e["events"]),
            "yes" if e["enabled"] else "no",
            e["secret_masked"],
            e["disabled_reason"] or "",
        )
    return listing


def _delivery_listing(found: list[dict[str, Any]], title: str) -> Listing:
    listing = Listing(
        ("delivery", "event", "type", "status", "answer", "ms", "attempts", "next attempt", "error"),
        title=title,
        no_wrap=("delivery",),
    )
    for d in found:
        listing.add(
            d["delivery_id"],
            d["event_id"],
            d["type"],
            d["status"],
            d["response_status"] if d["response_status"] is not None else "-",
            d["duration_ms"] if d["duration_ms"] is not None else "-",
            d["attempt"],
            d["next_attempt_at"] or "-",
            d["error"] or "",
        )
    return listing


def _events(values: tuple[str, ...]) -> list[str]:
    """`--event a --event b` or `--event a,b`, as one list."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


EVENT_HELP = "an event type to send (repeat, or comma-separated): " + ", ".join(EVENT_TYPES)


@click.group(
    short_help="webhooks to your servers: endpoints, deliveries, pings (owner)",
    epilog=examples(
        "tally webhooks create --program prog_... --url https://brand.example/hooks --event sale.created",
        "tally webhooks deliveries --program prog_... --endpoint we_... --status failed",
    ),
)
def webhooks() -> None:
    """tally sends the events an endpoint takes to its URL as signed POSTs (Standard Webhooks),
    retried for 3 days. Needs a workspace owner's login."""


@webhooks.command(
    "list", short_help="the program's endpoints", epilog=examples("tally webhooks list --program prog_...")
)
@program_option
@json_option("the endpoints (an array)")
def webhooks_list(program: str, as_json: bool) -> None:
    """One row per endpoint: id, URL, event types, enabled, the masked secret, and why tally
    disabled it (5 days of failed deliveries), if it did."""
    found = call("GET", _path(program))
    if as_json:
        emit(found)
        return
    show(_endpoint_listing(found, f"webhook endpoints of {program}"))


@webhooks.command(
    "create",
    short_help="add an endpoint; prints its signing secret once",
    epilog=examples(
        "tally webhooks create --program prog_... --url https://brand.example/hooks"
        " --event sale.created --event commission.approved"
    ),
)
@program_option
@click.option("--url", required=True, metavar="URL", help="where deliveries go (https://, a public address)")
@click.option("--event", "events", multiple=True, required=True, metavar="TYPE", help=EVENT_HELP)
@click.option("--description", default=None, metavar="TEXT", help="what the endpoint is for")
@json_option("the endpoint, with its secret")
def webhooks_create(
    program: str, url: str, events: tuple[str, ...], description: str | None, as_json: bool
) -> None:
    """Add an endpoint. Its signing secret (`whsec_...`) is printed this once: put it in your
    receiver's configuration."""
    body: dict[str, Any] = {"url": url, "events": _events(events)}
    if description is not None:
        body["description"] = description
    made = call("POST", _path(program), body=body)
    if as_json:
        emit(made)
        return
    show(_endpoint_listing([made], f"endpoint {made['endpoint_id']}"))
    print(f"signing secret (shown once): {made['secret']}")


@webhooks.command(
    "update",
    short_help="change an endpoint's url, events or enabled",
    epilog=examples(
        "tally webhooks update --program prog_... --endpoint we_... --disable",
        "tally webhooks update --program prog_... --endpoint we_... --event sale.created,payout.paid",
    ),
)
@program_option
@click.option("--endpoint", required=True, metavar="ENDPOINT", help="endpoint id (we_...)")
@click.option("--url", default=None, metavar="URL", help="a new URL")
@click.option("--event", "events", multiple=True, metavar="TYPE", help="the event types it takes from now on")
@click.option("--enable/--disable", "enabled", default=None, help="start or stop sending to it")
@click.option("--description", default=None, metavar="TEXT", help="a new description")
@json_option("the endpoint")
def webhooks_update(
    program: str,
    endpoint: str,
    url: str | None,
    events: tuple[str, ...],
    enabled: bool | None,
    description: str | None,
    as_json: bool,
) -> None:
    """Change what is given. Enabling an endpoint tally disabled clears the reason; what waited
    for it is sent."""
    body: dict[str, Any] = {}
    if url is not None:
        body["url"] = url
    if events:
        body["events"] = _events(events)
    if enabled is not None:
        body["enabled"] = enabled
    if description is not None:
        body["description"] = description
    if not body:
        raise click.UsageError("nothing to change: give --url, --event, --enable/--disable or --description")
    found = call("PATCH", _one(program, endpoint), body=body)
    if as_json:
        emit(found)
        return
    show(_endpoint_listing([found], f"endpoint {found['endpoint_id']}"))


@webhooks.command(
    "delete",
    short_help="delete an endpoint",
    epilog=examples("tally webhooks delete --program prog_... --endpoint we_..."),
)
@program_option
@click.option("--endpoint", required=True, metavar="ENDPOINT", help="endpoint id (we_...)")
@json_option("what was deleted")
def webhooks_delete(program: str, endpoint: str, as_json: bool) -> None:
    """Delete an endpoint and its deliveries: nothing more is sent to it."""
    found = call("DELETE", _one(program, endpoint))
    if as_json:
        emit(found)
        return
    print(f"endpoint {found['endpoint_id']} deleted")


@webhooks.command(
    "rotate",
    short_help="a new signing secret (the old one signs too for 24 h)",
    epilog=examples("tally webhooks rotate --program prog_... --endpoint we_..."),
)
@program_option
@click.option("--endpoint", required=True, metavar="ENDPOINT", help="endpoint id (we_...)")
@json_option("the endpoint, with its new secret")
def webhooks_rotate(program: str, endpoint: str, as_json: bool) -> None:
    """Rotate the signing secret: printed once; for 24 hours deliveries carry a signature by the
    old secret and one by the new, so the receiver can switch without losing one."""
    found = call("POST", _one(program, endpoint, "/rotate-secret"))
    if as_json:
        emit(found)
        return
    print(f"new signing secret (shown once): {found['secret']}")
    print(f"the previous secret signs too until {found['previous_secret_expires_at']}")


@webhooks.command(
    "ping",
    short_help="send a test ping event",
    epilog=examples("tally webhooks ping --program prog_... --endpoint we_..."),
)
@program_option
@click.option("--endpoint", required=True, metavar="ENDPOINT", help="endpoint id (we_...)")
@json_option("the queued delivery")
def webhooks_ping(program: str, endpoint: str, as_json: bool) -> None:
    """Queue a `ping` event for this endpoint, due at once; `tally webhooks deliveries` shows how
    it went."""
    found = call("POST", _one(program, endpoint, "/ping"))
    if as_json:
        emit(found)
        return
    print(f"ping queued: delivery {found['delivery_id']} (event {found['event_id']})")


@webhooks.command(
    "deliveries",
    short_help="an endpoint's deliveries, newest first",
    epilog=examples(
        "tally webhooks deliveries --program prog_... --endpoint we_...",
        "tally webhooks deliveries --program prog_... --endpoint we_... --status failed --json",
    ),
)
@program_option
@click.option("--endpoint", required=True, metavar="ENDPOINT", help="endpoint id (we_...)")
@click.option("--status", type=click.Choice(STATUSES), default=None, help="only deliveries of this status")
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=100, show_default=True, help="at most this many"
)
@json_option("the deliveries with every attempt (an array)")
def webhooks_deliveries(program: str, endpoint: str, status: str | None, limit: int, as_json: bool) -> None:
    """One row per delivery: its event, status, the last answer and how long it took, the
    attempts made and when the next is due."""
    query = {"limit": str(limit), **({"status": status} if status else {})}
    found = call("GET", _one(program, endpoint, f"/deliveries?{urlencode(query)}"))
    if as_json:
        emit(found)
        return
    show(_delivery_listing(found, f"deliveries to {endpoint}"))


@webhooks.command(
    "resend",
    short_help="send a delivery again now",
    epilog=examples("tally webhooks resend --program prog_... --endpoint we_... --delivery whd_..."),
)
@program_option
@click.option("--endpoint", required=True, metavar="ENDPOINT", help="endpoint id (we_...)")
@click.option("--delivery", required=True, metavar="DELIVERY", help="delivery id (whd_...)")
@json_option("the delivery")
def webhooks_resend(program: str, endpoint: str, delivery: str, as_json: bool) -> None:
    """Send a delivery again, due at once (the same event and `webhook-id`), with a new 3-day
    retry window."""
    status, found = call_status(
        "POST", _one(program, endpoint, f"/deliveries/{quote(delivery, safe='')}/resend")
    )
    if as_json:
        emit(found)
        return
    print(f"delivery {found['delivery_id']} queued again ({status})")
