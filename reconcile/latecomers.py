"""Sales logged after their month was closed count where they were logged. Pure.

A closed month's figures never change (reconcile/periods.py). A sale that occurred in a closed
month but reached the log only after the close (a processor record or a track call received
late) is not in that month's figures: its commission goes to the first open month as a line of
its own (reconcile/periods.py), and its amount counts in the sales figures of the month it was
logged, at the earliest the month after the closed one, as refunds do (reconcile/refunds.py
`booked_in`). `booked_period` says which: the sale's own month (`period`) unless that month was
closed (its first close, by `seq`) before the sale's first record was logged (the lowest `seq` of
an accepted row carrying one of the sale's ids); then the later of the month that record was
received in and the month after the closed one.
"""

from __future__ import annotations

import polars as pl

from reconcile.schema import ENGINE, period_of

# The ids a sale's records carry (a processor record: any of them; a track sale: its transaction id).
_IDS = ("transaction_id", "invoice_id", "payment_intent_id", "checkout_session_id")


def _after(period: pl.Expr) -> pl.Expr:
    year, month = period.str.slice(0, 4).cast(pl.Int32), period.str.slice(5, 2).cast(pl.Int32)
    return pl.format(
        "{}-{}",
        (year + month // 12).cast(pl.String).str.zfill(4),
        (month % 12 + 1).cast(pl.String).str.zfill(2),
    )


def booked_in(sales: pl.DataFrame, log: pl.LazyFrame, closed: pl.DataFrame) -> pl.DataFrame:
    """`sales` (with `period`) with `booked_period` (the module docstring's rule). `closed`:
    program_id, period, close_seq (reconcile/periods.py `closes`)."""
    if closed.is_empty() or sales.is_empty():
        return sales.with_columns(booked_period=pl.col("period"))
    in_closed = sales.select("program_id", "sale_id", "period", *_IDS).join(
        closed.select("program_id", "period", "close_seq"), on=["program_id", "period"]
    )
    if in_closed.is_empty():
        return sales.with_columns(booked_period=pl.col("period"))
    ids = pl.concat([in_closed.select("program_id", "sale_id", value=pl.col(c)) for c in _IDS]).drop_nulls(
        "value"
    )
    rows = (
        log.filter(
            (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("kind").is_in(["sale", "stripe"])
        )
        .select("program_id", "seq", "received_at", *_IDS)
        .collect(engine=ENGINE)
    )
    seen = pl.concat(
        [rows.select("program_id", "seq", "received_at", value=pl.col(c)) for c in _IDS]
    ).drop_nulls("value")
    first = (
        ids.unique()
        .join(seen, on=["program_id", "value"])
        .sort("seq")
        .group_by("program_id", "sale_id", maintain_order=True)
        .agg(logged_seq=pl.col("seq").first(), logged_at=pl.col("received_at").first())
    )
    late = (
        in_closed.join(first, on=["program_id", "sale_id"])
        .filter(pl.col("logged_seq") > pl.col("close_seq"))
        .select(
            "program_id",
            "sale_id",
            late_period=pl.max_horizontal(period_of(pl.col("logged_at")), _after(pl.col("period"))),
        )
    )
    return (
        sales.join(late, on=["program_id", "sale_id"], how="left")
        .with_columns(booked_period=pl.coalesce("late_period", "period"))
        .drop("late_period")
    )
