"""Finance's acts over HTTP with a workspace owner's account credential: `tally periods close`,
`tally fixes add`, `tally commissions hold|release|void`."""

from __future__ import annotations

from urllib.parse import quote

import click

from api.cli.books import lines_listing, program_path
from api.cli.client import call
from api.cli.options import examples, json_option, program_option
from api.cli.output import Listing, emit, show


# -- periods -------------------------------------------------------------------------------------
@click.group(
    short_help="close a month (owner)",
    epilog=examples("tally periods close --program prog_... --period 2026-01"),
)
def periods() -> None:
    """Periods of a program's books. Needs a workspace owner's login."""


@periods.command(
    "close",
    short_help="close a month: its figures never change again",
    epilog=examples(
        "tally periods close --program prog_... --period 2026-01",
        "tally periods close --program prog_... --period 2026-01 --json",
    ),
)
@program_option
@click.option("--period", required=True, metavar="YYYY-MM", help="the month to close (one that has begun)")
@json_option("the close")
def periods_close(program: str, period: str, as_json: bool) -> None:
    """Close a month of a program's books (POST .../periods/{YYYY-MM}/close). Its figures never
    change again; later corrections to it appear as adjustment lines in the first open month.
    Closing it again changes nothing."""
    data = call("POST", program_path(program, f"/periods/{quote(period, safe='')}/close"))
    if as_json:
        emit(data)
        return
    print(
        f"{data['period']} closed at {data['closed_at']} by {data['closed_by']} ({data['close_id']}); "
        f"books recomputed by reconcile run {data['reconcile_run_id']}. Later corrections to it "
        "become adjustment lines in the first open month."
    )


# -- metadata fixes --------------------------------------------------------------------------------
FIX_FIELDS = ("subscription_id", "transaction_id", "svc_customer_key", "svc_click_id")


@click.group(
    short_help="record metadata fixes for a later backfill (owner)",
    epilog=examples("tally fixes add --program prog_... --transaction-id in_123 --svc-click-id clk_..."),
)
def fixes() -> None:
    """Metadata fixes: appended to the raw log, never edited into it. Needs a workspace owner's
    login."""


@fixes.command(
    "add",
    short_help="record a metadata fix (a sale's or subscription's customer key or click id)",
    epilog=examples(
        "tally fixes add --program prog_... --transaction-id in_123 --svc-click-id clk_...",
        "tally fixes add --program prog_... --subscription-id sub_1 --svc-customer-key cust_42 --json",
    ),
)
@program_option
@click.option("--subscription-id", metavar="ID", help="fix every sale of this subscription")
@click.option("--transaction-id", metavar="ID", help="fix this sale (its transaction id)")
@click.option("--svc-customer-key", metavar="KEY", help="the customer key (svc_customer_key) to use")
@click.option("--svc-click-id", metavar="CLICK", help="the click id (svc_click_id) to use")
@json_option("the recorded fix")
def fixes_add(
    program: str,
    subscription_id: str | None,
    transaction_id: str | None,
    svc_customer_key: str | None,
    svc_click_id: str | None,
    as_json: bool,
) -> None:
    """Record one metadata fix (POST .../metadata-fixes): for one subscription or one
    transaction (exactly one of --subscription-id and --transaction-id), the svc_customer_key
    and/or svc_click_id to use. It takes effect when a backfill covering its sales is applied
    (`tally backfill --apply`); the backfill's dry run previews it."""
    if (subscription_id is None) == (transaction_id is None):
        raise click.UsageError("give one of --subscription-id and --transaction-id")
    given = {
        "subscription_id": subscription_id,
        "transaction_id": transaction_id,
        "svc_customer_key": svc_customer_key,
        "svc_click_id": svc_click_id,
    }
    fix = {name: value for name, value in given.items() if value is not None}
    data = call("POST", program_path(program, "/metadata-fixes"), body={"fixes": [fix]})
    if as_json:
        emit(data)
        return
    listing = Listing(("fix", *FIX_FIELDS), title="recorded fixes")
    for recorded in data["fixes"]:
        listing.add(recorded["fix_id"], *(recorded.get(name) or "-" for name in FIX_FIELDS))
    show(listing)
    print(
        "it takes effect when a backfill covering its sales is applied: "
        "`tally backfill --program ... --from D --to D` previews it, `--apply` applies it"
    )


# -- finance actions on a sale's commission lines ------------------------------------------------
@click.group(
    short_help="hold, release or void a sale's commission lines (owner)",
    epilog=examples("tally commissions hold --program prog_... --transaction tx_1 --reason 'dispute'"),
)
def commissions() -> None:
    """Finance actions on a sale's unpaid commission lines, appended to the raw log with who and
    why. Needs a workspace owner's login."""


ACTIONS = {
    "hold": "hold the sale's unpaid lines: never approved or batched until released",
    "release": "release a held sale: pending, then approved once its holding days have passed",
    "void": "void the sale's unpaid lines: never payable, their platform fee void too",
}


def _action_command(action: str, summary: str) -> click.Command:
    @click.command(
        action,
        short_help=summary,
        epilog=examples(f"tally commissions {action} --program prog_... --transaction tx_1 --reason why"),
    )
    @program_option
    @click.option("--transaction", required=True, metavar="ID", help="the sale's transaction id")
    @click.option("--reason", required=True, help="why (kept in the log, shown in explain)")
    @json_option("the sale's lines")
    def command(program: str, transaction: str, reason: str, as_json: bool) -> None:
        path = program_path(program, f"/commissions/{quote(transaction, safe='')}/{action}")
        data = call("POST", path, body={"reason": reason})
        if as_json:
            emit(data)
            return
        show(lines_listing(data["lines"], title=f"the lines of {transaction}"))

    command.help = (
        f"{summary[0].upper()}{summary[1:]} (POST .../commissions/{{transaction_id}}/{action}). A sale "
        "with a line in an open payout batch cannot be held or voided (line_in_batch, naming the batch: "
        "`tally payouts cancel` it first), nor one with a line in a paid batch (line_paid)."
    )
    return command


for _action, _summary in ACTIONS.items():
    commissions.add_command(_action_command(_action, _summary))
