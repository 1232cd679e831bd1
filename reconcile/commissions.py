"""Commissions and platform fees: who earns what on which sale, and its status today.

A sale is commissioned when it is real (not a test), attributed, and inside the program's
recurring window. The window belongs to the referred *customer* (reconcile/customers.py): the
program's real sales linked through any identity they share (customer key, processor customer
id, subscription id, normalised email), so a one-time purchase followed by a subscription, or two
subscriptions, share one window. Its anchor is the customer's first real attributed sale in
(occurred_at, sale_id) order, which is always commissioned; `recurring_months` null = every
later sale too (lifetime), 0 = the anchor only, N = sales that occurred before anchor + N
calendar months (month ends clamp: Jan 31 + 1 month = Feb 28/29).

- commission: `percent` -> round_half_even(amount * commission_bps / 10000); `flat` ->
  `commission_flat` for the sale's currency (minor units of it; CONTRACT 15): an integer setting
  pays that many in every currency, an object by currency pays the amount it names for the
  sale's currency, and nothing for a currency it does not name: the sale stays commissionable
  (its platform fee is due as ever) with commission 0 and `no_flat_amount` (the sales read's
  warning `no_flat_amount_for_currency`, explain's `commission` step).
- platform fee: round_half_even(amount * platform_fee_bps / 10000).
  Both on the amount net of tax, in integer minor units.
- status: `reversed` once the sale is fully refunded; else `held` for a self-referral (the
  sale's email equals the partner's email, case-insensitively); else `approved` when
  now >= occurred_at + holding_days (`available_at`; at the latest the last moment of the time
  range, ingest/bounds.py), else `pending`. (The sale's view; its ledger lines, which never
  rewrite approved money, are reconcile/ledger.py's.)
"""

from __future__ import annotations

import polars as pl

from ingest.domain.bounds import LATEST
from reconcile import customers, terms
from reconcile.lookup import lookup, lookup_small
from reconcile.money import apply_bps
from reconcile.schema import (
    ENGINE,
    INT,
    PROGRAM_DEFAULTS,
    PROGRAM_SCHEMA,
    STR,
    UTC,
    norm_email,
    setting_value,
)

# Columns of a sale the commission rules read.
INPUT = (
    "program_id",
    "sale_id",
    "occurred_at",
    "test_mode",
    "partner_code",
    "amount",
    "currency",
    "subscription_id",
    "customer_key",
    "processor_customer_id",
    "email",
)
OUTPUT = (
    "commissionable",
    "gross_commission",
    "gross_fee",
    "self_referral",
    "holding_days",
    "no_flat_amount",
)


def _customers(frame: pl.DataFrame, limited: pl.Series) -> pl.DataFrame:
    """INPUT plus the sale's normalised email and its customer (customers.components), found
    only where `limited` (the program limits the window; lifetime programs need no anchor)."""
    found = pl.int_range(0, frame.height, dtype=pl.UInt32, eager=True)
    if limited.any():
        rows = found.filter(limited)
        found = found.scatter(rows, rows.gather(customers.components(frame.filter(limited))))
    return frame.select(INPUT).with_columns(email_norm=norm_email(pl.col("email")), customer=found)


def _window_end(months: pl.Expr, anchor: pl.Expr, distinct: list[int]) -> pl.Expr:
    """anchor + `months` calendar months, for each distinct positive month count in use."""
    end: pl.Expr = pl.lit(None, UTC)
    for count in distinct:
        end = pl.when(months == count).then(anchor.dt.offset_by(f"{count}mo")).otherwise(end)
    return end


SETTINGS = tuple(name for name in PROGRAM_SCHEMA if name != "program_id")


def _terms(sales: pl.DataFrame, programs: pl.DataFrame) -> pl.DataFrame:
    """SETTINGS of each sale (aligned with `sales`): its program's terms in force at its
    occurred_at (`programs` as reconcile/terms.py `history` gives them; without `since`, one
    row per program)."""
    keys = sales.get_column("program_id")
    if "since" not in programs.columns or not terms.changed(programs):
        return lookup_small(keys, programs, "program_id", SETTINGS)
    settings = lookup_small(keys, programs.filter(pl.col("since").is_null()), "program_id", SETTINGS)
    versions = programs.filter(pl.col("since").is_not_null()).sort("since")
    which = (
        sales.select("program_id", "occurred_at", row=pl.int_range(pl.len(), dtype=pl.UInt32))
        .filter(pl.col("program_id").is_in(versions.get_column("program_id").implode()))
        .sort("occurred_at")
        .join_asof(
            versions.select("program_id", "since", *SETTINGS),
            left_on="occurred_at",
            right_on="since",
            by="program_id",
            strategy="backward",
            allow_exact_matches=False,  # a change applies to sales after it
            check_sortedness=False,
        )
        .filter(pl.col("since").is_not_null())
    )
    rows = which.get_column("row")
    return pl.DataFrame(
        [settings.get_column(name).scatter(rows, which.get_column(name)) for name in SETTINGS]
    )


