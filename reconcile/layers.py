"""Backfill layers: what each sale earned, and for whom, before and after each applied backfill.

A backfill re-attributes sales (reconcile/fixes.py); once a sale's commission line is approved,
the ledger (reconcile/ledger.py) books what a later backfill changes as lines of its own, so it
needs the sale's values as they were between backfills. A program's applied backfills B1..Bn
(in `seq` order: for engineer actions the order of arrival is the truth) take effect at their
log time, `received_at` (the latest of its own and every earlier backfill's, so that a program's
backfills take effect in the order they were applied).

For each program with applied backfills, the fixes effective after the first i backfills are
found for i = 0..n (reconcile/fixes.py `effective_fixes`, on the engineer rows with the later
backfills left out); only where they differ from those after i - 1 can values change, and only
those layers are valued again (attribution and commission over the program's sales; the last is
the ledger's own pass). Per sale, consecutive equal values collapse: `states` lists, for each
sale whose values ever changed, state 0 (before the first change) and one state per change, with
the time it took effect and the backfill that made it. Sales whose values never changed are not
listed: their only state is the ledger's final one.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from reconcile import fixes
from reconcile.schema import ENGINE, UTC

# What a state holds: the commission the sale earns and for whom.
VALUES = ("partner_code", "commissionable", "gross_commission", "gross_fee", "self_referral")
STATES_SCHEMA: dict[str, pl.DataType] = {
    "program_id": pl.String(),
    "sale_id": pl.String(),
    "state": pl.Int64(),
    "at": UTC,
    "cause": pl.String(),
    "partner_code": pl.String(),
    "commissionable": pl.Boolean(),
    "gross_commission": pl.Int64(),
    "gross_fee": pl.Int64(),
    "self_referral": pl.Boolean(),
}

# (program_id, effective fixes of its sales) -> program_id, sale_id and VALUES of its sales.
Value = Callable[[str, pl.DataFrame], pl.DataFrame]


def _fix_set(engineer: pl.LazyFrame, sales: pl.DataFrame, program: str, last_seq: int | None) -> pl.DataFrame:
    """The program's effective fixes with its backfills after `last_seq` left out (None: all)."""
    drop = (pl.col("kind") == "backfill") & (pl.col("program_id") == program)
    if last_seq is not None:
        drop = drop & (pl.col("seq") > last_seq)
    return fixes.effective_fixes(engineer.filter(~drop.fill_null(False)), sales).sort("sale_id")


def states(engineer: pl.LazyFrame, sales: pl.DataFrame, final: pl.DataFrame, value: Value) -> pl.DataFrame:
    """The states of the sales whose values a backfill changed (STATES_SCHEMA).

    `engineer`: the log's metadata fixes and backfills; `sales`: the sales before fixes (columns
    of fixes.effective_fixes); `final`: program_id, sale_id and VALUES after every backfill."""
    applied = fixes.applied(engineer)
    parts: list[pl.DataFrame] = []
    for program in sorted(set(applied.get_column("program_id").to_list())):
        mine = applied.filter(pl.col("program_id") == program)
        program_sales = sales.filter(pl.col("program_id") == program)
        if program_sales.is_empty():
            continue
        seqs = mine.get_column("seq").to_list()
        ids = mine.get_column("event_id").to_list()
        times = mine.get_column("received_at").cum_max().to_list()
        sets = [_fix_set(engineer, program_sales, program, None)]
        sets += [_fix_set(engineer, program_sales, program, seq) for seq in seqs]
        starts = [i for i in range(len(sets)) if i == 0 or not sets[i].equals(sets[i - 1])]
        if len(starts) == 1:
            continue
        layers: list[pl.DataFrame] = []
        for rank, start in enumerate(starts):
            valued = (
                final.filter(pl.col("program_id") == program)
                if rank == len(starts) - 1
                else value(program, sets[start])
            )
            layers.append(
                valued.select(
                    "program_id",
                    "sale_id",
                    *VALUES,
                    layer=pl.lit(rank, pl.Int64),
                    at=pl.lit(times[start - 1] if start else None, UTC),
                    cause=pl.lit(ids[start - 1] if start else None, pl.String),
                )
            )
        parts.append(_collapse(pl.concat(layers, how="vertical_relaxed")))
    if not parts:
        return pl.DataFrame(schema=STATES_SCHEMA)
    return pl.concat(parts).select(list(STATES_SCHEMA))


def _collapse(layers: pl.DataFrame) -> pl.DataFrame:
    """Per sale, the layers whose values differ from the layer before, numbered from 0; sales
    with a single such layer are left out."""
    sale = ["program_id", "sale_id"]
    changed = pl.any_horizontal(pl.col(v).ne_missing(pl.col(v).shift(1).over(sale)) for v in VALUES)
    kept = (
        layers.lazy()
        .sort(*sale, "layer")
        .filter((pl.col("layer") == pl.col("layer").min().over(sale)) | changed)
        .with_columns(state=pl.int_range(pl.len(), dtype=pl.Int64).over(sale))
        .filter(pl.len().over(sale) > 1)
    )
    return kept.collect(engine=ENGINE)
