"""Backfill previews: what applying a backfill over a date range would change. Pure.

`preview` reconciles the log twice, as it is and with one more (hypothetical) `backfill` row for
the range, preceded by the copies of the unroutable events it would pick up
(reconcile/unroutable.py), and `diff` lists only the sales whose partner, rule, reason or
commission would change (a sale picked up appears, its `before_*` values null), with
before/after values, plus per-partner commission deltas (per currency, never summed across
currencies) and the adjustment lines it would add: for approved lines (reconcile/ledger.py)
and for closed months.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from reconcile.pipeline import Result, reconcile

COMPARED = ("partner_code", "attribution_rule", "unattributed_reason", "commission", "platform_fee")


@dataclass(frozen=True)
class BackfillDiff:
    sales: pl.DataFrame  # one row per changed sale: before_* / after_* columns
    partners: pl.DataFrame  # partner_code, currency, before, after, delta
    adjustments: pl.DataFrame  # adjustment lines that appear or change


def _with_rows(raw: pl.DataFrame, rows: Sequence[Mapping[str, object]]) -> pl.DataFrame:
    extra = pl.DataFrame([{name: row.get(name) for name in raw.columns} for row in rows], schema=raw.schema)
    return pl.concat([raw, extra], how="vertical")


def preview(
    raw: pl.DataFrame,
    programs: pl.DataFrame,
    partners: pl.DataFrame,
    backfill: Mapping[str, object],
    now: datetime,
    picked: Sequence[Mapping[str, object]] = (),
) -> BackfillDiff:
    """The diff of appending the `picked` rows (unroutable events picked up, routed to the
    program) and then `backfill` (a raw-log row of kind `backfill`) to `raw`."""
    program_id = backfill["program_id"]
    mine = raw.filter(pl.col("program_id") == program_id)
    progs = programs.filter(pl.col("program_id") == program_id)
    people = partners.filter(pl.col("program_id") == program_id)
    seq = int(mine.select(pl.col("seq").max()).item() or 0) + 1
    added = [{**row, "seq": seq + n} for n, row in enumerate([*picked, backfill])]
    before = reconcile(mine, progs, people, now)
    after = reconcile(_with_rows(mine, added), progs, people, now)
    return diff(before, after)


def diff(before: Result, after: Result) -> BackfillDiff:
    ids = ["program_id", "transaction_id", "currency", "occurred_at", "period"]
    b = before.sales.select(["sale_id", *ids, *COMPARED])
    a = after.sales.select(["sale_id", *ids, *COMPARED])
    joined = b.join(a, on="sale_id", how="full", suffix="_after", coalesce=True)
    changed = pl.any_horizontal([pl.col(c).ne_missing(pl.col(f"{c}_after")) for c in COMPARED])
    sales = (
        joined.filter(changed)
        .with_columns(pl.coalesce(c, f"{c}_after").alias(c) for c in ids)  # a new sale has no before
        .drop(f"{c}_after" for c in ids)
        .rename({c: f"before_{c}" for c in COMPARED})
        .rename({f"{c}_after": f"after_{c}" for c in COMPARED})
        .select(
            "program_id", "sale_id", *ids[1:], *(f"{w}_{c}" for w in ("before", "after") for c in COMPARED)
        )
        .sort("occurred_at", "sale_id")
    )

    def totals(result: Result, name: str) -> pl.DataFrame:
        return (
            result.sales.filter(pl.col("partner_code").is_not_null())
            .group_by("partner_code", "currency")
            .agg(pl.col("commission").sum().alias(name))
        )

    partners = (
        totals(before, "before")
        .join(totals(after, "after"), on=["partner_code", "currency"], how="full", coalesce=True)
        .with_columns(pl.col("before").fill_null(0), pl.col("after").fill_null(0))
        .with_columns(delta=pl.col("after") - pl.col("before"))
        .filter(pl.col("delta") != 0)
        .sort("partner_code", "currency")
    )
    line_key = ["sale_id", "partner_code", "kind", "cause", "period"]
    adjustments = (
        after.commissions.filter(pl.col("kind") == "adjustment")
        .join(
            before.commissions.filter(pl.col("kind") == "adjustment").select(line_key),
            on=line_key,
            how="anti",
        )
        .sort("period", "sale_id", "partner_code", "kind", "cause", nulls_last=True)
    )
    return BackfillDiff(sales, partners, adjustments)
