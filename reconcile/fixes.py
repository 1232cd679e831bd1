"""Metadata fixes and backfill: corrections appended to the log, applied only when backfilled.

A `metadata_fix` row (program_id, subscription_id or transaction_id, customer_key and/or
click_id) names sales whose attribution metadata was wrong or missing. It changes nothing on its
own: a fix takes effect for a sale only when a `backfill` row of the same program, applied
*after* the fix, covers the sale's `occurred_at` date (body `{"from": "YYYY-MM-DD", "to":
"YYYY-MM-DD"}`, both inclusive, UTC; a missing bound is open; `"dry_run": true` rows are
ignored). These engineer actions are ordered by `seq`, the order in which they were received:
for them, arrival order is the truth.

A fix matches a sale by subscription id or by transaction id. When several effective fixes
match one sale, each field (click id, customer key) takes the value of the latest fix (highest
seq) that sets it. A fixed sale reads its metadata as present (`subscription_metadata_missing`
no longer applies) and carries the warning `metadata_fixed`.
"""

from __future__ import annotations

import polars as pl

from reconcile.lookup import lookup
from reconcile.schema import ENGINE, distinct


def _engineer_rows(raw: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    return raw.filter(
        (pl.col("kind") == kind) & (pl.col("outcome") == "accepted") & pl.col("program_id").is_not_null()
    )


def _bound(name: str) -> pl.Expr:
    text = pl.col("body").str.json_path_match(f"$.{name}")
    return text.str.slice(0, 10).str.to_date("%Y-%m-%d", strict=False)


def backfills(raw: pl.LazyFrame) -> pl.LazyFrame:
    """Applied backfills: program_id, b_seq, b_from, b_to (dates, null = open)."""
    dry = pl.col("body").str.json_path_match("$.dry_run") == "true"
    return (
        _engineer_rows(raw, "backfill")
        .filter(~dry.fill_null(False))
        .select("program_id", b_seq=pl.col("seq"), b_from=_bound("from"), b_to=_bound("to"))
    )


def applied(raw: pl.LazyFrame) -> pl.DataFrame:
    """Applied backfills in `seq` order: program_id, seq, event_id, received_at."""
    dry = pl.col("body").str.json_path_match("$.dry_run") == "true"
    return (
        _engineer_rows(raw, "backfill")
        .filter(~dry.fill_null(False))
        .select("program_id", "seq", "event_id", "received_at")
        .sort("seq")
        .collect(engine=ENGINE)
    )


def metadata_fixes(raw: pl.LazyFrame) -> pl.LazyFrame:
    return _engineer_rows(raw, "metadata_fix").select(
        "program_id",
        fix_id=pl.col("event_id"),
        f_seq=pl.col("seq"),
        f_subscription=pl.col("subscription_id"),
        f_transaction=pl.col("transaction_id"),
        f_click=pl.col("click_id"),
        f_key=pl.col("customer_key"),
    )


def effective_fixes(raw: pl.LazyFrame, sales: pl.DataFrame) -> pl.DataFrame:
    """Per fixed sale: program_id, sale_id, fix_click, fix_key (either may be null)."""
    fixes = metadata_fixes(raw).collect(engine=ENGINE)
    if fixes.is_empty():
        return pl.DataFrame(
            schema={
                "program_id": pl.String,
                "sale_id": pl.String,
                "fix_click": pl.String,
                "fix_key": pl.String,
            }
        )
    fixes_lazy = fixes.lazy()
    targets = sales.lazy().select(
        "program_id",
        "sale_id",
        "subscription_id",
        "transaction_id",
        day=pl.col("occurred_at").dt.date(),
    )
    by_subscription = targets.join(
        fixes_lazy.filter(pl.col("f_subscription").is_not_null()),
        left_on=["program_id", "subscription_id"],
        right_on=["program_id", "f_subscription"],
    )
    by_transaction = targets.join(
        fixes_lazy.filter(pl.col("f_transaction").is_not_null()),
        left_on=["program_id", "transaction_id"],
        right_on=["program_id", "f_transaction"],
    )
    columns = ["program_id", "sale_id", "day", "fix_id", "f_seq", "f_click", "f_key"]
    candidates = pl.concat([by_subscription.select(columns), by_transaction.select(columns)])
    covered = candidates.join(backfills(raw), on="program_id").filter(
        (pl.col("b_seq") > pl.col("f_seq"))
        & (pl.col("b_from").is_null() | (pl.col("b_from") <= pl.col("day")))
        & (pl.col("b_to").is_null() | (pl.col("day") <= pl.col("b_to")))
    )
    covered = distinct(covered, ["program_id", "sale_id", "fix_id"])
    return (
        covered.sort("f_seq", descending=True)
        .group_by("program_id", "sale_id")
        .agg(
            fix_click=pl.col("f_click").drop_nulls().first(),
            fix_key=pl.col("f_key").drop_nulls().first(),
        )
        .collect(engine=ENGINE)
    )


def apply(sales: pl.DataFrame, fixes: pl.DataFrame) -> pl.DataFrame:
    """Sales with effective fixes folded into click_id / customer_key; adds `fixed`."""
    found = lookup(sales, fixes, ["program_id", "sale_id"], ["fix_click", "fix_key"])
    return (
        sales.hstack(found.get_columns())
        .with_columns(
            fixed=pl.col("fix_click").is_not_null() | pl.col("fix_key").is_not_null(),
            click_id=pl.coalesce("fix_click", "click_id"),
            customer_key=pl.coalesce("fix_key", "customer_key"),
        )
        .with_columns(metadata_missing=pl.col("metadata_missing") & ~pl.col("fixed"))
        .drop("fix_click", "fix_key")
    )
