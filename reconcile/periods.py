"""Closed periods: a closed month's commission lines never change; corrections move forward.

A `period_close` row (body `{"period": "YYYY-MM"}`) closes that month of its program; the first
close of a month counts. Closing is an engineer action, ordered by `seq`: the books as of a
close are what the log held before it (rows with a smaller seq). So for a program with closes at
seqs T1 < T2 < ... < Tk, the ledger is computed on each prefix (seq < Tj) and on the whole log.

A ledger line (reconcile/ledger.py) is keyed by (sale_id, partner_code, kind, cause); its month
P is its own `period` (the sale's month for a `commission` line, the month of the change for a
clawback or adjustment). For a line whose month P is closed at Ta:

- the line in P holds the values as of Ta (no line if the key did not exist then);
- each later change, from snapshot j to j+1 (j >= a), is a line of its own, named after and
  dated at its cause: the row bearing on the sale (reconcile/bookings.py `causes`) logged last
  between the closes Tj and Tj+1 (after Tk for the last); it goes to the first month still open
  at Tj that is neither before the month that row was logged in nor before the month after P,
  as a line of the key's kind if that is `clawback`, else an `adjustment` (with `adjusts` = the
  sale's transaction id, dated at the later of its cause's logging and that month's start);
  changes with the same cause and month add up, and only non-zero ones are kept (a change with
  no bearing row keeps the key's cause and the month's start). Its status is the key's current
  status (`reversed` once the key no longer exists, e.g. after re-attribution).

Bookings apply after this (pipeline.py): a booking holds the lines as they were shown, closed
months included, and every later difference is a line of its own (reconcile/bookings.py).

Lines of months never closed are the current ledger's. Programs without closes cost nothing
extra. The books as of every close, of every program, come from one more pass, whatever the
number of closes: each prefix is a program of its own in one log (`stacked`: the prefix's rows
under an alias of their program, one per close, so no rule relates rows of two prefixes, as
none relates rows of two programs), and the pass's lines are split back by alias. So a close
adds the rows of its prefix to that pass, never a pass of its own (before, each close cost one
full pass: 96 monthly closes of a 193-event log, 9.7 s; now 0.22 s, against 0.08 s with no
close). What still grows with the closes is the rows of that one pass (the sum of the prefixes).
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from reconcile import bookings
from reconcile.schema import ENGINE, first_open, next_month, period_of

VALUES = ("amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded")
KEY = ("sale_id", "partner_code", "kind", "cause")
PERIOD_PATTERN = r"^\d{4}-(0[1-9]|1[0-2])$"

ALIAS = "\x1f"  # joins a program id and a snapshot number into the alias of its prefix

# (the stacked prefixes, the aliases: alias, program_id) -> the ledger lines of every prefix,
# each under its alias (pipeline.py values each alias with its program's terms and partners)
Compute = Callable[[pl.LazyFrame, pl.DataFrame], pl.DataFrame]


def closes(log: pl.LazyFrame) -> pl.DataFrame:
    """program_id, period, close_seq: the first close of each program month."""
    return (
        log.filter(
            (pl.col("kind") == "period_close")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
        )
        .select("program_id", "seq", period=pl.col("body").str.json_path_match("$.period"))
        .filter(pl.col("period").str.contains(PERIOD_PATTERN).fill_null(False))
        .group_by("program_id", "period")
        .agg(close_seq=pl.col("seq").min())
        .collect(engine=ENGINE)
    )


def apply(log: pl.LazyFrame, current: pl.DataFrame, compute: Compute, sales: pl.DataFrame) -> pl.DataFrame:
    """Commission lines with closed months frozen and corrections as adjustments."""
    closed = closes(log)
    if closed.is_empty():
        return current
    snaps = (
        closed.select("program_id", seq="close_seq")
        .unique()
        .sort("program_id", "seq")
        .with_columns(snap=pl.int_range(pl.len()).over("program_id"))
        .with_columns(alias=pl.col("program_id") + ALIAS + pl.col("snap").cast(pl.String))
    )
    programs = sorted(set(closed["program_id"].to_list()))
    lines = compute(stacked(log, snaps), snaps.select("alias", "program_id"))
    by_alias = lines.partition_by("program_id", as_dict=True)
    parts = [current.filter(~pl.col("program_id").is_in(programs))]
    for program in programs:
        rows = closed.filter(pl.col("program_id") == program)
        close_at = dict(zip(rows["period"].to_list(), rows["close_seq"].to_list(), strict=True))
        seqs = sorted(set(close_at.values()))
        mine = current.filter(pl.col("program_id") == program)
        snapshots = [
            by_alias.get((f"{program}{ALIAS}{j}",), mine.clear()).with_columns(program_id=pl.lit(program))
            for j in range(len(seqs))
        ]
        snapshots.append(mine)
        parts.append(_compose(snapshots, close_at, seqs, _cause_finder(log, sales, seqs)))
    return pl.concat(parts, how="vertical_relaxed")


def stacked(log: pl.LazyFrame, snaps: pl.DataFrame) -> pl.LazyFrame:
    """Every prefix of `snaps` (program_id, seq, alias: the rows of the program below seq) in one
    log, each under its alias: as `program_id`, and as `meta_program_id` where the metadata named
    the program itself (so that it does not read as another program's)."""
    bounds = snaps.lazy().select("program_id", "alias", below="seq")
    return (
        log.join(bounds, on="program_id")
        .filter(pl.col("seq") < pl.col("below"))
        .with_columns(
            meta_program_id=pl.when(pl.col("meta_program_id") == pl.col("program_id"))
            .then(pl.col("alias"))
            .otherwise(pl.col("meta_program_id")),
            program_id=pl.col("alias"),
        )
        .drop("alias", "below")
    )


# (wanted: program_id, sale_id, snap, until) -> the same with cause, cause_at (null where none)
Causes = Callable[[pl.DataFrame], pl.DataFrame]


def _cause_finder(log: pl.LazyFrame, sales: pl.DataFrame, seqs: list[int]) -> Causes:
    """What caused a change of a closed month's line from snapshot `snap` to the next: the row
    bearing on its sale logged last after the close at `seqs[snap]` and before `until` (the next
    close; none after the last)."""

    def find(wanted: pl.DataFrame) -> pl.DataFrame:
        asked = wanted.with_columns(
            as_of=pl.col("snap").replace_strict(dict(enumerate(seqs)), return_dtype=pl.Int64)
        )
        found = bookings.causes(asked, log, sales, by=("snap",)).rename({"cause": "cause_found"})
        return wanted.join(found, on=[*bookings.SALE, "snap", "until"], how="left", nulls_equal=True)

    return find


def _months(close_at: dict[str, int], seqs: list[int], wanted: pl.DataFrame) -> pl.DataFrame:
    """(line_period, snap, floor) -> month: the first month from `floor` (at the earliest the one
    after the line's) that was still open at the close `seqs[snap]`."""
    rows: list[dict[str, object]] = []
    for line_period, snap, floor in wanted.select("line_period", "snap", "floor").unique().iter_rows():
        shut = {p for p, s in close_at.items() if s <= seqs[snap]}
        month = first_open(max(next_month(line_period), floor or ""), shut.__contains__)
        rows.append({"line_period": line_period, "snap": snap, "floor": floor, "month": month})
    return pl.DataFrame(
        rows, schema={"line_period": pl.String, "snap": pl.Int64, "floor": pl.String, "month": pl.String}
    )


def _compose(
    snapshots: list[pl.DataFrame], close_at: dict[str, int], seqs: list[int], find: Causes
) -> pl.DataFrame:
    last = len(snapshots) - 1
    columns = snapshots[-1].columns
    long = pl.concat(
        [s.select(columns).with_columns(snap=pl.lit(j, pl.Int64)) for j, s in enumerate(snapshots)],
        how="vertical_relaxed",
    )
    described = (
        long.sort("snap")
        .group_by(KEY)
        .agg(
            *(pl.col(c).last() for c in columns if c not in (*KEY, *VALUES, "period", "status")),
            line_period=pl.col("period").last(),
        )
        .with_columns(
            close_snap=pl.col("line_period").replace_strict(
                {p: seqs.index(s) for p, s in close_at.items()}, default=None, return_dtype=pl.Int64
            )
        )
    )
    current_status = long.filter(pl.col("snap") == last).select(*KEY, "status")
    described = described.join(current_status, on=KEY, how="left").with_columns(
        status=pl.col("status").fill_null("reversed")
    )
    open_lines = snapshots[-1].join(
        described.filter(pl.col("close_snap").is_null()).select(KEY), on=KEY, how="semi"
    )
    frozen = long.join(
        described.filter(pl.col("close_snap").is_not_null()).select(*KEY, "close_snap"),
        on=KEY,
    ).filter(pl.col("snap") == pl.col("close_snap"))
    grid = (
        described.filter(pl.col("close_snap").is_not_null())
        .join(pl.DataFrame({"snap": list(range(last + 1))}), how="cross")
        .filter(pl.col("snap") >= pl.col("close_snap"))
        .join(long.select(*KEY, "snap", *VALUES), on=[*KEY, "snap"], how="left")
        .with_columns(pl.col(v).fill_null(0) for v in VALUES)
        .sort("snap")
        .with_columns(pl.col(v).shift(-1).over(KEY) - pl.col(v) for v in VALUES)
        .filter((pl.col("snap") < last) & pl.any_horizontal(pl.col(v) != 0 for v in VALUES))
    )
    grid = grid.with_columns(
        until=pl.col("snap").replace_strict(dict(enumerate(seqs[1:])), default=None, return_dtype=pl.Int64)
    )
    found = find(grid.select(*bookings.SALE, "snap", "until").unique())
    grid = grid.join(found, on=[*bookings.SALE, "snap", "until"], how="left", nulls_equal=True).with_columns(
        floor=period_of(pl.col("cause_at"))
    )
    grid = grid.join(_months(close_at, seqs, grid), on=["line_period", "snap", "floor"], nulls_equal=True)
    month_start = (pl.col("month") + "-01").str.to_datetime("%Y-%m-%d", time_unit="us", time_zone="UTC")
    adjustments = (
        grid.group_by(*KEY, "month", "cause_found", "cause_at")
        .agg(pl.col(v).sum() for v in VALUES)
        .filter(pl.any_horizontal(pl.col(v) != 0 for v in VALUES))
        .join(described.drop("close_snap", "line_period"), on=KEY)
        .with_columns(
            kind=pl.when(pl.col("kind") == "clawback")
            .then(pl.lit("clawback"))
            .otherwise(pl.lit("adjustment")),
            cause=pl.coalesce("cause_found", "cause"),
            period=pl.col("month"),
            adjusts=pl.col("transaction_id"),
            dated_at=pl.max_horizontal("dated_at", month_start, "cause_at"),
        )
        .select(columns)
    )
    return pl.concat(
        [open_lines.select(columns), frozen.select(columns), adjustments],
        how="vertical_relaxed",
    )
