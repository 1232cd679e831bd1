"""The double-counting report: every sale seen twice, and what was counted instead.

Rows come from rc_double_counts (reconcile/doubles.py states the rules): `kind` is
`connect_and_self_hosted` (the processor's record of a sale also tracked self-hosted: the
connect record counts), `self_hosted_repeat` (two accepted self-hosted sales with one transaction
id: the earliest counts) or `ingest_refused` (a duplicate refused at ingest, listed as it came).
`sale_id`/`transaction_id` name the counted sale, `duplicate_id`/`duplicate_transaction_id` the
record that was not counted; `amount` is that record's own amount.

Partners: `partner_code` is the counted sale's partner, `duplicate_partner_code` the partner the
record that was not counted named, and `partner_mismatch` says when that record named a partner
the counted sale is not attributed to (the processor's record and the self-hosted call named
different partners; the counted one was paid).

Money is counted once per sale: `distinct_amount` carries a sale's amount on its first line and 0
on its others (a refused retry is a line, not more money), so its sum is the money seen twice,
each sale once. The summary, per currency and kind: `count` (lines), `amount` (the sum of
`distinct_amount`, so a sale's money sits with the kind of its first line and the kinds add up to
the total) and `partner_mismatches`; `totals`, per currency: `lines`, `sales` (distinct sales),
`amount` and `partner_mismatches`. Amounts are minor units of their currency, never summed across
currencies.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from reports.money import NO_CURRENCY

DOUBLE_COUNT_FIELDS: dict[str, pl.DataType] = {
    "kind": pl.String(),
    "transaction_id": pl.String(),
    "sale_id": pl.String(),
    "duplicate_id": pl.String(),
    "duplicate_transaction_id": pl.String(),
    "matched_on": pl.String(),
    "amount": pl.Int64(),
    "distinct_amount": pl.Int64(),
    "currency": pl.String(),
    "partner_code": pl.String(),
    "duplicate_partner_code": pl.String(),
    "partner_mismatch": pl.Boolean(),
    "occurred_at": pl.Datetime("us", "UTC"),
    "connect_record_ids": pl.List(pl.String()),
}
ORDER = ("occurred_at", "kind", "transaction_id", "duplicate_id")


@dataclass(frozen=True)
class DoubleCountingReport:
    program_id: str
    period: str | None
    summary: pl.DataFrame  # currency, kind, count, amount, partner_mismatches
    totals: pl.DataFrame  # currency, lines, sales, amount, partner_mismatches
    rows: pl.DataFrame  # DOUBLE_COUNT_FIELDS


def _sale() -> pl.Expr:
    """The distinct sale a line is about (reconcile/doubles.py): its counted sale, else its
    transaction id, else the line itself."""
    no_sale = pl.col("sale_id").is_null()
    return pl.struct(
        "sale_id",
        pl.when(no_sale).then(pl.col("transaction_id")).alias("by_transaction"),
        pl.when(no_sale & pl.col("transaction_id").is_null()).then(pl.col("duplicate_id")).alias("by_line"),
    )


def build_double_counting(
    double_counts: pl.DataFrame, *, program_id: str, period: str | None = None
) -> DoubleCountingReport:
    """The report from the program's rc_double_counts rows (already limited to `period`)."""
    rows = (
        double_counts.lazy()
        .select(pl.col(name).cast(dtype) for name, dtype in DOUBLE_COUNT_FIELDS.items())
        .with_columns(
            currency=pl.col("currency").str.to_lowercase().fill_null(NO_CURRENCY),
            distinct_amount=pl.col("distinct_amount").fill_null(0),
            partner_mismatch=pl.col("partner_mismatch").fill_null(False),
        )
        .sort(ORDER, nulls_last=True)
        .collect()
    )
    mismatches = pl.col("partner_mismatch").cast(pl.Int64).sum()
    summary = (
        rows.group_by("currency", "kind")
        .agg(
            count=pl.len().cast(pl.Int64),
            amount=pl.col("distinct_amount").sum(),
            partner_mismatches=mismatches,
        )
        .sort("currency", "kind")
    )
    totals = (
        rows.group_by("currency")
        .agg(
            lines=pl.len().cast(pl.Int64),
            sales=_sale().n_unique().cast(pl.Int64),
            amount=pl.col("distinct_amount").sum(),
            partner_mismatches=mismatches,
        )
        .sort("currency")
    )
    return DoubleCountingReport(
        program_id=program_id, period=period, summary=summary, totals=totals, rows=rows
    )
