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
from reconcile.schema import PROGRAM_DEFAULTS, PROGRAM_SCHEMA, norm_email


def window_key() -> pl.Expr:
    return pl.coalesce(
        pl.lit("sub:") + pl.col("subscription_id"),
        pl.lit("key:") + pl.col("customer_key"),
        pl.lit("pc:") + pl.col("processor_customer_id"),
        pl.lit("email:") + pl.col("email_norm"),
        pl.lit("sale:") + pl.col("sale_id"),
    )


def gross(sales: pl.LazyFrame, programs: pl.LazyFrame, partners: pl.LazyFrame) -> pl.LazyFrame:
    """Adds commissionable, gross_commission, gross_fee, self_referral, holding_days."""
    eligible = ~pl.col("test_mode") & pl.col("partner_code").is_not_null()
    with_settings = (
        sales.with_columns(email_norm=norm_email(pl.col("email")), window=window_key())
        .join(programs, on="program_id", how="left")
        .with_columns(
            pl.col(name).fill_null(pl.lit(value, PROGRAM_SCHEMA[name]))
            for name, value in PROGRAM_DEFAULTS.items()
        )
    )
    anchors = (
        with_settings.filter(eligible)
        .sort("occurred_at", "sale_id")
        .group_by("program_id", "window")
        .agg(anchor_sale=pl.col("sale_id").first(), anchor_at=pl.col("occurred_at").first())
    )
    months = pl.col("recurring_months")
    window_end = pl.col("anchor_at").dt.offset_by(pl.format("{}mo", months))
    in_window = (
        pl.when(months.is_null())
        .then(True)
        .when(months <= 0)
        .then(pl.col("sale_id") == pl.col("anchor_sale"))
        .otherwise(pl.col("occurred_at") < window_end)
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
        with_settings.join(anchors, on=["program_id", "window"], how="left")
        .join(partner_emails, on=["program_id", "partner_code"], how="left")
        .with_columns(commissionable=(eligible & in_window).fill_null(False))
        .with_columns(
            gross_commission=pl.when(pl.col("commissionable")).then(commission).otherwise(zero),
            gross_fee=pl.when(pl.col("commissionable"))
            .then(apply_bps(pl.col("amount"), pl.col("platform_fee_bps")))
            .otherwise(zero),
            self_referral=(
                pl.col("commissionable") & (pl.col("email_norm") == pl.col("partner_email")).fill_null(False)
            ),
        )
    )


def finish(sales: pl.LazyFrame, totals: pl.LazyFrame, now: pl.Expr) -> pl.LazyFrame:
    """Folds refund totals in: commission/platform_fee net of reversals, status, warnings."""
    fully = pl.col("refunded") >= pl.col("gross_amount")
    available_at = pl.col("occurred_at") + pl.duration(days=pl.col("holding_days"))
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
    warnings = pl.concat_list(
        pl.col("warnings"), pl.when(pl.col("self_referral")).then(pl.lit("self_referral"))
    ).list.drop_nulls()
    return (
        sales.join(totals, on=["program_id", "sale_id"], how="left")
        .with_columns(
            refunded=pl.col("refunded").fill_null(0),
            reversed=pl.col("reversed").fill_null(0),
            fee_reversed=pl.col("fee_reversed").fill_null(0),
            available_at=available_at,
        )
        .with_columns(
            commission=pl.col("gross_commission") - pl.col("reversed"),
            platform_fee=pl.col("gross_fee") - pl.col("fee_reversed"),
            commission_status=status,
            warnings=warnings,
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
