"""Payout batches: which ledger lines each batch pays, decided from the log alone. Pure.

A `payout_batch` row of a program (body `{"up_to": "YYYY-MM-DD", "by": who, "payout_minimum"}`, appended by
ingest/engineering.py) takes every line of the program that is payable at the batch's log time
T (its `received_at`) and that no earlier batch (lower `seq`) took:

- not held (a self-referral is never paid) and with a non-zero amount;
- approved by T: `available_at` <= T (a commission line from the end of its holding period, a
  clawback or adjustment from the change it books);
- dated on or before `up_to`: `dated_at` before the next day (UTC).

Lines of every kind count, so a clawback or a negative adjustment is netted with the partner's
other lines of the batch. Netting per partner and currency, and carrying a negative net, or one below
the program's payout minimum as the batch recorded it, to the partner's next batch (never a
payment below zero or below the minimum), happen when a batch is read (reports/payouts.py):
membership is decided line by line, so the ledger of a customer depends on
that customer's rows and the engineer actions only (what incremental runs rely on).

A `payout_paid` row (body `{"payout_id", "by"}`) after its batch marks the batch paid (the first
one counts): its lines become `paid`. Approved lines are never rewritten (reconcile/ledger.py),
so what a batch took keeps the amounts it had when the batch was made; a refund after payment
is a clawback line that the next batch nets. Batch ids are the rows' event ids.
"""

from __future__ import annotations

import polars as pl

from reconcile import bookings
from reconcile.schema import ENGINE, PAYOUTS_SCHEMA, UTC

BATCH = "payout_batch"
PAID = "payout_paid"
KINDS = (BATCH, PAID)


def _actions(log: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    return log.filter(
        (pl.col("kind") == kind)
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_id").is_not_null()
    )


def batches(log: pl.LazyFrame) -> pl.DataFrame:
    """program_id, payout_id, seq, up_to, cutoff (the instant after the up_to day, null when the
    body has no valid date), created_at, created_by, payout_minimum (0 when the body names none,
    as batches made before the setting existed); in seq order."""
    day = pl.col("body").str.json_path_match("$.up_to").str.slice(0, 10)
    parsed = day.str.to_date("%Y-%m-%d", strict=False)
    return (
        _actions(log, BATCH)
        .select(
            "program_id",
            payout_id="event_id",
            seq="seq",
            up_to=pl.when(parsed.is_not_null()).then(day),
            cutoff=parsed.cast(pl.Datetime("us")).dt.replace_time_zone("UTC") + pl.duration(days=1),
            created_at="received_at",
            created_by=pl.col("body").str.json_path_match("$.by"),
            payout_minimum=pl.col("body")
            .str.json_path_match("$.payout_minimum")
            .cast(pl.Int64, strict=False)
            .fill_null(0)
            .clip(lower_bound=0),
        )
        .sort("seq")
        .unique(subset=["program_id", "payout_id"], keep="first", maintain_order=True)
        .collect(engine=ENGINE)
    )


def paid(log: pl.LazyFrame, made: pl.DataFrame) -> pl.DataFrame:
    """program_id, payout_id, paid_at, paid_by: the first `payout_paid` row after each batch."""
    marks = _actions(log, PAID).select(
        "program_id",
        payout_id=pl.col("body").str.json_path_match("$.payout_id"),
        paid_seq="seq",
        paid_at="received_at",
        paid_by=pl.col("body").str.json_path_match("$.by"),
    )
    return (
        marks.join(made.lazy().select("program_id", "payout_id", "seq"), on=["program_id", "payout_id"])
        .filter(pl.col("paid_seq") > pl.col("seq"))
        .sort("paid_seq")
        .group_by("program_id", "payout_id", maintain_order=True)
        .agg(pl.col("paid_at").first(), pl.col("paid_by").first())
        .collect(engine=ENGINE)
    )


def table(made: pl.DataFrame, marks: pl.DataFrame) -> pl.DataFrame:
    """The rc_payouts rows (PAYOUTS_SCHEMA)."""
    joined = made.join(marks, on=["program_id", "payout_id"], how="left")
    return (
        joined.sort("seq")
        .select(
            "program_id",
            "payout_id",
            "up_to",
            "created_at",
            "created_by",
            number=pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("program_id"),
            status=pl.when(pl.col("paid_at").is_not_null()).then(pl.lit("paid")).otherwise(pl.lit("open")),
            paid_at=pl.col("paid_at").cast(UTC),
            paid_by="paid_by",
            payout_minimum="payout_minimum",
        )
        .select(pl.col(name).cast(dtype) for name, dtype in PAYOUTS_SCHEMA.items())
    )


def assign(
    lines: pl.DataFrame, made: pl.DataFrame, marks: pl.DataFrame, acts: pl.DataFrame | None = None
) -> pl.DataFrame:
    """`lines` with `payout_id` (the first batch that takes each) and `paid` statuses. `acts`:
    the finance actions (reconcile/bookings.py `actions`): a sale held or void when a batch is
    made gives it none of its lines."""
    row = "__line"
    indexed = lines.drop("payout_id", strict=False).with_row_index(row)
    candidates = (
        indexed.lazy()
        .filter(pl.col("booked_seq").is_not_null() & (pl.col("amount") != 0))
        .select(row, "program_id", "sale_id", "booked_seq", "dated_at")
        .join(made.lazy().select("program_id", "payout_id", "seq", "cutoff"), on="program_id")
        .filter((pl.col("booked_seq") < pl.col("seq")) & (pl.col("dated_at") < pl.col("cutoff")))
        .collect(engine=ENGINE)
    )
    if acts is not None and not acts.is_empty() and not candidates.is_empty():
        stopped = (
            candidates.select("program_id", "sale_id", "seq")
            .unique()
            .join(acts, on=["program_id", "sale_id"])
            .filter(pl.col("action_seq") < pl.col("seq"))
        )
        at_batch = bookings.fold(stopped, ["program_id", "sale_id", "seq"]).filter(
            pl.col("hold_state").is_in(["held", "void"])
        )
        candidates = candidates.join(
            at_batch.select("program_id", "sale_id", "seq"), on=["program_id", "sale_id", "seq"], how="anti"
        )
    taken = candidates.sort("seq").group_by(row, maintain_order=True).agg(pl.col("payout_id").first())
    settled = marks.select("program_id", "payout_id", settled=pl.lit(True))
    return (
        indexed.join(taken, on=row, how="left")
        .join(settled, on=["program_id", "payout_id"], how="left")
        .with_columns(
            status=pl.when(pl.col("settled").fill_null(False))
            .then(pl.lit("paid"))
            .when(pl.col("payout_id").is_not_null())
            .then(pl.lit("approved"))
            .otherwise(pl.col("status"))
        )
        .drop(row, "settled")
    )