def _flat(windowed: pl.DataFrame) -> pl.Series:
    """The flat commission of each row of `windowed` (its `commission_flat` setting as JSON
    text and its `currency`) in minor units of its currency, null where the setting is an
    object that names no amount for that currency. The few distinct settings are read once."""
    every: dict[str, int] = {}
    named: list[tuple[str, str, int]] = []
    for text in windowed.get_column("commission_flat").drop_nulls().unique().to_list():
        setting = setting_value(text)
        if isinstance(setting, int):
            every[text] = setting
        else:
            named.extend((text, code, amount) for code, amount in setting.items())
    flat = windowed.get_column("commission_flat").replace_strict(every, default=None, return_dtype=INT)
    if not named:
        return flat
    table = pl.DataFrame(named, schema={"commission_flat": STR, "currency": STR, "flat": INT}, orient="row")
    keys = windowed.select("commission_flat", currency=pl.col("currency").str.to_lowercase())
    return flat.fill_null(lookup(keys, table, ["commission_flat", "currency"], ["flat"]).to_series())


def gross(sales: pl.DataFrame, programs: pl.DataFrame, partners: pl.DataFrame) -> pl.DataFrame:
    """For sales (columns INPUT), aligned with them: OUTPUT. `programs`: one row per program,
    or its terms over time (reconcile/terms.py `history`)."""
    eligible = ~pl.col("test_mode") & pl.col("partner_code").is_not_null()
    settings = _terms(sales, programs).with_columns(
        pl.col(name).fill_null(pl.lit(value, PROGRAM_SCHEMA[name]))
        for name, value in PROGRAM_DEFAULTS.items()
    )
    # The window is the customer's wherever the program limits it under any terms: anchors
    # are found over all of such a program's sales (lifetime programs need none).
    windowing = programs.filter(pl.col("recurring_months").is_not_null()).get_column("program_id")
    program_limits = pl.col("program_id").is_in(windowing.implode())
    windowed = _customers(sales, sales.select(program_limits.fill_null(False)).to_series()).hstack(
        settings.get_columns()
    )
    limited = eligible & program_limits
    line = ["program_id", "customer"]
    anchors = (
        windowed.lazy()
        .filter(limited)
        .select(*line, "occurred_at", "sale_id")
        .sort("occurred_at", "sale_id")
        .group_by(line)
        .agg(anchor_sale=pl.col("sale_id").first(), anchor_at=pl.col("occurred_at").first())
    )
    anchored = lookup(
        windowed.select(pl.when(limited).then(pl.col("program_id")).alias("program_id"), *line[1:]),
        anchors,
        line,
        ["anchor_sale", "anchor_at"],
    )
    partner_emails = partners.select(
        "program_id",
        partner_code=pl.col("code"),
        email_norm=norm_email(pl.col("email")),
        own_email=pl.lit(True),
    )
    emails = lookup(windowed, partner_emails, ["program_id", "partner_code", "email_norm"], ["own_email"])
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
    flat = pl.col("commission_type") == "flat"
    commission = (
        pl.when(flat)
        .then(pl.col("flat_amount").fill_null(0))
        .otherwise(apply_bps(pl.col("amount"), pl.col("commission_bps")))
    )
    zero = pl.lit(0, pl.Int64)
    return (
        windowed.hstack(
            [*anchored.get_columns(), *emails.get_columns(), _flat(windowed).alias("flat_amount")]
        )
        .lazy()
        .with_columns(commissionable=(eligible & in_window).fill_null(False))
        .select(
            "commissionable",
            gross_commission=pl.when(pl.col("commissionable")).then(commission).otherwise(zero),
            gross_fee=pl.when(pl.col("commissionable"))
            .then(apply_bps(pl.col("amount"), pl.col("platform_fee_bps")))
            .otherwise(zero),
            self_referral=pl.col("commissionable") & pl.col("own_email").fill_null(False),
            holding_days="holding_days",
            no_flat_amount=pl.col("commissionable") & flat & pl.col("flat_amount").is_null(),
        )
        .collect(engine=ENGINE)
    )


def finish(sales: pl.DataFrame, totals: pl.DataFrame, now: pl.Expr) -> pl.DataFrame:
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
    refunded = lookup(sales, totals, ["program_id", "sale_id"], ["refunded", "reversed", "fee_reversed"])
    return (
        sales.hstack(refunded.get_columns())
        .lazy()
        .with_columns(
            pl.col("refunded", "reversed", "fee_reversed").fill_null(0),
            # a sale near the end of the time range, held, would otherwise be available in year
            # 10000, which no read can show (nor PostgreSQL's client load)
            available_at=pl.min_horizontal(
                pl.col("occurred_at") + pl.duration(days=pl.col("holding_days")), pl.lit(LATEST, UTC)
            ),
        )
        .with_columns(
            commission=pl.col("gross_commission") - pl.col("reversed"),
            platform_fee=pl.col("gross_fee") - pl.col("fee_reversed"),
            commission_status=status,
        )
        .collect(engine=ENGINE)
    )
