"""Manual entries: a bonus or a correction an owner books for a partner. Pure.

A `manual_entry` row (ingest/actions.py, body `{"partner_code", "amount", "currency", "reason",
"by"}`, its `event_id` also its `transaction_id`) is one ledger line of kind `manual`: the amount
(minor units, either sign) in the currency, for the partner, approved at once and booked by the
row itself (`booked_seq` its seq, `booked_at` its time), so any later payout batch may pay it and
nothing later changes it. It is dated when logged, in that month, or in the first month still
open then when that one was closed before it (reconcile/periods.py). Its `status_reason` is the
entry's reason and `status_by` who made it; its `sale_id` and `transaction_id` are the entry's
id (so finance can hold or void it like a sale's lines). An entry without a partner, currency or
a non-zero whole amount is no line.
"""

from __future__ import annotations

import polars as pl

from reconcile.schema import ENGINE, UTC, first_open, period_of

KIND = "manual_entry"
_BODY = pl.Struct({"reason": pl.String, "by": pl.String})


def lines(log: pl.LazyFrame, closed: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """The `manual` lines of the log's entries, in `columns` (COMMISSIONS_SCHEMA's before
    `payout_id`, plus `booked_seq` and `booked_at`). `closed`: program_id, period, close_seq."""
    found = (
        log.filter(
            (pl.col("kind") == KIND)
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("event_id").is_not_null()
            & pl.col("partner_code").is_not_null()
            & pl.col("currency").is_not_null()
            & pl.col("amount").is_not_null()
            & (pl.col("amount") != 0)
        )
        .select(
            "program_id",
            "seq",
            "received_at",
            "partner_code",
            "currency",
            "amount",
            entry="event_id",
            body=pl.col("body").str.json_decode(_BODY),
        )
        .unique(["program_id", "entry"], keep="first")
        .collect(engine=ENGINE)
    )
    if found.is_empty():
        return pl.DataFrame(schema={c: pl.Null for c in columns}).clear()
    shut: dict[tuple[str, str], int] = {
        (p, m): s for p, m, s in closed.select("program_id", "period", "close_seq").iter_rows()
    }
    months = []
    for program, month, seq in found.select(
        "program_id", period_of(pl.col("received_at")).alias("month"), "seq"
    ).iter_rows():

        def closed_before(m: str, program: str = program, seq: int = seq) -> bool:
            return (program, m) in shut and shut[(program, m)] < seq

        months.append(first_open(month, closed_before))
    made = found.with_columns(
        sale_id="entry",
        transaction_id="entry",
        kind=pl.lit("manual"),
        cause="entry",
        adjusts=pl.lit(None, pl.String),
        period=pl.Series(months, dtype=pl.String),
        sale_period=period_of(pl.col("received_at")),
        reversed=pl.lit(0, pl.Int64),
        platform_fee=pl.lit(0, pl.Int64),
        platform_fee_reversed=pl.lit(0, pl.Int64),
        refunded=pl.lit(0, pl.Int64),
        status=pl.lit("approved"),
        self_referral=pl.lit(False),
        occurred_at=pl.col("received_at").cast(UTC),
        available_at=pl.col("received_at").cast(UTC),
        dated_at=pl.col("received_at").cast(UTC),
        booked_seq="seq",
        booked_at=pl.col("received_at").cast(UTC),
        status_reason=pl.col("body").struct.field("reason"),
        status_by=pl.col("body").struct.field("by"),
    )
    extra = [c for c in columns if c not in made.columns]
    return made.with_columns(pl.lit(None).alias(c) for c in extra).select(columns)
