"""The commission ledger: approved money is never rewritten; later changes are lines of their own.

A sale's commission is *approved* at `available_at` = occurred_at + holding_days. What its
`commission` line (in the sale's month) says is decided by the sale's state just before then:

- refunds count from their occurred_at; but a refund the log received (reconcile/refunds.py
  `known_at`) only after a payout batch that could take the sale's line (a batch of the program
  made at or after the sale's available_at, with a cut-off on or after the sale's day) counts
  from the later of its occurred_at and that receipt: what a batch may have paid is never
  changed by a refund reported afterwards, whatever date it gives;
- backfills (re-attribution through metadata fixes) count from their log time
  (reconcile/layers.py, which gives each sale's states between backfills).

The line is *frozen* from the moment it is approved: at available_at when the sale's state
then is commissionable, not a self-referral (`held`) and not fully refunded; otherwise at the
first later event after which its state is all of that (a backfill that attributes it, say),
and then its `available_at` is that event's time. From then on every later event of the sale,
in the order (effective time, backfills before refunds, backfill order, refund event id), is
booked as lines of its own, dated at the event (`dated_at` = `available_at` = its time, in the
month of that time), each the difference the event makes:

- a refund: a `clawback` line: minus the commission (and fee) it reverses, `refunded` its part;
- a backfill: `adjustment` lines: minus what the sale held for its partner before, plus what it
  holds for its partner after (one line when the partner stays; none when nothing changes).

`adjusts` is the sale's transaction id on those lines, `cause` the event's id (refund event or
backfill). A line never frozen (pending until available_at; held, reversed or not
commissionable ever since) follows the sale's final state in place, as the `commission` line of
its month.

Refunds of a sale count cumulatively in effective-time order, capped at the sale's gross
amount; a state's commission reversed is round_half_even(commission * refunded / gross), and
exactly the commission once the sale is fully refunded (reconcile/money.py `pro_rata`). Every
money column is the line's own contribution: over a sale's lines they add up to the sale's
final commission, fee and refunds (reconcile/schema.py COMMISSIONS_SCHEMA).

Status: `held` for a self-referral's line, else (commission lines) `reversed` once the sale is
fully refunded, else `approved` from available_at on and `pending` before; the job's status
refresh (reconcile/run/closure.py) relies on pending/approved depending on `now` alone.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from reconcile.money import pro_rata
from reconcile.schema import ENGINE, UTC, period_of

SALE = ["program_id", "sale_id"]
STATE_VALUES = ("partner_code", "commissionable", "gross_commission", "gross_fee", "self_referral")
MONEY = ("amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded")
# What a line carries from its sale.
SALE_INFO = ("transaction_id", "currency", "occurred_at", "period", "available_at", "gross_amount")


def _states(sales: pl.DataFrame, states: pl.DataFrame) -> pl.DataFrame:
    """Every state of every sale that is commissionable in one: program_id, sale_id, state,
    STATE_VALUES (sales without backfill states have one, state 0, their final values)."""
    plain = sales.join(states.select(SALE).unique(), on=SALE, how="anti").filter(pl.col("commissionable"))
    both = pl.concat(
        [
            plain.select(*SALE, *STATE_VALUES, state=pl.lit(0, pl.Int64)),
            states.select(*SALE, *STATE_VALUES, "state"),
        ],
        how="vertical_relaxed",
    )
    ever = both.group_by(SALE).agg(ever=pl.col("commissionable").any()).filter(pl.col("ever"))
    return both.join(ever.select(SALE), on=SALE, how="semi")


def _value(frame: pl.LazyFrame, table: pl.LazyFrame, state: str, refunded: str, prefix: str) -> pl.LazyFrame:
    """`frame` (SALE, gross_amount, `state`, `refunded`) with the values of that state after
    `refunded` was refunded, as `{prefix}partner_code`, `{prefix}commissionable`,
    `{prefix}self_referral` and `{prefix}` + MONEY."""
    looked = frame.join(
        table.select(*SALE, pl.col("state").alias(state), *STATE_VALUES),
        on=[*SALE, state],
        how="left",
    )
    c = pl.col(refunded)
    gross = pl.col("gross_amount")
    reversed_c = pro_rata(pl.col("gross_commission"), c, gross)
    reversed_f = pro_rata(pl.col("gross_fee"), c, gross)
    return looked.with_columns(
        **{
            f"{prefix}partner_code": pl.col("partner_code"),
            f"{prefix}commissionable": pl.col("commissionable").fill_null(False),
            f"{prefix}self_referral": pl.col("self_referral").fill_null(False),
            f"{prefix}amount": pl.col("gross_commission") - reversed_c,
            f"{prefix}reversed": reversed_c,
            f"{prefix}platform_fee": pl.col("gross_fee") - reversed_f,
            f"{prefix}platform_fee_reversed": reversed_f,
            f"{prefix}refunded": c,
        }
    ).drop(STATE_VALUES)


def _status(now: datetime, since: pl.Expr) -> pl.Expr:
    return pl.when(pl.lit(now, UTC) >= since).then(pl.lit("approved")).otherwise(pl.lit("pending"))


def _first_batch(info: pl.LazyFrame, batches: pl.DataFrame) -> pl.LazyFrame:
    """SALE and `first_batch_at`: when the first payout batch that could take the sale's line
    was made (at or after its available_at, cut-off after its occurred_at), if any."""
    return (
        info.select(*SALE, "available_at", "occurred_at")
        .join(batches.lazy().select("program_id", "created_at", "cutoff"), on="program_id")
        .filter((pl.col("created_at") >= pl.col("available_at")) & (pl.col("occurred_at") < pl.col("cutoff")))
        .group_by(SALE)
        .agg(first_batch_at=pl.col("created_at").min())
    )


def lines(
    sales: pl.DataFrame, states: pl.DataFrame, refunds: pl.DataFrame, batches: pl.DataFrame, now: datetime
) -> pl.DataFrame:
    """The ledger lines of `sales` (program_id, sale_id, SALE_INFO, STATE_VALUES: their final
    values), given their backfill `states` (reconcile/layers.py), counted `refunds`
    (program_id, sale_id, event_id, amount, occurred_at, known_at) and the payout `batches`
    (reconcile/payouts.py `batches`)."""
    # Most sales have no event (no refund, no backfill change): their line is their final state.
    eventful = pl.concat([refunds.select(SALE), states.select(SALE)]).unique()
    plain = _plain(sales.join(eventful, on=SALE, how="anti"), now)
    sales = sales.join(eventful, on=SALE, how="semi")
    table = _states(sales, states).lazy()
    info = sales.lazy().select(*SALE, *SALE_INFO).join(table.select(SALE).unique(), on=SALE, how="semi")
    reported_late = pl.col("known_at") >= pl.col("first_batch_at")
    layer_events = (
        states.lazy()
        .filter(pl.col("state") > 0)
        .select(
            *SALE, "at", rank=pl.lit(0, pl.Int8), state="state", amount=pl.lit(0, pl.Int64), cause="cause"
        )
    )
    refund_events = (
        refunds.lazy()
        .join(_first_batch(info, batches), on=SALE, how="left")
        .select(
            *SALE,
            at=pl.when(reported_late.fill_null(False))
            .then(pl.max_horizontal("occurred_at", "known_at"))
            .otherwise(pl.col("occurred_at")),
            rank=pl.lit(1, pl.Int8),
            state=pl.lit(None, pl.Int64),
            amount="amount",
            cause="event_id",
        )
    )
    events = (
        pl.concat([layer_events, refund_events], how="vertical_relaxed")
        .join(info.select(*SALE, "gross_amount", "available_at"), on=SALE)
        .sort(*SALE, "at", "rank", "state", "cause", nulls_last=True)
        .with_columns(
            state=pl.col("state").forward_fill().over(SALE).fill_null(0),
            refunded=pl.min_horizontal(pl.col("amount").cum_sum().over(SALE), pl.col("gross_amount")),
        )
        .with_columns(
            before_state=pl.col("state").shift(1).over(SALE).fill_null(0),
            before_refunded=pl.col("refunded").shift(1).over(SALE).fill_null(0),
        )
        .with_row_index("event")
        .collect(engine=ENGINE)
        .lazy()
    )
    events = _value(events, table, "state", "refunded", "n_")
    events = (
        events.with_columns(
            qualifies=_qualifies("n_", pl.col("refunded")), later=pl.col("at") >= pl.col("available_at")
        )
        .sort("event")
        .collect(engine=ENGINE)
        .lazy()
    )
    last = [pl.col("state").last(), pl.col("refunded").last()]
    at_approval = (
        events.filter(~pl.col("later"))
        .group_by(SALE, maintain_order=True)
        .agg(*last)
        .rename({"state": "approval_state", "refunded": "approval_refunded"})
    )
    first_approved = (
        events.filter(pl.col("later") & pl.col("qualifies"))
        .group_by(SALE, maintain_order=True)
        .agg(
            freeze_event=pl.col("event").first(),
            freeze_at=pl.col("at").first(),
            freeze_state=pl.col("state").first(),
            freeze_refunded=pl.col("refunded").first(),
        )
    )
    final = (
        events.group_by(SALE, maintain_order=True)
        .agg(*last)
        .rename({"state": "final_state", "refunded": "final_refunded"})
    )
    per_sale = (
        info.join(at_approval, on=SALE, how="left")
        .join(final, on=SALE, how="left")
        .with_columns(
            pl.col("approval_state", "approval_refunded", "final_state", "final_refunded").fill_null(0)
        )
        .join(first_approved, on=SALE, how="left")
    )
    per_sale = _value(per_sale, table, "approval_state", "approval_refunded", "a_")
    at_available = _qualifies("a_", pl.col("approval_refunded"))
    per_sale = per_sale.with_columns(
        frozen=at_available | pl.col("freeze_event").is_not_null(),
        # the first event after which the line is approved; none when approved at available_at
        freeze_event=pl.when(at_available).then(None).otherwise(pl.col("freeze_event")),
        approved_at=pl.when(at_available).then(pl.col("available_at")).otherwise(pl.col("freeze_at")),
        frozen_state=pl.when(at_available).then(pl.col("approval_state")).otherwise(pl.col("freeze_state")),
        frozen_refunded=pl.when(at_available)
        .then(pl.col("approval_refunded"))
        .otherwise(pl.col("freeze_refunded")),
    )
    per_sale = _value(per_sale, table, "frozen_state", "frozen_refunded", "z_")
    per_sale = _value(per_sale, table, "final_state", "final_refunded", "f_")
    per_sale = per_sale.collect(engine=ENGINE).lazy()

    def pick(name: str) -> pl.Expr:
        return pl.when(pl.col("frozen")).then(pl.col(f"z_{name}")).otherwise(pl.col(f"f_{name}")).alias(name)

    status = (
        pl.when(pl.col("frozen"))
        .then(_status(now, pl.col("approved_at")))
        .when(pl.col("f_self_referral"))
        .then(pl.lit("held"))
        .when(pl.col("final_refunded") >= pl.col("gross_amount"))
        .then(pl.lit("reversed"))
        .otherwise(_status(now, pl.col("available_at")))
    )
    commission = per_sale.filter(pl.col("frozen") | pl.col("f_commissionable")).select(
        *SALE,
        "transaction_id",
        pick("partner_code"),
        kind=pl.lit("commission"),
        cause=pl.lit(""),
        adjusts=pl.lit(None, pl.String),
        period="period",
        sale_period="period",
        currency="currency",
        **{name: pick(name) for name in MONEY},
        status=status,
        self_referral=pick("self_referral"),
        occurred_at="occurred_at",
        available_at=pl.when(pl.col("frozen")).then(pl.col("approved_at")).otherwise(pl.col("available_at")),
        dated_at="occurred_at",
    )
    return pl.concat(
        [plain, commission, _changes(events, per_sale, table, now)], how="vertical_relaxed"
    ).collect(engine=ENGINE)


def _plain(sales: pl.DataFrame, now: datetime) -> pl.LazyFrame:
    """The commission lines of commissioned sales without refunds or backfill changes: what the
    walk gives them (their only state, nothing refunded), without walking."""
    return (
        sales.lazy()
        .filter(pl.col("commissionable"))
        .select(
            *SALE,
            "transaction_id",
            "partner_code",
            kind=pl.lit("commission"),
            cause=pl.lit(""),
            adjusts=pl.lit(None, pl.String),
            period="period",
            sale_period="period",
            currency="currency",
            amount="gross_commission",
            reversed=pl.lit(0, pl.Int64),
            platform_fee="gross_fee",
            platform_fee_reversed=pl.lit(0, pl.Int64),
            refunded=pl.lit(0, pl.Int64),
            status=pl.when(pl.col("self_referral"))
            .then(pl.lit("held"))
            .otherwise(_status(now, pl.col("available_at"))),
            self_referral="self_referral",
            occurred_at="occurred_at",
            available_at="available_at",
            dated_at="occurred_at",
        )
    )


def _qualifies(prefix: str, refunded: pl.Expr) -> pl.Expr:
    """Whether a state (its values under `prefix`) is approved money once its time has come:
    commissionable, not a self-referral, not fully refunded."""
    return (
        pl.col(f"{prefix}commissionable")
        & ~pl.col(f"{prefix}self_referral")
        & (refunded < pl.col("gross_amount"))
    )


def _changes(
    events: pl.LazyFrame, per_sale: pl.LazyFrame, table: pl.LazyFrame, now: datetime
) -> pl.LazyFrame:
    """The clawback and adjustment lines of frozen sales: one per event and partner."""
    frozen = per_sale.filter(pl.col("frozen")).select(*SALE, *SALE_INFO[:4], "freeze_event")
    later = (
        events.filter(pl.col("later"))
        .join(frozen, on=SALE)
        .filter(pl.col("freeze_event").is_null() | (pl.col("event") > pl.col("freeze_event")))
    )
    later = _value(later, table, "before_state", "before_refunded", "b_")
    keep = ["event", *SALE, *SALE_INFO[:4], "at", "rank", "cause"]
    sides = pl.concat(
        [
            later.filter(pl.col("n_commissionable")).select(
                *keep,
                partner_code="n_partner_code",
                self_referral="n_self_referral",
                **{m: pl.col(f"n_{m}") for m in MONEY},
            ),
            later.filter(pl.col("b_commissionable")).select(
                *keep,
                partner_code="b_partner_code",
                self_referral="b_self_referral",
                **{m: -pl.col(f"b_{m}") for m in MONEY},
            ),
        ]
    )
    summed = (
        sides.group_by("event", "partner_code")
        .agg(
            *(pl.col(c).first() for c in keep if c != "event"),
            pl.col("self_referral").first(),
            *(pl.col(m).sum() for m in MONEY),
        )
        .filter(pl.any_horizontal(pl.col(m) != 0 for m in MONEY))
    )
    return summed.select(
        *SALE,
        "transaction_id",
        "partner_code",
        kind=pl.when(pl.col("rank") == 1).then(pl.lit("clawback")).otherwise(pl.lit("adjustment")),
        cause="cause",
        adjusts="transaction_id",
        period=period_of(pl.col("at")),
        sale_period="period",
        currency="currency",
        **{m: m for m in MONEY},
        status=pl.when(pl.col("self_referral")).then(pl.lit("held")).otherwise(_status(now, pl.col("at"))),
        self_referral="self_referral",
        occurred_at="occurred_at",
        available_at="at",
        dated_at="at",
    )
