"""The double-counting report: every sale seen twice, and what was counted instead.

Rows come from rc_double_counts (reconcile/doubles.py states the rules): `kind` is
`connect_and_self_hosted` (the processor's record of a sale also tracked self-hosted: the
connect record counts), `self_hosted_repeat` (two accepted self-hosted sales with one transaction
id: the earliest counts) or `ingest_refused` (a duplicate refused at ingest, listed as it came).
`sale_id`/`transaction_id` name the counted sale, `duplicate_id`/`duplicate_transaction_id` the
record that was not counted. The summary counts them per currency and kind (amounts in minor
units of their currency, never summed across currencies).
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
    "currency": pl.String(),
    "occurred_at": pl.Datetime("us", "UTC"),
    "connect_record_ids": pl.List(pl.String()),
}
ORDER = ("occurred_at", "kind", "transaction_id", "duplicate_id")


@dataclass(frozen=True)
class DoubleCountingReport:
    program_id: str
    period: str | None
    summary: pl.DataFrame  # currency, kind, count, amount
    rows: pl.DataFrame  # DOUBLE_COUNT_FIELDS


def build_double_counting(
    double_counts: pl.DataFrame, *, program_id: str, period: str | None = None
) -> DoubleCountingReport:
    """The report from the program's rc_double_counts rows (already limited to `period`)."""
    rows = (
        double_counts.lazy()
        .select(pl.col(name).cast(dtype) for name, dtype in DOUBLE_COUNT_FIELDS.items())
        .with_columns(currency=pl.col("currency").str.to_lowercase().fill_null(NO_CURRENCY))
        .sort(ORDER, nulls_last=True)
        .collect()
    )
    summary = (
        rows.group_by("currency", "kind")
        .agg(count=pl.len().cast(pl.Int64), amount=pl.col("amount").fill_null(0).sum())
        .sort("currency", "kind")
    )
    return DoubleCountingReport(program_id=program_id, period=period, summary=summary, rows=rows)
