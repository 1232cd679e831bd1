"""Bookings: what finance acted on is a fact of the log, and never changes. Pure.

Two kinds of raw rows carry the ledger's facts (appended by ingest/engineering.py):

- `booking` (one per sale and booking run; `transaction_id` = the sale's transaction id, so an
  incremental run's closure reaches the sale through it; body `{"sale_id", "as_of", "lines"}`):
  the reconciler (api/jobs.py) books every line it shows `approved` that no booking holds yet —
  a commission line whose holding period ended (not held, not void, not fully refunded) and every
  adjustment or clawback line — with the values it shows, as of log position `as_of` (the run's
  high water seq). A booked line is read back from its booking, whatever the log says later.
- `commission_action` (`transaction_id` = the sale's; body `{"action": hold | release | void,
  "sale_id", "reason", "by"}`): finance holds, releases or voids a sale's unpaid lines.

"Later" is the log's order (`seq`), never a timestamp. For a sale with booked lines, the lines
are the booked ones, plus, where what the log implies now (the ledger's lines, reconcile/ledger.py,
summed per partner) differs from what was booked (summed the same way), one line per partner
holding the difference: a `clawback` when the partner keeps the sale and the difference is a
refund, else an `adjustment` (a partner change is a negative line for the booked partner and a
positive one for the new one). Such a line is dated when the row that caused it was logged (its
`received_at`, month `period`) and names it as `cause` (its event id): of the rows after the
booking's `as_of` (later in the log) that bear on the sale, the one logged last (by
`received_at`, then event id, so that rows arriving in another order between two bookings name
the same one). A row bears on a sale when it is one of its records or refunds (sharing one of
its ids), a lead or click of its customer (customer key, email, click id, processor customer), an
action on it, or a metadata fix, backfill or terms change of its program. Until the next booking
run books it, it may still change in place; a sale without booked lines keeps its ledger lines,
which change in place until booked.

The lines bookings apply to are the ledger's with closed months applied (reconcile/periods.py),
so a booking holds what was shown. A self-hosted sale booked before its processor record came
keeps its id: the connect record wins (doubles.py) but the sale it forms is named after the
booked one (`kept_ids`), so its booked lines stay and the record's changes are new lines.

Actions, in log order, give each sale a state: `hold` -> held, `release` -> released (a
self-referral's hold is lifted too), `void` -> void (final). A held sale's unbooked and booked
lines not in a payout batch are `held`; a void sale's are `void`; neither is ever booked as
approved or batched, and their platform fee is held or void with them (reports count only what
is neither). Lines already in a batch keep the batch's status (reconcile/payouts.py).
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from ingest.actions import BOOKED_FIELDS
from reconcile.schema import ENGINE, UTC, first_open, norm_email, period_of

BOOKING = "booking"
ACTION = "commission_action"
KINDS = (BOOKING, ACTION)
# Rows the reconciler writes of what it showed (payment bookings, reconcile/periods.py close
# bookings): facts of the log, but never a cause of a change.
BOOKED_KINDS = (BOOKING, "close_booking", "close_booked")
ACTIONS = ("hold", "release", "void")
SALE = ["program_id", "sale_id"]
MONEY = ("amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded")
# What a booking row records of each line (ingest/engineering.py writes them; times as ISO 8601
# strings): the money columns are integers, `self_referral` a boolean, the rest strings.
LINE_FIELDS = BOOKED_FIELDS
LINE_TIMES = ("occurred_at", "available_at", "dated_at")
LINE_STRINGS = tuple(f for f in LINE_FIELDS if f not in (*MONEY, "self_referral", *LINE_TIMES))
LINE_DTYPE = pl.Struct(
    {
        **{name: pl.String for name in LINE_STRINGS},
        **{name: pl.Int64 for name in MONEY},
        "self_referral": pl.Boolean,
        **{name: pl.String for name in LINE_TIMES},
    }
)
_BODY_DTYPE = pl.Struct({"sale_id": pl.String, "as_of": pl.Int64, "lines": pl.List(LINE_DTYPE)})
_ACTION_DTYPE = pl.Struct({"action": pl.String, "sale_id": pl.String, "reason": pl.String, "by": pl.String})
# Ids a sale's own records and refunds may carry in any id column.
_SALE_IDS = ("transaction_id", "invoice_id", "payment_intent_id", "checkout_session_id", "charge_id")
_ROW_IDS = (*_SALE_IDS, "object_id", "subscription_id")
# Program-wide actions that can change any sale's value.
_PROGRAM_KINDS = ("metadata_fix", "backfill", "program_terms", "promo_code")


def _accepted(log: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    return log.filter(
        (pl.col("kind") == kind) & (pl.col("outcome") == "accepted") & pl.col("program_id").is_not_null()
    )


def booked(log: pl.LazyFrame) -> pl.DataFrame:
    """Every booked line: program_id, booked_seq, booking_id, as_of and LINE_FIELDS (times
    parsed), one row per line of every booking row."""
    rows = (
        _accepted(log, BOOKING)
        .select(
            "program_id", "seq", "event_id", "received_at", parsed=pl.col("body").str.json_decode(_BODY_DTYPE)
        )
        .select(
            "program_id",
            booked_seq="seq",
            booked_at=pl.col("received_at").cast(UTC),
            booking_id="event_id",
            as_of=pl.col("parsed").struct.field("as_of"),
            line=pl.col("parsed").struct.field("lines"),
        )
        .explode("line")
        .filter(pl.col("line").is_not_null())
        .unnest("line")
        .with_columns(
            pl.col(name).str.to_datetime(time_unit="us", time_zone="UTC", strict=False).cast(UTC)
            for name in LINE_TIMES
        )
    )
    return rows.collect(engine=ENGINE)


def kept_ids(pairs: pl.DataFrame, books: pl.DataFrame) -> pl.DataFrame:
    """program_id, sale_id, booked_id: the connect sales that keep a booked self-hosted sale's id.

    A self-hosted sale booked before its processor record arrived stays the sale its booked
    lines belong to: the connect record wins as ever (its fields count, doubles.py), but the sale
    it forms keeps the booked sale's id, so the booked lines stay put and what the record changes
    is booked as adjustment lines of that sale. Of several booked self-hosted sales paired with
    one connect sale, the one booked first (then the smallest id) names it."""
    firsts = books.group_by("program_id", "sale_id").agg(first=pl.col("booked_seq").min())
    return (
        pairs.filter(pl.col("kind") == "connect_and_self_hosted")
        .select("program_id", "sale_id", booked_id="duplicate_id")
        .join(firsts.rename({"sale_id": "booked_id"}), on=["program_id", "booked_id"])
        .sort("first", "booked_id")
        .group_by("program_id", "sale_id", maintain_order=True)
        .agg(pl.col("booked_id").first())
    )


def renamed(frame: pl.DataFrame, kept: pl.DataFrame, column: str = "sale_id") -> pl.DataFrame:
    """`frame` with its `column` (a connect sale's id) replaced by the booked id `kept` names."""
    if kept.is_empty():
        return frame
    names = kept.rename({"sale_id": column})
    return (
        frame.join(names, on=["program_id", column], how="left", maintain_order="left")
        .with_columns(pl.coalesce("booked_id", column).alias(column))
        .drop("booked_id")
    )


def actions(log: pl.LazyFrame) -> pl.DataFrame:
    """program_id, sale_id, action_seq, action, reason, by, action_id, acted_at: the finance
    actions of the log (unknown actions left out), in seq order."""
    return (
        _accepted(log, ACTION)
        .select(
            "program_id",
            action_seq="seq",
            action_id="event_id",
            acted_at="received_at",
            parsed=pl.col("body").str.json_decode(_ACTION_DTYPE),
        )
        .unnest("parsed")
        .filter(pl.col("action").is_in(ACTIONS) & pl.col("sale_id").is_not_null())
        .sort("action_seq")
        .collect(engine=ENGINE)
    )


def state_at(acts: pl.DataFrame, before_seq: pl.Expr | None = None) -> pl.DataFrame:
    """program_id, sale_id, hold_state (`held` | `released` | `void`), hold_reason: each sale's
    state after its actions (those with `action_seq` < `before_seq`, a column of `acts`, when
    given)."""
    picked = acts if before_seq is None else acts.filter(pl.col("action_seq") < before_seq)
    return fold(picked, SALE)


def fold(acts: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    voided = (
        acts.filter(pl.col("action") == "void")
        .group_by(by)
        .agg(void_reason=pl.col("reason").first(), void_by=pl.col("by").first())
    )
    last = (
        acts.filter(pl.col("action") != "void")
        .sort("action_seq")
        .group_by(by, maintain_order=True)
        .agg(last=pl.col("action").last(), last_reason=pl.col("reason").last(), last_by=pl.col("by").last())
    )
    both = last.join(voided, on=by, how="full", coalesce=True)
    voided_now = pl.col("void_reason").is_not_null() | pl.col("void_by").is_not_null()
    return both.select(
        *by,
        hold_by=pl.when(voided_now).then(pl.col("void_by")).otherwise(pl.col("last_by")),
        hold_state=pl.when(pl.col("void_reason").is_not_null() | pl.col("void_by").is_not_null())
        .then(pl.lit("void"))
        .when(pl.col("last") == "hold")
        .then(pl.lit("held"))
        .when(pl.col("last") == "release")
        .then(pl.lit("released"))
        .otherwise(pl.lit(None, pl.String)),
        hold_reason=pl.when(pl.col("void_reason").is_not_null() | pl.col("void_by").is_not_null())
        .then(pl.col("void_reason"))
        .otherwise(pl.col("last_reason")),
    ).filter(pl.col("hold_state").is_not_null())


def _clock(now: datetime, since: pl.Expr) -> pl.Expr:
    return pl.when(since <= pl.lit(now, UTC)).then(pl.lit("approved")).otherwise(pl.lit("pending"))


def overlay(
    lines: pl.DataFrame,
    log: pl.LazyFrame,
    sales: pl.DataFrame,
    now: datetime,
    books: pl.DataFrame,
    closed: pl.DataFrame,
) -> pl.DataFrame:
    """The ledger `lines` (reconcile/ledger.py, one pass over the log) with the log's bookings
    (`books`, `booked(log)`) and finance actions applied (the module docstring): columns of
    `lines` plus `booked_seq` (null for a line no booking holds), `status_reason` and `status_by`
    (why the sale's last finance action was taken, and by whom). `closed`: program_id, period,
    close_seq (reconcile/periods.py `closes`): a new line never lands in a month closed before
    its cause was logged, but in the first one still open then."""
    acts = actions(log)
    lines = lines.with_columns(booked_seq=pl.lit(None, pl.Int64), booked_at=pl.lit(None, UTC))
    if not books.is_empty():
        lines = _with_books(lines, books, log, sales, now, closed)
    return apply_actions(lines, acts, now, closed)


def _with_books(
    lines: pl.DataFrame,
    books: pl.DataFrame,
    log: pl.LazyFrame,
    sales: pl.DataFrame,
    now: datetime,
    closed: pl.DataFrame,
) -> pl.DataFrame:
    columns = lines.columns
    keyed = books.select(SALE).unique()
    free = lines.join(keyed, on=SALE, how="anti")
    implied = lines.join(keyed, on=SALE, how="semi")
    frozen = books.select(
        *(c for c in columns if c not in ("booked_seq", "booked_at", "status")),
        "booked_seq",
        "booked_at",
        status=pl.lit("approved"),
    )
    per_partner = ["program_id", "sale_id", "partner_code"]
    now_sum = implied.group_by(per_partner).agg(
        *(pl.col(m).sum().alias(f"n_{m}") for m in MONEY), n_self=pl.col("self_referral").any()
    )
    was_sum = books.group_by(per_partner).agg(*(pl.col(m).sum().alias(f"b_{m}") for m in MONEY))
    diff = (
        now_sum.join(was_sum, on=per_partner, how="full", coalesce=True, nulls_equal=True)
        .with_columns(pl.col(f"{p}_{m}").fill_null(0) for m in MONEY for p in ("n", "b"))
        .with_columns(
            kept=pl.col("b_amount").is_not_null(),
            **{m: pl.col(f"n_{m}") - pl.col(f"b_{m}") for m in MONEY},
        )
        .filter(pl.any_horizontal(pl.col(m) != 0 for m in MONEY))
    )
    if diff.is_empty():
        return pl.concat([free, frozen.select(columns)], how="vertical_relaxed")
    both_sides = was_sum.select(per_partner).join(
        now_sum.select(per_partner), on=per_partner, nulls_equal=True
    )
    diff = diff.join(
        both_sides.with_columns(same=pl.lit(True)), on=per_partner, how="left", nulls_equal=True
    ).with_columns(same=pl.col("same").fill_null(False))
    as_of = books.group_by(SALE).agg(as_of=pl.col("as_of").max())
    info = (
        books.sort("booked_seq")
        .group_by(SALE)
        .agg(*(pl.col(c).first() for c in ("transaction_id", "currency", "occurred_at", "sale_period")))
    )
    wanted = diff.select(SALE).unique().join(as_of, on=SALE)
    found = causes(wanted, log, sales)
    changes = (
        diff.join(info, on=SALE)
        .join(wanted, on=SALE)
        .join(found, on=SALE, how="left")
        .with_columns(
            cause_at=pl.col("cause_at").fill_null(pl.lit(now, UTC)),
            cause_seq=pl.col("cause_seq").fill_null(pl.lit(None, pl.Int64)),
            cause=pl.col("cause").fill_null(pl.format("after {}", pl.col("as_of"))),
        )
        .select(
            "program_id",
            "sale_id",
            "transaction_id",
            "partner_code",
            kind=pl.when(pl.col("same") & (pl.col("refunded") != 0))
            .then(pl.lit("clawback"))
            .otherwise(pl.lit("adjustment")),
            cause="cause",
            adjusts="transaction_id",
            period=period_of(pl.col("cause_at")),
            sale_period="sale_period",
            currency="currency",
            **{m: m for m in MONEY},
            status=_clock(now, pl.col("cause_at")),
            self_referral=pl.col("n_self").fill_null(False),
            occurred_at="occurred_at",
            available_at="cause_at",
            dated_at="cause_at",
            booked_seq=pl.lit(None, pl.Int64),
            booked_at=pl.lit(None, UTC),
            cause_seq="cause_seq",
        )
    )
    changes = _outside_closed(changes, closed, now).drop("cause_seq")
    extra = [c for c in columns if c not in changes.columns]
    changes = changes.with_columns(pl.lit(None).alias(c) for c in extra)
    return pl.concat([free, frozen.select(columns), changes.select(columns)], how="vertical_relaxed")


def _outside_closed(changes: pl.DataFrame, closed: pl.DataFrame, now: datetime) -> pl.DataFrame:
    """`changes` moved out of months closed before their cause was logged (a clock behind, or a
    stamp from a body): into the first month still open then, dated at its start."""
    if closed.is_empty() or changes.is_empty():
        return changes
    shut: dict[tuple[str, str], int] = {
        (program, period): seq
        for program, period, seq in closed.select("program_id", "period", "close_seq").iter_rows()
    }
    moved: list[dict[str, object]] = []
    for program, period, seq in changes.select("program_id", "period", "cause_seq").unique().iter_rows():

        def closed_before(month: str, program: str = program, seq: int | None = seq) -> bool:
            return (program, month) in shut and (seq is None or shut[(program, month)] < seq)

        month = first_open(period, closed_before)
        moved.append({"program_id": program, "period": period, "cause_seq": seq, "month": month})
    months = pl.DataFrame(
        moved,
        schema={"program_id": pl.String, "period": pl.String, "cause_seq": pl.Int64, "month": pl.String},
    )
    start = (pl.col("month") + "-01").str.to_datetime("%Y-%m-%d", time_unit="us", time_zone="UTC")
    return (
        changes.join(months, on=["program_id", "period", "cause_seq"], how="left", nulls_equal=True)
        .with_columns(
            period=pl.col("month"),
            dated_at=pl.max_horizontal("dated_at", start),
            available_at=pl.max_horizontal("available_at", start),
        )
        .with_columns(status=_clock(now, pl.col("dated_at")))
        .drop("month")
    )


def causes(
    wanted: pl.DataFrame, log: pl.LazyFrame, sales: pl.DataFrame, by: tuple[str, ...] = ()
) -> pl.DataFrame:
    """SALE, *by, cause, cause_at: per row of `wanted` (SALE, *by, as_of and, when given, `until`),
    the latest accepted row after its `as_of` (and before `until`, where not null) that bears on
    its sale (the module docstring)."""
    lowest = wanted.get_column("as_of").min()
    low = lowest if isinstance(lowest, int) else 0
    later = (
        log.filter(
            (pl.col("seq") > low) & (pl.col("outcome") == "accepted") & pl.col("program_id").is_not_null()
        )
        .filter(~pl.col("kind").is_in(BOOKED_KINDS))
        .select(
            "program_id",
            "seq",
            "kind",
            "event_id",
            "received_at",
            *_ROW_IDS,
            "customer_key",
            "processor_customer_id",
            "click_id",
            email_norm=norm_email(pl.col("email")),
            action_sale=pl.when(pl.col("kind") == ACTION)
            .then(pl.col("body").str.json_path_match("$.sale_id"))
            .otherwise(pl.lit(None, pl.String)),
        )
        .collect(engine=ENGINE)
    )
    mine = wanted.join(
        sales.select(
            *SALE,
            *_SALE_IDS,
            "customer_key",
            "processor_customer_id",
            "click_id",
            email_norm=norm_email(pl.col("email")),
        ),
        on=SALE,
        how="left",
    )
    if "until" not in mine.columns:
        mine = mine.with_columns(until=pl.lit(None, pl.Int64))
    carried = (*SALE, *by, "as_of", "until")
    keys = pl.concat(
        [
            mine.select(*carried, value=pl.col(c).cast(pl.String), link=pl.lit(link))
            for c, link in [
                *((c, "id") for c in _SALE_IDS),
                *((c, c) for c in ("customer_key", "processor_customer_id", "click_id", "email_norm")),
                ("sale_id", "action"),
            ]
        ]
    ).drop_nulls("value")
    values = pl.concat(
        [
            *(
                later.select("program_id", "seq", "event_id", "received_at", value=c, link=pl.lit("id"))
                for c in _ROW_IDS
            ),
            *(
                later.select("program_id", "seq", "event_id", "received_at", value=c, link=pl.lit(c))
                for c in ("customer_key", "processor_customer_id", "click_id", "email_norm")
            ),
            later.select(
                "program_id", "seq", "event_id", "received_at", value="action_sale", link=pl.lit("action")
            ),
        ]
    ).drop_nulls("value")
    linked = keys.join(values, on=["program_id", "value", "link"]).select(
        *carried, "seq", "event_id", "received_at"
    )
    program_wide = (
        mine.select(carried)
        .join(
            later.filter(pl.col("kind").is_in(_PROGRAM_KINDS)).select(
                "program_id", "seq", "event_id", "received_at"
            ),
            on="program_id",
        )
        .select(*carried, "seq", "event_id", "received_at")
    )
    return (
        pl.concat([linked, program_wide])
        .filter((pl.col("seq") > pl.col("as_of")) & (pl.col("seq") < pl.col("until")).fill_null(True))
        .sort("received_at", "event_id", nulls_last=False)
        .group_by(*SALE, *by, "until")
        .agg(
            cause=pl.col("event_id").last(),
            cause_at=pl.col("received_at").last(),
            cause_seq=pl.col("seq").last(),
        )
        .drop("until" if "until" not in wanted.columns else [])
    )


FROZEN = "frozen_seq"  # (internal column) actions at or after this seq do not touch the line
WORDS = {"hold": "held", "release": "released", "void": "void"}


def apply_actions(
    lines: pl.DataFrame, acts: pl.DataFrame, now: datetime, closed: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Statuses after the finance actions: held / void sales' lines, released self-referrals.

    `closed` (program_id, period, close_seq; reconcile/periods.py `closes`): a booked approved
    line whose month is closed never moves (CONTRACT 15). From the later of its booking and its
    month's close (its `frozen_seq`, a column of the result, null for other lines) it keeps the
    status the earlier actions gave it, and each later action that changes whether it is owed
    books a line of its own (`compensations`): a hold or void of an owed line minus its values,
    a release of a held one plus them, in the first month open when the action was logged.
    Those lines are booked by the action itself and no action touches them (`frozen_seq` -1)."""
    lines = _frozen(lines, closed)
    if acts.is_empty():
        return lines.with_columns(status_reason=pl.lit(None, pl.String), status_by=pl.lit(None, pl.String))
    row = "__line"
    indexed = lines.with_row_index(row)
    applying = (
        indexed.select(row, *SALE, FROZEN)
        .join(acts, on=SALE)
        .filter(pl.col(FROZEN).is_null() | (pl.col("action_seq") < pl.col(FROZEN)))
    )
    states = fold(applying, [row])
    joined = indexed.join(states, on=row, how="left")
    acted = (
        joined.with_columns(
            status=pl.when(pl.col("hold_state") == "void")
            .then(pl.lit("void"))
            .when(pl.col("hold_state") == "held")
            .then(pl.lit("held"))
            .when(
                (pl.col("hold_state") == "released")
                & (pl.col("status") == "held")
                & pl.col("booked_seq").is_null()
            )
            .then(_clock(now, pl.col("available_at")))
            .otherwise(pl.col("status")),
            status_reason=pl.col("hold_reason"),
            status_by=pl.col("hold_by"),
        )
        .sort(row)
        .drop("hold_state", "hold_reason", "hold_by", row)
    )
    extra = compensations(acted, acts, closed, now)
    if extra.is_empty():
        return acted
    return pl.concat([acted, extra.select(acted.columns)], how="vertical_relaxed")


def _frozen(lines: pl.DataFrame, closed: pl.DataFrame | None) -> pl.DataFrame:
    if FROZEN in lines.columns:
        return lines
    if closed is None or closed.is_empty() or lines.is_empty():
        return lines.with_columns(pl.lit(None, pl.Int64).alias(FROZEN))
    shut = closed.select("program_id", "period", "close_seq")
    return (
        lines.join(shut, on=["program_id", "period"], how="left")
        .with_columns(
            pl.when(pl.col("booked_seq").is_not_null() & pl.col("close_seq").is_not_null())
            .then(pl.max_horizontal("booked_seq", "close_seq"))
            .otherwise(pl.lit(None, pl.Int64))
            .alias(FROZEN)
        )
        .drop("close_seq")
    )


def compensations(
    lines: pl.DataFrame, acts: pl.DataFrame, closed: pl.DataFrame | None, now: datetime
) -> pl.DataFrame:
    """The lines finance's actions book for lines frozen by a close (`apply_actions`): kind
    `adjustment`, `cause` the action's id, booked by it (`booked_seq` its seq, `booked_at` its
    time), status `approved`, reason the action's (`held: fraud`, `released`, `void: ...`)."""
    frozen = lines.filter(pl.col(FROZEN).is_not_null() & (pl.col(FROZEN) >= 0))
    if frozen.is_empty() or acts.is_empty():
        return lines.clear()
    later = (
        frozen.select(*SALE, FROZEN)
        .unique()
        .join(acts, on=SALE)
        .filter(pl.col("action_seq") > pl.col(FROZEN))
    )
    if later.is_empty():
        return lines.clear()
    frozen = frozen.join(later.select(*SALE, FROZEN).unique(), on=[*SALE, FROZEN], how="semi")
    by_line: dict[tuple[str, str, int], list[dict[str, object]]] = {}
    for act in later.sort("action_seq").iter_rows(named=True):
        by_line.setdefault((act["program_id"], act["sale_id"], act[FROZEN]), []).append(act)
    shut: dict[tuple[str, str], int] = {}
    if closed is not None:
        shut = {(p, m): q for p, m, q in closed.select("program_id", "period", "close_seq").iter_rows()}
    out: list[dict[str, object]] = []
    for line in frozen.iter_rows(named=True):
        todo = by_line.get((line["program_id"], line["sale_id"], line[FROZEN]))
        if not todo:
            continue
        state = "held" if line["status"] == "held" else "void" if line["status"] == "void" else "owed"
        for act in todo:
            action, sign = str(act["action"]), 0
            if state == "owed" and action in ("hold", "void"):
                sign = -1
            elif state == "held" and action == "release":
                sign = 1
            if state != "void":
                state = {"hold": "held", "release": "owed", "void": "void"}[action]
            if not sign:
                continue
            seq, at = int(str(act["action_seq"])), act["acted_at"]
            assert isinstance(at, datetime)

            def closed_before(m: str, program: str = line["program_id"], seq: int = seq) -> bool:
                return (program, m) in shut and shut[(program, m)] < seq

            month = first_open(f"{at:%Y-%m}", closed_before)
            start = datetime.fromisoformat(f"{month}-01T00:00:00+00:00")
            dated = max(at, start)
            word = WORDS[action]
            out.append(
                {
                    **line,
                    **{m: sign * int(line[m] or 0) for m in MONEY},
                    "kind": "adjustment",
                    "cause": act["action_id"],
                    "adjusts": line["transaction_id"],
                    "period": month,
                    "status": "approved" if dated <= now else "pending",
                    "self_referral": False,
                    "available_at": dated,
                    "dated_at": dated,
                    "booked_seq": seq,
                    "booked_at": at,
                    "status_reason": f"{word}: {act['reason']}" if act["reason"] else word,
                    "status_by": act["by"],
                    FROZEN: -1,
                }
            )
    if not out:
        return lines.clear()
    return pl.DataFrame(out, schema=lines.schema)


def due(lines: pl.DataFrame) -> pl.DataFrame:
    """The lines a booking run books: shown `approved`, held by no booking, in no batch."""
    return lines.filter(
        (pl.col("status") == "approved") & pl.col("booked_seq").is_null() & pl.col("payout_id").is_null()
    )
