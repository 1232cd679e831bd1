"""Commissions and platform fees: who earns what on which sale, and its status today.

A sale is commissioned when it is real (not a test), attributed, and inside the program's
recurring window. The window belongs to the sale's *customer line*: its subscription id, else
its customer key, else processor customer id, else email, else the sale alone. The line's anchor
is its first real attributed sale in (occurred_at, sale_id) order, which is always commissioned;
`recurring_months` null = every later sale too (lifetime), 0 = the anchor only, N = sales that
occurred before anchor + N calendar months (month ends clamp: Jan 31 + 1 month = Feb 28/29).

- commission: `percent` -> round_half_even(amount * commission_bps / 10000); `flat` ->
  `commission_flat` (minor units of the sale's currency).
- platform fee: round_half_even(amount * platform_fee_bps / 10000).
  Both on the amount net of tax, in integer minor units.
- status: `reversed` once the sale is fully refunded; else `held` for a self-referral (the
  sale's email equals the partner's email, case-insensitively); else `approved` when
  now >= occurred_at + holding_days, else `pending`.
"""

from __future__ import annotations

import polars as pl

from reconcile.money import apply_bps
from reconcile.schema import PROGRAM_DEFAULTS, PROGRAM_SCHEMA, UTC, materialise, norm_email

# Columns of a sale the commission rules read.
INPUT = (
    "program_id",
    "sale_id",
    "occurred_at",
    "test_mode",
    "partner_code",
    "amount",
    "subscription_id",
    "customer_key",
    "processor_customer_id",
    "email",
)
OUTPUT = ("commissionable", "gross_commission", "gross_fee", "self_referral", "holding_days")


def _window(frame: pl.LazyFrame) -> pl.LazyFrame:
    """The customer line of each sale: (window_kind, window_value), without building strings."""
    email = norm_email(pl.col("email"))
    sources = [
        pl.col("subscription_id"),
        pl.col("customer_key"),
        pl.col("processor_customer_id"),
        email,
    ]
    kind: pl.Expr = pl.lit(len(sources), pl.Int8)
    for index in reversed(range(len(sources))):
        kind = pl.when(sources[index].is_not_null()).then(pl.lit(index, pl.Int8)).otherwise(kind)
    return frame.with_columns(
        email_norm=email,
        window_kind=kind,
        window_value=pl.coalesce(*sources, pl.col("sale_id")),
    )


def _window_end(months: pl.Expr, anchor: pl.Expr, distinct: list[int]) -> pl.Expr:
    """anchor + `months` calendar months, for each distinct positive month count in use."""
    end: pl.Expr = pl.lit(None, UTC)
    for count in distinct:
        end = pl.when(months == count).then(anchor.dt.offset_by(f"{count}mo")).otherwise(end)
    return end


def gross(sales: pl.LazyFrame, programs: pl.DataFrame, partners: pl.LazyFrame) -> pl.LazyFrame:
    """For sales (columns INPUT), rows in input order: OUTPUT."""
    eligible = ~pl.col("test_mode") & pl.col("partner_code").is_not_null()
    windowed = _window(sales.select(INPUT)).join(
        programs.lazy(), on="program_id", how="left", maintain_order="left"
    )
    windowed = materialise(
        windowed.with_columns(
            pl.col(name).fill_null(pl.lit(value, PROGRAM_SCHEMA[name]))
            for name, value in PROGRAM_DEFAULTS.items()
        )
    )
    line = ["program_id", "window_kind", "window_value"]
    anchors = (
        windowed.filter(eligible)
        .select(*line, "occurred_at", "sale_id")
        .sort("occurred_at", "sale_id")
        .group_by(line)
        .agg(anchor_sale=pl.col("sale_id").first(), anchor_at=pl.col("occurred_at").first())
    )
    months = pl.col("recurring_months")
    distinct = sorted(
        m for m in programs.get_column("recurring_months").drop_nulls().unique().to_list() if m > 0
    )
    in_window = (
        pl.when(months.is_null())
        .then(True)
        .when(months <= 0)
        .then(pl.col("sale_id") == pl.col("anchor_sale"))
        .otherwise(pl.col("occurred_at") < _window_end(months, pl.col("anchor_at"), distinct))
    )
    partner_emails = partners.select(
        "program_id", partner_code=pl.col("code"), partner_email=norm_email(pl.col("email"))
    )
    commission = (
        pl.when(pl.col("commission_type") == "flat")
        .then(pl.col("commission_flat"))
        .otherwise(apply_bps(pl.col("amount"), pl.col("commission_bps")))
    )
    zero = pl.lit(0, pl.Int64)
    return (
        windowed.join(anchors, on=line, how="left", maintain_order="left")
        .join(partner_emails, on=["program_id", "partner_code"], how="left", maintain_order="left")
        .with_columns(commissionable=(eligible & in_window).fill_null(False))
        .select(
            "commissionable",
            gross_commission=pl.when(pl.col("commissionable")).then(commission).otherwise(zero),
            gross_fee=pl.when(pl.col("commissionable"))
            .then(apply_bps(pl.col("amount"), pl.col("platform_fee_bps")))
            .otherwise(zero),
            self_referral=(
                pl.col("commissionable") & (pl.col("email_norm") == pl.col("partner_email")).fill_null(False)
            ),
            holding_days="holding_days",
        )
    )


def finish(sales: pl.LazyFrame, totals: pl.LazyFrame, now: pl.Expr) -> pl.LazyFrame:
    """Folds refund totals into sales carrying OUTPUT: net commission and fee, status."""
    fully = pl.col("refunded") >= pl.col("gross_amount")
    status = (
        pl.when(~pl.col("commissionable"))
        .then(None)
        .when(fully)
        .then(pl.lit("reversed"))
        .when(pl.col("self_referral"))
        .then(pl.lit("held"))
        .when(now >= pl.col("available_at"))
        .then(pl.lit("approved"))
        .otherwise(pl.lit("pending"))
    )
    return (
        sales.join(totals, on=["program_id", "sale_id"], how="left", maintain_order="left")
        .with_columns(
            refunded=pl.col("refunded").fill_null(0),
            reversed=pl.col("reversed").fill_null(0),
            fee_reversed=pl.col("fee_reversed").fill_null(0),
            available_at=pl.col("occurred_at") + pl.duration(days=pl.col("holding_days")),
        )
        .with_columns(
            commission=pl.col("gross_commission") - pl.col("reversed"),
            platform_fee=pl.col("gross_fee") - pl.col("fee_reversed"),
            commission_status=status,
        )
    )


def lines(sales: pl.LazyFrame) -> pl.LazyFrame:
    """One `commission` line per commissioned sale, in the sale's own month."""
    return sales.filter(pl.col("commissionable")).select(
        "program_id",
        "sale_id",
        "transaction_id",
        "partner_code",
        kind=pl.lit("commission"),
        period="period",
        sale_period="period",
        currency="currency",
        amount="commission",
        reversed="reversed",
        platform_fee="platform_fee",
        platform_fee_reversed="fee_reversed",
        refunded="refunded",
        status="commission_status",
        self_referral="self_referral",
        occurred_at="occurred_at",
        available_at="available_at",
    )
