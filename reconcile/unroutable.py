"""Unroutable processor events: why each is unroutable, and which ones a backfill picks up. Pure.

Ingest routes a delivery when it arrives (ingest/deliveries.py `route`): its Connect `account`
selects the programs whose `stripe_account_id` it is, and when several share the account,
`metadata.program_id` must name one of them; an event without an account is routed by
`metadata.program_id` alone. A delivery routed nowhere is stored with program NULL and outcome
`unroutable` (never dropped), and each such event is listed once (table `rc_unroutable`), with
the reason it cannot be routed *as the programs are now*, so the list says what to do:

- `account_not_connected`: no program has the event's account (set it on the program:
  `PATCH /api/v1/programs/{id}` with `stripe_account_id`).
- `account_shared`: several programs share the account, and `metadata.program_id` is missing or
  names none of them.
- `no_account`: the event names no account, and `metadata.program_id` is missing or names no
  program.
- `awaiting_backfill`: a program has the account now (`routes_to` names it, by the same rule as
  ingest): its next applied backfill whose range covers the event's date picks it up.

Picking up (`pickup`): applying a backfill of program P appends, for each unroutable event not
picked up before that routes to P now and whose business date (`occurred_at`, UTC; the receive
time when it has none) lies in the backfill's range, a copy of the event routed to P (source
`backfill`, outcome `accepted`, the original body; ingest/actions.py). The log stays
append-only and the ledger a function of it: from then on the event is P's like any delivery
(a sale, a refund...), and it leaves the unroutable list (`listing` leaves out every event id
with a picked-up copy).
"""

from __future__ import annotations

from datetime import date

import polars as pl

from reconcile.schema import ENGINE, STR, UNROUTABLE_SCHEMA, UTC, conform

REASONS = ("account_not_connected", "account_shared", "no_account", "awaiting_backfill")


def picked_up() -> pl.Expr:
    """Rows that are a backfill's copy of an unroutable event, routed to a program."""
    return (
        (pl.col("kind") == "stripe")
        & (pl.col("source") == "backfill")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
    )


def _stray() -> pl.Expr:
    return (pl.col("kind") == "stripe") & (pl.col("outcome") == "unroutable") & pl.col("program_id").is_null()


def routes(events: pl.LazyFrame, programs: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """`events` (with `stripe_account`, `meta_program_id`) plus `routes_to` (the program that
    routing would pick now, or null) and `reason` (REASONS), row for row."""
    connected = (
        programs.lazy()
        .select("program_id", account=pl.col("stripe_account_id").cast(STR))
        .filter(pl.col("account").is_not_null())
    )
    by_account = connected.group_by("account").agg(
        sharing=pl.len().cast(pl.Int64), only=pl.col("program_id").min()
    )
    named = connected.select("account", meta_program_id=pl.col("program_id"), meta_connected=pl.lit(True))
    known = programs.lazy().select(meta_program_id=pl.col("program_id"), meta_known=pl.lit(True)).unique()
    looked = (
        events.with_row_index("__row")
        .join(by_account, left_on="stripe_account", right_on="account", how="left")
        .join(
            named,
            left_on=["stripe_account", "meta_program_id"],
            right_on=["account", "meta_program_id"],
            how="left",
        )
        .join(known, on="meta_program_id", how="left")
        .sort("__row")
    )
    account = pl.col("stripe_account").is_not_null()
    sharing = pl.col("sharing").fill_null(0)
    routes_to = (
        pl.when(account & (sharing == 1))
        .then(pl.col("only"))
        .when(account & pl.col("meta_connected").fill_null(False))
        .then(pl.col("meta_program_id"))
        .when(~account & pl.col("meta_known").fill_null(False))
        .then(pl.col("meta_program_id"))
    )
    reason = (
        pl.when(pl.col("routes_to").is_not_null())
        .then(pl.lit("awaiting_backfill"))
        .when(~account)
        .then(pl.lit("no_account"))
        .when(sharing == 0)
        .then(pl.lit("account_not_connected"))
        .otherwise(pl.lit("account_shared"))
    )
    return (
        looked.with_columns(routes_to=routes_to)
        .with_columns(reason=reason)
        .drop("__row", "sharing", "only", "meta_connected", "meta_known")
    )


def listing(raw: pl.LazyFrame, programs: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """The rc_unroutable rows of the log `raw` (prepared): each unroutable event id once (its
    first record by business time, its first receive time), without the events a backfill
    picked up, with `routes_to` and `reason` as the programs are now."""
    taken = raw.filter(picked_up() & pl.col("event_id").is_not_null()).select("event_id").unique()
    events = (
        raw.filter(_stray())
        .join(taken, on="event_id", how="anti")
        .sort("occurred_at", "event_id", "seq", nulls_last=True)
        .group_by("event_id")
        .agg(
            pl.col("event_type").first(),
            pl.col("object_id").first(),
            pl.col("stripe_account").first(),
            pl.col("meta_program_id").first(),
            pl.col("livemode").first(),
            pl.col("test_mode").first(),
            pl.col("amount").first(),
            pl.col("currency").first(),
            pl.col("occurred_at").first(),
            pl.col("received_at").min(),
        )
    )
    return conform(routes(events, programs), UNROUTABLE_SCHEMA).collect(engine=ENGINE)


def _day(column: str) -> pl.Expr:
    return pl.col(column).cast(UTC).dt.date()


def pickup(
    stray: pl.DataFrame,
    programs: pl.DataFrame | pl.LazyFrame,
    program_id: str,
    start: date | None,
    end: date | None,
) -> pl.DataFrame:
    """The rows of `stray` (unroutable events not picked up yet, any columns besides those
    `routes` reads and `occurred_at`/`received_at`/`seq`) that a backfill of `program_id` over
    [start, end] (dates, inclusive, None = open) picks up: each event id's first row, by seq
    (an event without an id is never picked up: nothing could tell its copy apart)."""
    if stray.is_empty():
        return stray
    day = pl.coalesce(_day("occurred_at"), _day("received_at"))
    within = pl.lit(True)
    if start is not None:
        within = within & (day >= start)
    if end is not None:
        within = within & (day <= end)
    first = (
        stray.filter(pl.col("event_id").is_not_null())
        .sort("seq")
        .filter(pl.col("event_id").is_first_distinct())
    )
    routed = routes(first.lazy(), programs).collect(engine=ENGINE)
    return routed.filter((pl.col("routes_to") == program_id) & within).drop("routes_to", "reason")
