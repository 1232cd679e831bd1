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
extra.

A close is a booking (issue #48): the run after it (api/jobs.py `_book_closes`) values the log
before the close once (`to_book`) and appends what it shows of the months closed by then:
per sale, a `close_booking` row (`transaction_id` the sale's, so an incremental run's closure
reaches it; body `{"booking_id", "close_seq", "sale_id", "lines", "gone"}`) holding the lines
that changed since the close before (or are new to the closed months; their status kept as
`standing`: `held`, `reversed`, or `clock` for approved or pending by the run's time), and the
keys no longer there; then one `close_booked` row per close (`{"booking_id", "close_seq"}`),
which makes the booking whole. Every later run reads a booked close's snapshot back from the
log (per key, the last booking up to that close) instead of valuing the log before it again, so
a close costs a run the lines it froze and nothing more. Rows of a booking whose marker never
came (a crash) are never read: the next run books the close again, under a new id. Only the
closes of a program up to its first unbooked one are read back; the rest are valued on the
log's prefixes (the same numbers, `_snapshot_lines`), all of them in one pass: each prefix is
a program of its own in one log (`stacked`: the prefix's rows under an alias of their program,
one per close), and the pass's lines are split back by alias. Either way a snapshot holds only
the lines of months closed by its close (`_closed_only`), the only ones a composition reads.
The composition itself (`_compose`) works on every program at once, on points: a key's line at
a snapshot holds until the key's next point, so a booked close costs the keys it changed.

Measured (bench/closes.py; 27,000 events, 99 closes in 9 programs, 2 cores, 2026-12-02): a
full reconcile run 0.68 s against 0.55 s without the closes (1.24x, the issue's target of 1.10x
not met; the previous release: 1.06 s against 0.53 s). What the closes still cost a run:
finding the causes of the changes after a close (`bookings.causes`, about 20 ms), decoding
the bookings (14 ms), the sales and refunds logged after their month closed (latecomers.py,
refunds.py: 23 ms, as before), the composition (15 ms), reading the bookings (30 ms).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import polars as pl

from reconcile import bookings
from reconcile.schema import ENGINE, UTC, first_open, next_month, period_of

VALUES = ("amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded")
KEY = ("sale_id", "partner_code", "kind", "cause")
PERIOD_PATTERN = r"^\d{4}-(0[1-9]|1[0-2])$"

# A close is booked (api/jobs.py, after the run that follows it): `close_booking` rows (one per
# sale, `transaction_id` the sale's, so an incremental run's closure reaches it) hold the lines
# of its snapshot that changed since the close before, `close_booked` (one per close, an
# engineer row every run reads) says the booking `booking_id` is whole.
SNAPSHOT = "close_booking"
MARK = "close_booked"
KINDS = (SNAPSHOT, MARK)
_GONE = pl.Struct(
    {"partner_code": pl.String, "kind": pl.String, "cause": pl.String, "transaction_id": pl.String}
)
_SNAPSHOT_BODY = pl.Struct(
    {
        "booking_id": pl.String,
        "close_seq": pl.Int64,
        "sale_id": pl.String,
        "lines": pl.List(
            pl.Struct({**{f.name: f.dtype for f in bookings.LINE_DTYPE.fields}, "standing": pl.String})
        ),
        "gone": pl.List(_GONE),
    }
)
_MARK_BODY = pl.Struct({"booking_id": pl.String, "close_seq": pl.Int64})

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


def apply(
    log: pl.LazyFrame, current: pl.DataFrame, compute: Compute, sales: pl.DataFrame, now: datetime
) -> pl.DataFrame:
    """Commission lines with closed months frozen and corrections as adjustments."""
    closed = closes(log)
    if closed.is_empty():
        return current
    snaps = _snaps(closed, log)
    programs = closed.get_column("program_id").unique()
    columns = current.columns
    lasts = snaps.group_by("program_id").agg(last=pl.len().cast(pl.Int64))
    mine = current.filter(pl.col("program_id").is_in(programs.implode()))
    now_rows = mine.join(lasts, on="program_id").select(*columns, snap="last", gone=pl.lit(False))
    if snaps.get_column("booked").all():
        # every close booked: its booking holds just the lines that changed (and those gone)
        booked = (
            booked_lines(log, snaps)
            .join(snaps.select("program_id", "snap", close_seq="seq"), on=["program_id", "close_seq"])
            .with_columns(status=_status(now))
        )
        missing = [c for c in columns if c not in booked.columns]
        booked = booked.with_columns(pl.lit(None).alias(c) for c in missing).select(
            *columns, pl.col("snap").cast(pl.Int64), "gone"
        )
        points = pl.concat([booked, now_rows], how="vertical_relaxed")
        points = pl.concat([points, _gone_now(points, lasts)], how="diagonal_relaxed")
    else:
        aliases = snaps.select("alias", "program_id", "snap")
        past = (
            _snapshot_lines(log, snaps, closed, compute, columns, now)
            .rename({"program_id": "alias"})
            .join(aliases, on="alias")
            .drop("alias")
            .select(*columns, pl.col("snap").cast(pl.Int64), gone=pl.lit(False))
        )
        points = pl.concat([past, now_rows], how="vertical_relaxed")
        points = pl.concat([points, _gone_after(points, lasts)], how="diagonal_relaxed")
    own = log.join(programs.to_frame().lazy(), on="program_id", how="semi")
    composed = _compose(points, mine, closed, snaps.select("program_id", "snap", "seq"), lasts, own, sales)
    return pl.concat(
        [current.filter(~pl.col("program_id").is_in(programs.implode())), composed], how="vertical_relaxed"
    )


def _gone_after(points: pl.DataFrame, lasts: pl.DataFrame) -> pl.DataFrame:
    """Of snapshots given whole (every line each holds): a `gone` point where a key is missing
    from the snapshot after one that held it."""
    pkey = ["program_id", *KEY]
    present = points.select(*pkey, "snap")
    return (
        present.with_columns(pl.col("snap") + 1)
        .join(lasts, on="program_id")
        .filter(pl.col("snap") <= pl.col("last"))
        .drop("last")
        .join(present, on=[*pkey, "snap"], how="anti", nulls_equal=True)
        .with_columns(gone=pl.lit(True))
    )


def _gone_now(points: pl.DataFrame, lasts: pl.DataFrame) -> pl.DataFrame:
    """Of booked points (a key's line holds from its point until its next one): a `gone` point
    in the current ledger (`last`) for each key held at its last booked point and not there now."""
    pkey = ["program_id", *KEY]
    return (
        points.join(lasts, on="program_id")
        .sort("snap")
        .group_by(pkey)
        .agg(pl.col("snap").last(), pl.col("gone").last(), pl.col("last").first())
        .filter((pl.col("snap") < pl.col("last")) & ~pl.col("gone"))
        .select(*pkey, snap="last", gone=pl.lit(True))
    )


def unbooked(log: pl.LazyFrame) -> tuple[str, ...]:
    """The programs with a close no booking holds yet (`to_book` books them), sorted."""
    closed = closes(log)
    if closed.is_empty():
        return ()
    pending = _snaps(closed, log).filter(~pl.col("booked")).get_column("program_id").unique()
    return tuple(sorted(pending.to_list()))


def _snaps(closed: pl.DataFrame, log: pl.LazyFrame) -> pl.DataFrame:
    """program_id, seq, snap, alias, booking_id, booked: each program's closes in log order
    (`snap` numbers them); `booking_id` the booking its last marker names, `booked` whether it
    and every earlier close of the program are booked (a booking is a difference from the one
    before: only a booked prefix can be read back)."""
    marked = _marked(log)
    return (
        closed.select("program_id", seq="close_seq")
        .unique()
        .join(marked, left_on=["program_id", "seq"], right_on=["program_id", "close_seq"], how="left")
        .sort("program_id", "seq")
        .with_columns(
            snap=pl.int_range(pl.len()).over("program_id"),
            booked=pl.col("booking_id")
            .is_not_null()
            .cast(pl.Int8)
            .cum_min()
            .over("program_id")
            .cast(pl.Boolean),
        )
        .with_columns(alias=pl.col("program_id") + ALIAS + pl.col("snap").cast(pl.String))
    )


def _marked(log: pl.LazyFrame) -> pl.DataFrame:
    """program_id, close_seq, booking_id: the booking of each booked close (its last marker)."""
    return (
        log.filter(
            (pl.col("kind") == MARK) & (pl.col("outcome") == "accepted") & pl.col("program_id").is_not_null()
        )
        .select("program_id", "seq", parsed=pl.col("body").str.json_decode(_MARK_BODY))
        .select(
            "program_id",
            "seq",
            close_seq=pl.col("parsed").struct.field("close_seq"),
            booking_id=pl.col("parsed").struct.field("booking_id"),
        )
        .drop_nulls(["close_seq", "booking_id"])
        .sort("seq")
        .group_by("program_id", "close_seq")
        .agg(pl.col("booking_id").last())
        .collect(engine=ENGINE)
    )


def _snapshot_lines(
    log: pl.LazyFrame,
    snaps: pl.DataFrame,
    closed: pl.DataFrame,
    compute: Compute,
    columns: list[str],
    now: datetime,
) -> pl.DataFrame:
    """The lines of every close's snapshot that belong to months closed by then, each under its
    alias (as `program_id`): read back from the bookings of booked closes, valued from the log's
    prefixes for the others (one pass for all of them)."""
    todo = snaps.filter(~pl.col("booked"))
    done = snaps.filter(pl.col("booked"))
    parts = []
    if not todo.is_empty():
        valued = compute(stacked(log, todo), todo.select("alias", "program_id"))
        parts.append(_closed_only(valued, todo, closed).select(columns))
    if not done.is_empty():
        parts.append(_read_back(log, done, columns, now))
    if not parts:
        return pl.DataFrame(schema={c: pl.String for c in columns})
    return pl.concat(parts, how="vertical_relaxed")


def _closed_only(lines: pl.DataFrame, snaps: pl.DataFrame, closed: pl.DataFrame) -> pl.DataFrame:
    """`lines` (under their snapshot's alias) of the months closed at their snapshot's close."""
    at = snaps.select("alias", "program_id", at="seq")
    return (
        lines.rename({"program_id": "alias"})
        .join(at, on="alias")
        .join(closed, on=["program_id", "period"])
        .filter(pl.col("close_seq") <= pl.col("at"))
        .with_columns(program_id=pl.col("alias"))
        .drop("alias", "at", "close_seq")
    )


def booked_lines(log: pl.LazyFrame, snaps: pl.DataFrame) -> pl.DataFrame:
    """program_id, close_seq, KEY, the other line fields and `gone`: every line the bookings of
    the closes of `snaps` (program_id, seq, booking_id) hold, and every line they say is gone."""
    books = (
        log.filter(
            (pl.col("kind") == SNAPSHOT)
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
        )
        .select("program_id", parsed=pl.col("body").str.json_decode(_SNAPSHOT_BODY))
        .select(
            "program_id",
            close_seq=pl.col("parsed").struct.field("close_seq"),
            booking_id=pl.col("parsed").struct.field("booking_id"),
            sale=pl.col("parsed").struct.field("sale_id"),
            lines=pl.col("parsed").struct.field("lines"),
            gone=pl.col("parsed").struct.field("gone"),
        )
        .join(
            snaps.lazy().select("program_id", "booking_id", close_seq="seq"),
            on=["program_id", "close_seq", "booking_id"],
            how="semi",
        )
        .collect(engine=ENGINE)
    )
    held = (
        books.select("program_id", "close_seq", line="lines")
        .explode("line")
        .filter(pl.col("line").is_not_null())
        .unnest("line")
        .with_columns(
            pl.col(name).str.to_datetime(time_unit="us", time_zone="UTC", strict=False).cast(UTC)
            for name in bookings.LINE_TIMES
        )
        .with_columns(gone=pl.lit(False))
    )
    gone = (
        books.select("program_id", "close_seq", "sale", line="gone")
        .explode("line")
        .filter(pl.col("line").is_not_null())
        .unnest("line")
        .rename({"sale": "sale_id"})
        .with_columns(gone=pl.lit(True))
    )
    return pl.concat([held, gone], how="diagonal_relaxed")


def standing(status: pl.Expr) -> pl.Expr:
    """What a booking keeps of a line's status: `held` or `reversed`, else `clock` (approved or
    pending, by its available_at and the run's time: `_status`)."""
    return pl.when(status.is_in(["held", "reversed"])).then(status).otherwise(pl.lit("clock"))


def _status(now: datetime) -> pl.Expr:
    """A read-back line's status as its snapshot valued at `now` shows it (reconcile/ledger.py)."""
    clock = (
        pl.when(pl.lit(now, UTC) >= pl.col("available_at"))
        .then(pl.lit("approved"))
        .otherwise(pl.lit("pending"))
    )
    return pl.when(pl.col("standing") == "clock").then(clock).otherwise(pl.col("standing"))


def _read_back(log: pl.LazyFrame, done: pl.DataFrame, columns: list[str], now: datetime) -> pl.DataFrame:
    """The snapshot of each booked close of `done`, under its alias: per line key, what the
    last booking up to that close holds, unless it says the line is gone."""
    held = booked_lines(log, done)
    if "standing" not in held.columns:
        held = held.with_columns(standing=pl.lit(None, pl.String))
    held = held.with_columns(status=_status(now))
    missing = [c for c in columns if c not in held.columns]
    return (
        held.with_columns(pl.lit(None).alias(c) for c in missing)
        .join(done.select("program_id", "alias", at="seq"), on="program_id")
        .filter(pl.col("close_seq") <= pl.col("at"))
        .sort("close_seq")
        .group_by("alias", *KEY)
        .last()
        .filter(~pl.col("gone"))
        .with_columns(program_id=pl.col("alias"))
        .select(columns)
    )


def to_book(log: pl.LazyFrame, compute: Compute, columns: list[str], now: datetime) -> pl.DataFrame:
    """What the closes no booking holds yet book (api/jobs.py appends it, ingest/actions.py
    `close_booking_rows`): program_id, close_seq, the line fields and `gone`, one row per line
    that changed since the close before (or is new to the closed months), and one per line no
    longer there (`gone`); a close with none has a row with null sale_id, so that it is booked
    too. Empty when every close is booked."""
    nothing = pl.DataFrame(schema={"program_id": pl.String, "close_seq": pl.Int64})
    closed = closes(log)
    if closed.is_empty():
        return nothing
    snaps = _snaps(closed, log)
    programs = snaps.filter(~pl.col("booked")).get_column("program_id").unique().to_list()
    if not programs:
        return nothing
    snaps = snaps.filter(pl.col("program_id").is_in(programs))
    first = snaps.filter(~pl.col("booked")).group_by("program_id").agg(first=pl.col("snap").min())
    # every close of these programs: the booked ones are read back (the last one is what the
    # first unbooked one differs from), the others valued
    wanted = snaps.join(first, on="program_id")
    lines = {
        alias: frame.with_columns(standing=standing(pl.col("status")))
        for alias, frame in _snapshot_lines(log, wanted, closed, compute, columns, now)
        .partition_by("program_id", as_dict=True)
        .items()
    }
    fields = [*(c for c in columns if c not in (*KEY, "program_id", "status")), "standing"]
    out = []
    for program, seq, snap, alias, start in (
        wanted.select("program_id", "seq", "snap", "alias", "first").sort("program_id", "snap").iter_rows()
    ):
        if snap < start:
            continue
        before = lines.get((f"{program}{ALIAS}{snap - 1}",)) if snap > 0 else None
        now_ = lines.get((alias,))
        out.append(
            _changes(before, now_, columns, fields).with_columns(
                program_id=pl.lit(program), close_seq=pl.lit(seq, pl.Int64)
            )
        )
    names = ["program_id", "close_seq", *KEY, *fields, "gone"]
    if not out:
        return nothing
    found = pl.concat(out, how="diagonal_relaxed")
    return found.with_columns(pl.lit(None).alias(c) for c in names if c not in found.columns).select(names)


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


def _changes(
    before: pl.DataFrame | None, now: pl.DataFrame | None, columns: list[str], fields: list[str]
) -> pl.DataFrame:
    """The lines of snapshot `now` new or changed since snapshot `before`, those of `before`
    gone (only their key and transaction id), or one empty row when nothing changed."""
    marker = pl.DataFrame({"gone": [False]})
    if now is None and before is None:
        return marker
    shape = (now if now is not None else before).select(*KEY, *fields)  # type: ignore[union-attr]
    was = shape.clear() if before is None else before.select(*KEY, *fields)
    is_ = shape.clear() if now is None else now.select(*KEY, *fields)
    joined = is_.with_columns(here__=pl.lit(True)).join(
        was.with_columns(was__=pl.lit(True)),
        on=KEY,
        how="full",
        coalesce=True,
        nulls_equal=True,
        suffix="__was",
    )
    changed = joined.filter(
        pl.col("here__")
        & (
            pl.col("was__").is_null()
            | pl.any_horizontal(pl.col(f).ne_missing(pl.col(f"{f}__was")) for f in fields)
        )
    ).select(*KEY, *fields, gone=pl.lit(False))
    gone = joined.filter(pl.col("here__").is_null()).select(
        *KEY, transaction_id=pl.col("transaction_id__was"), gone=pl.lit(True)
    )
    found = pl.concat([changed, gone], how="diagonal_relaxed")
    return marker if found.is_empty() else found


def _months(wanted: pl.DataFrame, closed: pl.DataFrame, snaps: pl.DataFrame) -> pl.DataFrame:
    """(program_id, line_period, snap, floor) -> month: the first month from `floor` (at the
    earliest the one after the line's) that was still open at the program's close `snap`."""
    at = {(p, j): seq for p, j, seq in snaps.select("program_id", "snap", "seq").iter_rows()}
    shut_at: dict[str, list[tuple[str, int]]] = {}
    for program, period, seq in closed.select("program_id", "period", "close_seq").iter_rows():
        shut_at.setdefault(program, []).append((period, seq))
    rows: list[dict[str, object]] = []
    for program, line_period, snap, floor in (
        wanted.select("program_id", "line_period", "snap", "floor").unique().iter_rows()
    ):
        shut = {p for p, s in shut_at.get(program, []) if s <= at[(program, snap)]}
        month = first_open(max(next_month(line_period), floor or ""), shut.__contains__)
        rows.append(
            {"program_id": program, "line_period": line_period, "snap": snap, "floor": floor, "month": month}
        )
    return pl.DataFrame(
        rows,
        schema={
            "program_id": pl.String,
            "line_period": pl.String,
            "snap": pl.Int64,
            "floor": pl.String,
            "month": pl.String,
        },
    )


def _compose(
    points: pl.DataFrame,
    current: pl.DataFrame,
    closed: pl.DataFrame,
    snaps: pl.DataFrame,
    lasts: pl.DataFrame,
    log: pl.LazyFrame,
    sales: pl.DataFrame,
) -> pl.DataFrame:
    """The lines of every program with closes, all programs at once. `points`: a key's line at
    snapshot `snap` (j for the close j of its program, `last` for the current ledger, which is
    `current`), holding until the key's next point; `gone` where the key has no line from then
    on. Lazy where it can be (three collects: the changes, whose causes and months are looked
    up, then the lines)."""
    columns = current.columns
    pkey = ["program_id", *KEY]
    lazy_points = points.lazy()
    close_snaps = (
        closed.lazy()
        .join(snaps.lazy(), left_on=["program_id", "close_seq"], right_on=["program_id", "seq"])
        .select("program_id", line_period="period", close_snap="snap")
    )
    # per key: the month and the snapshot it was last seen in (its descriptors are that row's)
    described = (
        lazy_points.filter(~pl.col("gone"))
        .select(*pkey, "snap", "period")
        .sort("snap")
        .group_by(pkey)
        .agg(line_period=pl.col("period").last(), seen=pl.col("snap").last())
        .join(close_snaps, on=["program_id", "line_period"], how="left")
    )
    open_lines = current.lazy().join(
        described.filter(pl.col("close_snap").is_null()).select(pkey), on=pkey, how="semi"
    )
    shut = described.filter(pl.col("close_snap").is_not_null())
    # a closed month's line: the key's point at or before its month's close, unless gone
    frozen = (
        lazy_points.join(shut.select(*pkey, "close_snap"), on=pkey)
        .filter(pl.col("snap") <= pl.col("close_snap"))
        .sort("snap")
        .unique(subset=pkey, keep="last")
        .filter(~pl.col("gone"))
    )
    # each change after the close: a point's values less the key's point before (0 if none or
    # gone), as the change from snapshot j = snap - 1 to snap
    same = pl.all_horizontal(pl.col(k).eq_missing(pl.col(k).shift(1)) for k in pkey)
    grid_plan = (
        lazy_points.join(shut.select(*pkey, "close_snap", "line_period", "seen"), on=pkey)
        .with_columns(pl.when(pl.col("gone")).then(0).otherwise(pl.col(v)).alias(v) for v in VALUES)
        .sort(*pkey, "snap", nulls_last=True)
        .with_columns(
            (pl.col(v) - pl.when(same).then(pl.col(v).shift(1)).otherwise(0)).alias(v) for v in VALUES
        )
        .filter((pl.col("snap") > pl.col("close_snap")) & pl.any_horizontal(pl.col(v) != 0 for v in VALUES))
        .with_columns(pl.col("snap") - 1)
        .select(*pkey, "snap", *VALUES, "close_snap", "line_period", "seen")
        .join(snaps.lazy().select("program_id", "snap", as_of="seq"), on=["program_id", "snap"])
        .join(
            snaps.lazy().select("program_id", snap=pl.col("snap") - 1, until="seq"),
            on=["program_id", "snap"],
            how="left",
        )
    )
    grid, kept = pl.collect_all(
        [grid_plan, pl.concat([open_lines.select(columns), frozen.select(columns)], how="vertical_relaxed")],
        engine=ENGINE,
    )
    if grid.is_empty():
        return kept
    info = (  # the descriptors of the keys with changes: their last row, with their status now
        grid.select(*pkey, "seen")
        .unique()
        .join(
            points.filter(~pl.col("gone")).drop(*VALUES, "period", "status", "gone"),
            left_on=[*pkey, "seen"],
            right_on=[*pkey, "snap"],
        )
        .join(current.select(*pkey, "status"), on=pkey, how="left")
        .with_columns(status=pl.col("status").fill_null("reversed"))
        .drop("seen")
    )
    wanted = grid.select(*bookings.SALE, "snap", "until", "as_of").unique()
    found = (
        bookings.causes(wanted, log, sales, by=("snap",))
        .rename({"cause": "cause_found"})
        .select(*bookings.SALE, "snap", "until", "cause_found", "cause_at")
    )
    grid = grid.join(found, on=[*bookings.SALE, "snap", "until"], how="left", nulls_equal=True).with_columns(
        floor=period_of(pl.col("cause_at"))
    )
    grid = grid.join(
        _months(grid, closed, snaps), on=["program_id", "line_period", "snap", "floor"], nulls_equal=True
    )
    month_start = (pl.col("month") + "-01").str.to_datetime("%Y-%m-%d", time_unit="us", time_zone="UTC")
    adjustments = (
        grid.lazy()
        .group_by(*pkey, "month", "cause_found", "cause_at")
        .agg(pl.col(v).sum() for v in VALUES)
        .filter(pl.any_horizontal(pl.col(v) != 0 for v in VALUES))
        .join(info.lazy(), on=pkey)
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
        .collect(engine=ENGINE)
    )
    return pl.concat([kept, adjustments], how="vertical_relaxed")
