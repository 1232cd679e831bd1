"""`tally programs create|list` and `tally keys regenerate`: a workspace's programs, over HTTP
with the account credential.

Settings are given as people think of them and sent as the API takes them (CONTRACT section 6):
rates in percent (`--commission-percent 12.5` -> `commission_bps` 1250), the flat commission and
the payout minimum as amounts per currency (CONTRACT 15, options.py `PerCurrency`): minor units in
every currency (`--commission-flat 500` -> 500), minor units by currency (`usd=5000,jpy=500` ->
{"usd": 5000, "jpy": 500}), or money in one currency (`"12.50 usd"` -> {"usd": 1250}, `"1.250 kwd"`
-> {"kwd": 1250}: the currency's decimals, reports/money.py), days and months as whole numbers
(`--recurring-months lifetime` is null). Bounds are the server's (422 naming the field)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import click
from click.core import ParameterSource

from api.cli.client import call
from api.cli.errors import CliError
from api.cli.options import MONTHS, PER_CURRENCY, PERCENT, WHOLE, F, examples, json_option, program_option
from api.cli.output import Listing, emit, show

# option name -> the API's setting (CONTRACT section 6)
SETTINGS = {
    "commission_type": "commission_type",
    "commission_percent": "commission_bps",
    "commission_flat": "commission_flat",
    "platform_fee_percent": "platform_fee_bps",
    "holding_days": "holding_days",
    "recurring_months": "recurring_months",
    "requires_server_side_leads": "requires_server_side_leads",
    "stripe_account": "stripe_account_id",
    "payout_minimum": "payout_minimum",
    "website": "website_url",
}

SETTING_OPTIONS: list[Callable[[F], F]] = [
    click.option(
        "--commission-type",
        type=click.Choice(("percent", "flat")),
        help="how the commission is reckoned (default: flat when only --commission-flat is given, "
        "else percent)",
    ),
    click.option(
        "--commission-percent",
        type=PERCENT,
        metavar="PERCENT",
        help="commission in percent of the sale net of tax, at most two decimals (12.5 = 12.5 %; default 30)",
    ),
    click.option(
        "--commission-flat",
        type=PER_CURRENCY,
        metavar="AMOUNTS",
        help="flat commission per sale, in the sale's currency: minor units in every currency (500), by "
        'currency (usd=500,jpy=500: a sale in another currency earns nothing), or "12.50 usd" (that '
        "currency only, in its decimals)",
    ),
    click.option(
        "--platform-fee-percent",
        type=PERCENT,
        metavar="PERCENT",
        help="platform fee in percent of the sale net of tax (default 0)",
    ),
    click.option(
        "--holding-days",
        type=WHOLE,
        metavar="DAYS",
        help="days a commission is pending before it is approved (default 30)",
    ),
    click.option(
        "--recurring-months",
        type=MONTHS,
        metavar="N|lifetime",
        help="months of a referred customer's payments that earn: 0 = the first sale only, N = sales "
        "before the first + N calendar months, lifetime = every one (default lifetime)",
    ),
    click.option(
        "--requires-server-side-leads",
        is_flag=True,
        default=None,
        help="browser leads stay provisional until a server-mode lead settles them",
    ),
    click.option(
        "--stripe-account",
        metavar="ACCOUNT",
        help="the payment processor's connected account id (acct_...) whose events are this program's",
    ),
    click.option(
        "--payout-minimum",
        type=PER_CURRENCY,
        metavar="AMOUNTS",
        help="a partner's balance below this waits for a later payout batch: minor units in every currency "
        '(5000), by currency (usd=5000,jpy=5000: none in another), or "50.00 usd" (default 0)',
    ),
    click.option(
        "--website",
        metavar="URL",
        help="the brand's site, where partners' referral links point (https://...)",
    ),
]


def setting_options(f: F) -> F:
    """The program settings as options (each left out keeps the server's default)."""
    for option in reversed(SETTING_OPTIONS):
        f = option(f)
    return f


def settings_body(ctx: click.Context) -> dict[str, Any]:
    """The settings given on the command line, as the API's fields."""
    body = {
        api: ctx.params[name]
        for name, api in SETTINGS.items()
        if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
    }
    if "commission_type" not in body and "commission_flat" in body:
        if "commission_bps" in body:
            raise CliError(
                "both --commission-percent and --commission-flat: say which applies with --commission-type"
            )
        body["commission_type"] = "flat"
    return body


def programs_listing(programs: list[dict[str, Any]]) -> Listing:
    """One row per program: id, workspace, masked key, name (tab-separated in a pipe)."""
    listing = Listing(("program", "workspace", "key", "name"), title="programs", no_wrap=("program",))
    for p in programs:
        listing.add(p["program_id"], p["workspace_id"], p["api_token_masked"] or "-", p["name"])
    return listing


@click.group(
    short_help="create or list programs",
    epilog=examples(
        "tally programs list", 'tally programs create --workspace ws_... --name "Brand partners"'
    ),
)
def programs() -> None:
    """Create or list the programs of your workspaces."""


@programs.command(
    "create",
    short_help="create a program in a workspace",
    epilog=examples(
        'tally programs create --workspace ws_... --name "Brand partners"',
        'tally programs create --workspace ws_... --name "Brand partners" --commission-percent 12.5 '
        "--holding-days 14 --recurring-months 12 --platform-fee-percent 2",
        'tally programs create --workspace ws_... --name "Flat" --commission-flat usd=1250,jpy=1250 --json',
    ),
)
@click.option("--workspace", required=True, metavar="WS", help="workspace id (ws_...) the program belongs to")
@click.option("--name", required=True, help="the program's name")
@setting_options
@json_option("the program")
@click.pass_context
def programs_create(ctx: click.Context, /, workspace: str, name: str, as_json: bool, **_: Any) -> None:
    """Create a program; it prints a row like `programs list` does. Its API key is made with it
    but shown only by `tally keys regenerate`. Every setting can be given here, and should be:
    they are the program's first terms, valuing every sale however early it is dated (a later
    change of terms applies only to sales from then on). A setting not given keeps its default
    (30 %, 30 holding days)."""
    # Every setting goes in the create call itself: they are the program's first terms (a later
    # PATCH would be a change of terms, and sales dated before it would keep the defaults).
    program = call(
        "POST", "/api/v1/programs", body={"workspace_id": workspace, "name": name, **settings_body(ctx)}
    )
    if as_json:
        emit(program)
        return
    show(programs_listing([program]))
    print(
        f"next: `tally keys regenerate --program {program['program_id']}` makes its API key (shown once)",
        file=sys.stderr,
    )


@programs.command(
    "list",
    short_help="list the programs you can see",
    epilog=examples("tally programs list", "tally programs list --json"),
)
@json_option("the programs (an array)")
def programs_list(as_json: bool) -> None:
    """One row per program: id, workspace, masked key, name."""
    found = call("GET", "/api/v1/programs")
    if as_json:
        emit(found)
        return
    show(programs_listing(found))


@click.group(
    short_help="program API keys (owner)", epilog=examples("tally keys regenerate --program prog_...")
)
def keys() -> None:
    """Program API keys (workspace owners)."""


@keys.command(
    "regenerate",
    short_help="make a new API key (the old one stops working); shown once",
    epilog=examples("tally keys regenerate --program prog_... > service-api-key"),
)
@program_option
@json_option("the new key with its masked form and time")
def keys_regenerate(program: str, as_json: bool) -> None:
    """Generate or regenerate a program's API key. The key is printed once on stdout; the
    previous key stops working at once."""
    data = call("POST", f"/api/v1/programs/{quote(program, safe='')}/api-key")
    if as_json:
        emit(data)
    else:
        print(data["api_key"])
    print(
        "this is the only time the key is shown; store it server-side (SERVICE_API_KEY). "
        "The previous key no longer works.",
        file=sys.stderr,
    )
