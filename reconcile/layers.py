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
those layers are valued again (attribution and commission; the last is the ledger's own pass).
A fix can only change the sales of the customers it touches (reconcile/customers.py: the
ladder's processor-customer rule and the recurring window look no further), so each layer is
valued on those customers' sales alone: the sales linked, under any of the fix sets, to a sale
whose fixes differ between two of them. Per sale, consecutive equal values collapse: `states` lists, for each
sale whose values ever changed, state 0 (before the first change) and one state per change, with
the time it took effect and the backfill that made it. Sales whose values never changed are not
listed: their only state is the ledger's final one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import polars as pl

from reconcile import customers, fixes
from reconcile.schema import ENGINE, UTC, norm_email

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

# [(program_id, some of its sales before fixes, effective fixes)] -> for each: program_id,
# sale_id and VALUES of those sales (valued all at once, so that lookups are prepared once).
Job = tuple[str, pl.DataFrame, pl.DataFrame]
Value = Callable[[list[Job]], list[pl.DataFrame]]


def _fix_sets(
    engineer: pl.LazyFrame, sales: dict[str, pl.DataFrame], cuts: dict[str, int | None]
) -> dict[str, pl.DataFrame]:
    """For each program of `cuts`: its effective fixes on its `sales` with its backfills after
    its cut left out (None: all of them), sorted by sale_id. One pass for all those programs:
    fixes and backfills only reach sales of their own program."""
    cut = pl.DataFrame(
        {"program_id": list(cuts), "__cut": list(cuts.values()), "__in": [True] * len(cuts)},
        schema={"program_id": pl.String, "__cut": pl.Int64, "__in": pl.Boolean},
    )
    drop = (
        (pl.col("kind") == "backfill")
        & pl.col("__in")
        & (pl.col("__cut").is_null() | (pl.col("seq") > pl.col("__cut")))
    )
    kept = (
        engineer.join(cut.lazy(), on="program_id", how="left", maintain_order="left")
        .filter(~drop.fill_null(False))
        .drop("__cut", "__in")
    )
    found = fixes.effective_fixes(kept, pl.concat([sales[program] for program in cuts])).sort("sale_id")
    parts = found.partition_by("program_id", as_dict=True)
    return {program: parts.get((program,), found.clear()) for program in cuts}


def states(engineer: pl.LazyFrame, sales: pl.DataFrame, final: pl.DataFrame, value: Value) -> pl.DataFrame:
    """The states of the sales whose values a backfill changed (STATES_SCHEMA).

    `engineer`: the log's metadata fixes and backfills; `sales`: the sales before fixes (columns
    of fixes.effective_fixes); `final`: program_id, sale_id and VALUES after every backfill."""
    applied = fixes.applied(engineer)
    programs = sorted(set(applied.get_column("program_id").to_list()))
    concerned = pl.col("program_id").is_in(programs)
    by_program = sales.filter(concerned).partition_by("program_id", as_dict=True)
    finals = final.filter(concerned).partition_by("program_id", as_dict=True)
    # per program with layers to value: its sales, the fix sets of those layers, their times and causes
    # per program: its sales, the sales a fix names (only those can have effective fixes), and
    # its applied backfills' seqs, ids and times
    plan: dict[str, tuple[pl.DataFrame, pl.DataFrame, list[Any], list[Any], list[Any]]] = {}
    for program in programs:
        mine = applied.filter(pl.col("program_id") == program)
        program_sales = by_program.get((program,))
        if program_sales is None:
            continue
        named = fixes.metadata_fixes(engineer.filter(pl.col("program_id") == program)).collect(engine=ENGINE)
        targeted = program_sales.filter(
            pl.col("subscription_id").is_in(named.get_column("f_subscription").drop_nulls().implode())
            | pl.col("transaction_id").is_in(named.get_column("f_transaction").drop_nulls().implode())
        )
        plan[program] = (
            program_sales,
            targeted,
            mine.get_column("seq").to_list(),
            mine.get_column("event_id").to_list(),
            mine.get_column("received_at").cum_max().to_list(),
        )
    # The fix sets after each program's first i backfills (i = 0: none of them), level by level
    # for all programs at once.
    sets: dict[str, list[pl.DataFrame]] = {program: [] for program in plan}
    for level in range(1 + max((len(seqs) for _, _, seqs, _, _ in plan.values()), default=-1)):
        cuts = {
            program: None if level == 0 else seqs[level - 1]
            for program, (_, _, seqs, _, _) in plan.items()
            if level <= len(seqs)
        }
        for program, fix_set in _fix_sets(
            engineer, {program: plan[program][1] for program in cuts}, cuts
        ).items():
            sets[program].append(fix_set)
    # per program with layers to value: its sales, the fix sets of those layers, their times and causes
    found: list[tuple[str, pl.DataFrame, list[pl.DataFrame], list[tuple[Any, Any]]]] = []
    for program, (program_sales, _, _, ids, times) in plan.items():
        mine_sets = sets[program]
        starts = [i for i in range(len(mine_sets)) if i == 0 or not mine_sets[i].equals(mine_sets[i - 1])]
        if len(starts) == 1:
            continue
        marks = [(times[i - 1] if i else None, ids[i - 1] if i else None) for i in starts]
        found.append((program, program_sales, [mine_sets[i] for i in starts], marks))
    # The sales each program's layers can change, found for all programs at once (every link
    # is within a program): one pass over the identities instead of one per program.
    reached = (
        _reached(
            pl.concat([program_sales for _, program_sales, _, _ in found]),
            [(program, fix_sets) for program, _, fix_sets, _ in found],
        ).partition_by("program_id", as_dict=True)
        if found
        else {}
    )
    jobs: list[Job] = []
    # per program: the layers to value (jobs[first:]), their times and causes, the final values
    plans: list[tuple[int, list[tuple[Any, Any]], pl.DataFrame]] = []
    for program, program_sales, fix_sets, marks in found:
        mine_reached = reached.get((program,), pl.DataFrame(schema={"sale_id": pl.String}))
        ids_reached = mine_reached.get_column("sale_id").implode()
        subset = program_sales.filter(pl.col("sale_id").is_in(ids_reached))
        plans.append((len(jobs), marks, finals[(program,)].filter(pl.col("sale_id").is_in(ids_reached))))
        jobs += [(program, subset, fix_set) for fix_set in fix_sets[:-1]]  # the last is the final pass's
    valued = value(jobs) if jobs else []
    parts: list[pl.DataFrame] = []
    for first, marks, last in plans:
        frames = [*valued[first : first + len(marks) - 1], last]
        layers = [
            frame.select(
                "program_id",
                "sale_id",
                *VALUES,
                layer=pl.lit(rank, pl.Int64),
                at=pl.lit(at, UTC),
                cause=pl.lit(cause, pl.String),
            )
            for rank, (frame, (at, cause)) in enumerate(zip(frames, marks, strict=True))
        ]
        parts += layers
    if not parts:
        return pl.DataFrame(schema=STATES_SCHEMA)
    # one pass for every program (it sorts by program first: the order of a pass per program)
    return _collapse(pl.concat(parts, how="vertical_relaxed")).select(list(STATES_SCHEMA))


def _reached(sales: pl.DataFrame, fix_sets: list[tuple[str, list[pl.DataFrame]]]) -> pl.DataFrame:
    """program_id and sale_id of the `sales` linked to a sale whose effective fixes differ
    between consecutive fix sets of its program (`fix_sets`: each program's, in order): starting
    from those sales, every real sale of the same program sharing an identity
    (reconcile/customers.py) with one reached, under any of its program's fix sets, until none
    is new. Every program's sales are searched at once; no link crosses programs."""
    key = ["program_id", "sale_id", "fix_click", "fix_key"]
    sale = ["program_id", "sale_id"]
    changed = pl.concat(
        [
            pl.concat(
                [
                    a.join(b, on=key, how="anti", nulls_equal=True),
                    b.join(a, on=key, how="anti", nulls_equal=True),
                ]
            ).select(sale)
            for _, sets in fix_sets
            for a, b in itertools.pairwise(sets)
        ]
    ).unique()
    real = sales.filter(~pl.col("test_mode").fill_null(False))
    fixed_keys = pl.concat(
        [f.select(*sale, value="fix_key") for _, sets in fix_sets for f in sets]
    ).drop_nulls()
    identities = pl.concat(
        [
            *(
                real.select(
                    *sale, kind=pl.lit(i, pl.Int8), value=norm_email(pl.col(n)) if n == "email" else n
                )
                for i, n in enumerate(customers.IDENTITIES)
            ),
            fixed_keys.join(real.select(sale), on=sale).select(
                *sale, kind=pl.lit(customers.IDENTITIES.index("customer_key"), pl.Int8), value="value"
            ),
        ]
    ).drop_nulls()
    identity = ["program_id", "kind", "value"]
    reached, frontier = changed, changed
    while frontier.height:
        shared = identities.join(frontier, on=sale, how="semi").select(identity).unique()
        linked = identities.join(shared, on=identity, how="semi").select(sale).unique()
        frontier = linked.join(reached, on=sale, how="anti")
        reached = pl.concat([reached, frontier])
    return reached


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
