"""Payout batches: which ledger lines each batch pays, decided from the log alone. Pure.

A `payout_batch` row of a program (appended by ingest/actions.py under the reconciler's run lock,
after a run over the whole log) is a snapshot: its body records the cut-off (`up_to`), who made
it (`by`), the payout minimum then (`payout_minimum`) and, under `snapshot`, every row it pays
(`rows`: partner, currency, the amount sent and the payee's details as they were) and every
partner it could not pay (`not_paid`, with the reason). What a batch pays is that record, never
recomputed: the reports render its files from it (reports/payouts.py).

Which lines a batch holds is decided here, line by line, so that the ledger of a customer depends
on that customer's rows and the engineer actions only (what incremental runs rely on). A line of
the program is *free* at a log position when no live batch holds it then. The first batch (by
`seq`) that finds a line free and that

- was made after the line was booked (`booked_seq` < the batch's `seq`), while the line's sale
  was neither held nor void (finance actions before the batch, reconcile/bookings.py),
- has a cut-off after the line's date (`dated_at` before the day after `up_to`, UTC),
- pays the line's partner in the line's currency (a row of its snapshot),

holds it (a line of amount zero is never held). A batch lets its lines go when it is cancelled
(`payout_cancel` of an open batch: the first one counts; a cancel after the batch was paid does
nothing), and a paid batch lets one row's lines go when that row fails (`payout_row_failed`
after the payment, naming partner and currency; the first one counts). A line let go is free
again from the cancel or failure on, and a later batch may hold it. The same rule made the
snapshot: the batch's rows sum the free approved lines then, so a row's amount is the sum of
the lines it holds (less what `rounding` carries: below).

A row may pay less than its lines' sum when the service cannot send the minor unit of the
currency (PayPal pays HUF and TWD in whole units, reports/payfiles.py): the snapshot row says so
(`rounding`, the minor units left unpaid), and the batch books two lines of its own for it
(kind `adjustment`, cause the batch id): one of minus that amount, held by the batch, and one of
plus that amount, approved and free, which the next batch pays. So every line a paid row holds
is money sent, and nothing is lost.

Batches whose body has no snapshot were made before snapshots existed: they hold every free line
that the other rules give them, whatever the partner, and reports/payouts.py reads them as it
always did.

Status: a line held by a paid batch whose row did not fail is `paid`; one held by an open batch
is `approved`, with that `payout_id`; a line let go has no `payout_id` until a later batch
holds it. `payout_paid` (the first one, after the batch, before any cancel) marks a batch paid.
Batch ids are the rows' event ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import polars as pl

from reconcile import bookings
from reconcile.schema import ENGINE, PAYOUTS_SCHEMA, UTC, period_of

BATCH = "payout_batch"
PAID = "payout_paid"
CANCEL = "payout_cancel"
ROW_FAILED = "payout_row_failed"
KINDS = (BATCH, PAID, CANCEL, ROW_FAILED)
# What a batch's snapshot records of each row it pays (ingest/actions.py writes it).
_PAIRS = pl.Struct(
    {"rows": pl.List(pl.Struct({"partner_code": pl.String, "currency": pl.String, "rounding": pl.Int64}))}
)


def _actions(log: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    return log.filter(
        (pl.col("kind") == kind)
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_id").is_not_null()
    )


def batches(log: pl.LazyFrame) -> pl.DataFrame:
    """program_id, payout_id, seq, up_to, cutoff (the instant after the up_to day, null when the
    body has no valid date), created_at, created_by, payout_minimum (the number recorded; 0 when
    the body names none or an amount per currency), snapshot (the body's `snapshot` as JSON
    text, null for a batch made before snapshots); in seq order."""
    day = pl.col("body").str.json_path_match("$.up_to").str.slice(0, 10)
    parsed = day.str.to_date("%Y-%m-%d", strict=False)
    found = (
        _actions(log, BATCH)
        .select(
            "program_id",
            payout_id="event_id",
            seq="seq",
            up_to=pl.when(parsed.is_not_null()).then(day),
            cutoff=parsed.cast(pl.Datetime("us")).dt.replace_time_zone("UTC") + pl.duration(days=1),
            created_at="received_at",
            created_by=pl.col("body").str.json_path_match("$.by"),
            payout_minimum=pl.col("body")
            .str.json_path_match("$.payout_minimum")
            .cast(pl.Int64, strict=False)
            .fill_null(0)
            .clip(lower_bound=0),
            snapshot=pl.col("body").str.json_path_match("$.snapshot"),
        )
        .sort("seq")
        .unique(subset=["program_id", "payout_id"], keep="first", maintain_order=True)
        .collect(engine=ENGINE)
    )
    return found.with_columns(
        snapshot=pl.Series([canonical(s) for s in found.get_column("snapshot")], dtype=pl.String)
    )


def canonical(text: str | None) -> str | None:
    """A snapshot's JSON text in one form (keys sorted): what rc_payouts keeps and reports read.
    None when there is none, or it is not a JSON object with a list of `rows`."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("rows"), list):
        return None
    value["rows"] = [row for row in value["rows"] if _valid_row(row)]
    return json.dumps(value, sort_keys=True)


def _valid_row(row: Any) -> bool:
    """A snapshot row names a partner and a currency, and rounds by a whole number >= 0."""
    if not isinstance(row, dict):
        return False
    rounding = row.get("rounding", 0)
    return (
        isinstance(row.get("partner_code"), str)
        and isinstance(row.get("currency"), str)
        and isinstance(rounding, int)
        and not isinstance(rounding, bool)
        and 0 <= rounding < 2**62
    )


def _marks(log: pl.LazyFrame, made: pl.DataFrame, kind: str, **fields: str) -> pl.LazyFrame:
    """Rows of `kind` naming a batch of `made` (body `payout_id`), after it: program_id,
    payout_id, mark_seq, mark_at, mark_by and `fields` (name -> JSON path in the body)."""
    body = pl.col("body")
    return (
        _actions(log, kind)
        .select(
            "program_id",
            payout_id=body.str.json_path_match("$.payout_id"),
            mark_seq="seq",
            mark_id="event_id",
            mark_at="received_at",
            mark_by=body.str.json_path_match("$.by"),
            **{name: body.str.json_path_match(path) for name, path in fields.items()},
        )
        .join(made.lazy().select("program_id", "payout_id", "seq"), on=["program_id", "payout_id"])
        .filter(pl.col("mark_seq") > pl.col("seq"))
        .drop("seq")
    )


def outcomes(log: pl.LazyFrame, made: pl.DataFrame) -> pl.DataFrame:
    """program_id, payout_id, paid_seq, paid_at, paid_by, cancel_seq, cancelled_at, cancelled_by,
    cancel_reason: each batch's payment or cancel, whichever came first (a cancel after the
    payment, or a payment after the cancel, does nothing)."""
    keys = ["program_id", "payout_id"]
    firsts = (
        pl.concat(
            [
                _marks(log, made, PAID).with_columns(reason=pl.lit(None, pl.String), what=pl.lit("paid")),
                _marks(log, made, CANCEL, reason="$.reason").with_columns(what=pl.lit("cancelled")),
            ]
        )
        .sort("mark_seq")
        .group_by(keys, maintain_order=True)
        .agg(pl.all().first())
        .collect(engine=ENGINE)
    )
    paid = pl.col("what") == "paid"
    cancelled = pl.col("what") == "cancelled"
    return firsts.select(
        *keys,
        paid_seq=pl.when(paid).then("mark_seq"),
        paid_at=pl.when(paid).then("mark_at"),
        paid_by=pl.when(paid).then("mark_by"),
        cancel_seq=pl.when(cancelled).then("mark_seq"),
        cancelled_at=pl.when(cancelled).then("mark_at"),
        cancelled_by=pl.when(cancelled).then("mark_by"),
        cancel_reason=pl.when(cancelled).then("reason"),
    )


def paid(log: pl.LazyFrame, made: pl.DataFrame) -> pl.DataFrame:
    """program_id, payout_id, paid_at, paid_by: the batches paid (their payment before any cancel)."""
    return (
        outcomes(log, made)
        .filter(pl.col("paid_seq").is_not_null())
        .select("program_id", "payout_id", "paid_at", "paid_by")
    )


def failures(log: pl.LazyFrame, made: pl.DataFrame, settled: pl.DataFrame) -> pl.DataFrame:
    """program_id, payout_id, partner_code, currency, fail_seq, failed_at, failed_by, fail_id,
    fail_reason: the first failure of each row of a paid batch, logged after its payment, for a
    row its snapshot pays."""
    rows = pairs(made)
    return (
        _marks(
            log,
            made,
            ROW_FAILED,
            partner_code="$.partner_code",
            currency="$.currency",
            fail_reason="$.reason",
        )
        .join(settled.lazy().select("program_id", "payout_id", "paid_seq"), on=["program_id", "payout_id"])
        .filter(pl.col("paid_seq").is_not_null() & (pl.col("mark_seq") > pl.col("paid_seq")))
        .join(
            rows.lazy().select("program_id", "payout_id", "partner_code", "currency"),
            on=[
                "program_id",
                "payout_id",
                "partner_code",
                "currency",
            ],
        )
        .sort("mark_seq")
        .group_by("program_id", "payout_id", "partner_code", "currency", maintain_order=True)
        .agg(
            fail_seq=pl.col("mark_seq").first(),
            failed_at=pl.col("mark_at").first(),
            failed_by=pl.col("mark_by").first(),
            fail_id=pl.col("mark_id").first(),
            fail_reason=pl.col("fail_reason").first(),
        )
        .collect(engine=ENGINE)
    )


def pairs(made: pl.DataFrame) -> pl.DataFrame:
    """program_id, payout_id, seq, partner_code, currency, rounding: the rows each snapshot pays."""
    return (
        made.filter(pl.col("snapshot").is_not_null())
        .select(
            "program_id",
            "payout_id",
            "seq",
            row=pl.col("snapshot").str.json_decode(_PAIRS).struct.field("rows"),
        )
        .explode("row")
        .filter(pl.col("row").is_not_null())
        .unnest("row")
        .filter(pl.col("partner_code").is_not_null() & pl.col("currency").is_not_null())
        .with_columns(rounding=pl.col("rounding").fill_null(0))
        .unique(["program_id", "payout_id", "partner_code", "currency"], keep="first", maintain_order=True)
    )


def _failures_text(rows: Iterable[dict[str, Any]]) -> str:
    return json.dumps(
        [
            {
                "partner_code": r["partner_code"],
                "currency": r["currency"],
                "reason": r["fail_reason"],
                "failed_at": r["failed_at"].isoformat().replace("+00:00", "Z"),
                "failed_by": r["failed_by"],
                "seq": r["fail_seq"],
            }
            for r in sorted(rows, key=lambda r: (r["partner_code"], r["currency"]))
        ],
        sort_keys=True,
    )


def table(made: pl.DataFrame, settled: pl.DataFrame, failed: pl.DataFrame | None = None) -> pl.DataFrame:
    """The rc_payouts rows (PAYOUTS_SCHEMA): `settled` is `outcomes`, `failed` `failures`."""
    keys = ["program_id", "payout_id"]
    failed_rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in (failed if failed is not None else pl.DataFrame()).iter_rows(named=True):
        failed_rows.setdefault((row["program_id"], row["payout_id"]), []).append(row)
    texts = pl.DataFrame(
        [
            {"program_id": p, "payout_id": b, "failures": _failures_text(r)}
            for (p, b), r in failed_rows.items()
        ],
        schema={"program_id": pl.String, "payout_id": pl.String, "failures": pl.String},
    )
    joined = made.join(settled, on=keys, how="left").join(texts, on=keys, how="left")
    return (
        joined.sort("seq")
        .select(
            "program_id",
            "payout_id",
            "up_to",
            "created_at",
            "created_by",
            number=pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("program_id"),
            status=pl.when(pl.col("paid_at").is_not_null())
            .then(pl.lit("paid"))
            .when(pl.col("cancelled_at").is_not_null())
            .then(pl.lit("cancelled"))
            .otherwise(pl.lit("open")),
            paid_at=pl.col("paid_at").cast(UTC),
            paid_by="paid_by",
            payout_minimum="payout_minimum",
            seq="seq",
            paid_seq="paid_seq",
            cancelled_at=pl.col("cancelled_at").cast(UTC),
            cancelled_by="cancelled_by",
            cancel_reason="cancel_reason",
            snapshot="snapshot",
            failures="failures",
        )
        .select(pl.col(name).cast(dtype) for name, dtype in PAYOUTS_SCHEMA.items())
    )


def rounding_lines(made: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """The two lines of each snapshot row that pays less than its lines (`rounding` > 0): minus
    the rounding, held by the batch, and plus it, free; both booked at the batch (its seq and
    time), kind `adjustment`, cause the batch id, in the batch's month."""
    rows = pairs(made).filter(pl.col("rounding") != 0)
    if rows.is_empty():
        return pl.DataFrame(schema={c: pl.Null for c in columns}).clear()
    at = made.select("program_id", "payout_id", "created_at")
    base = rows.join(at, on=["program_id", "payout_id"]).with_columns(
        sale_id=pl.format("{}:{}:{}", "payout_id", "partner_code", "currency"),
        transaction_id=pl.lit(None, pl.String),
        kind=pl.lit("adjustment"),
        adjusts=pl.lit(None, pl.String),
        period=period_of(pl.col("created_at")),
        sale_period=period_of(pl.col("created_at")),
        reversed=pl.lit(0, pl.Int64),
        platform_fee=pl.lit(0, pl.Int64),
        platform_fee_reversed=pl.lit(0, pl.Int64),
        refunded=pl.lit(0, pl.Int64),
        status=pl.lit("approved"),
        self_referral=pl.lit(False),
        occurred_at="created_at",
        available_at="created_at",
        dated_at="created_at",
        booked_seq="seq",
        booked_at="created_at",
        status_reason=pl.lit("rounded to what the payout service can send"),
        status_by=pl.lit(None, pl.String),
    )
    held = base.with_columns(
        cause=pl.col("payout_id"), amount=-pl.col("rounding"), payout_id=pl.col("payout_id")
    )
    carried = base.with_columns(
        cause=pl.col("payout_id") + ":carried",
        amount=pl.col("rounding"),
        payout_id=pl.lit(None, pl.String),
    )
    frame = pl.concat([held, carried], how="vertical_relaxed")
    extra = [c for c in columns if c not in frame.columns]
    return frame.with_columns(pl.lit(None).alias(c) for c in extra).select(columns)


def assign(
    lines: pl.DataFrame,
    made: pl.DataFrame,
    settled: pl.DataFrame,
    acts: pl.DataFrame | None = None,
    failed: pl.DataFrame | None = None,
    keep_custody: bool = False,
) -> pl.DataFrame:
    """`lines` with `payout_id` (the batch that holds each, the module docstring's rule) and the
    `paid` statuses. `settled`: `outcomes`; `acts`: the finance actions (reconcile/bookings.py
    `actions`); `failed`: `failures`. A line that names a batch already (the minus line of a
    batch's rounding, `rounding_lines`) is that batch's first, then free like any other.
    `keep_custody`: keep the `custody` column (`_chain`; reconcile/entries.py reads it)."""
    row = "__line"
    indexed = lines.with_row_index(row)
    own = indexed.filter(pl.col("payout_id").is_not_null()).select(row, "program_id", "payout_id")
    indexed = indexed.drop("payout_id")
    snapshot_rows = pairs(made).select("program_id", "payout_id", "partner_code", "currency")
    legacy = made.filter(pl.col("snapshot").is_null()).select("program_id", "payout_id")
    lines_in = indexed.lazy().filter(pl.col("booked_seq").is_not_null() & (pl.col("amount") != 0))
    frozen = [bookings.FROZEN] if bookings.FROZEN in indexed.columns else []
    every = lines_in.select(
        row, "program_id", "sale_id", "partner_code", "currency", "booked_seq", "dated_at", *frozen
    )
    taking = every.join(
        made.lazy().select("program_id", "payout_id", "seq", "cutoff"), on="program_id"
    ).filter((pl.col("booked_seq") < pl.col("seq")) & (pl.col("dated_at") < pl.col("cutoff")))
    candidates = pl.concat(
        [
            taking.join(
                snapshot_rows.lazy(), on=["program_id", "payout_id", "partner_code", "currency"], how="semi"
            ),
            taking.join(legacy.lazy(), on=["program_id", "payout_id"], how="semi"),
        ]
    ).collect(engine=ENGINE)
    if acts is not None and not acts.is_empty() and not candidates.is_empty():
        # a line frozen by a close (bookings.apply_actions) heeds only the actions before it froze
        until = pl.col(bookings.FROZEN) if frozen else pl.lit(None, pl.Int64)
        stopped = (
            candidates.select(row, "program_id", "sale_id", "seq", frozen=until)
            .join(acts, on=["program_id", "sale_id"])
            .filter(
                (pl.col("action_seq") < pl.col("seq"))
                & (pl.col("frozen").is_null() | (pl.col("action_seq") < pl.col("frozen")))
            )
        )
        at_batch = bookings.fold(stopped, [row, "seq"]).filter(pl.col("hold_state").is_in(["held", "void"]))
        candidates = candidates.join(at_batch.select(row, "seq"), on=[row, "seq"], how="anti")
    firsts = (
        own.join(indexed.select(row, "partner_code", "currency"), on=row)
        .join(made.select("program_id", "payout_id", "seq"), on=["program_id", "payout_id"])
        .select(row, "program_id", "payout_id", "seq", "partner_code", "currency")
    )
    candidates = pl.concat([candidates.select(firsts.columns), firsts], how="vertical_relaxed")
    # When each batch lets a line go: its cancel, or its row's failure (never, else).
    let_go = made.select("program_id", "payout_id").join(
        settled.select("program_id", "payout_id", "cancel_seq"), on=["program_id", "payout_id"], how="left"
    )
    candidates = candidates.join(let_go, on=["program_id", "payout_id"], how="left")
    keyed = ["program_id", "payout_id", "partner_code", "currency"]
    if failed is not None and not failed.is_empty():
        candidates = candidates.join(failed.select(*keyed, "fail_seq"), on=keyed, how="left").with_columns(
            release=pl.coalesce("cancel_seq", "fail_seq")
        )
    else:
        candidates = candidates.with_columns(release=pl.col("cancel_seq"))
    taken = _chain(candidates.select(row, "payout_id", "seq", "release"), row)
    marks = settled.filter(pl.col("paid_seq").is_not_null()).select(
        "program_id", "payout_id", settled=pl.lit(True)
    )
    out = indexed.join(taken, on=row, how="left").join(marks, on=["program_id", "payout_id"], how="left")
    if not keep_custody:
        out = out.drop("custody")
    if failed is not None and not failed.is_empty():
        out = out.join(failed.select(*keyed, row_failed=pl.lit(True)), on=keyed, how="left")
    else:
        out = out.with_columns(row_failed=pl.lit(None, pl.Boolean))
    return (
        out.with_columns(
            status=pl.when(pl.col("settled").fill_null(False) & ~pl.col("row_failed").fill_null(False))
            .then(pl.lit("paid"))
            .when(pl.col("payout_id").is_not_null())
            .then(pl.lit("approved"))
            .otherwise(pl.col("status"))
        )
        .sort(row)
        .drop(row, "settled", "row_failed")
    )


def _chain(candidates: pl.DataFrame, row: str) -> pl.DataFrame:
    """row, payout_id, custody: per line, the batch that holds it now, and every batch that held
    it (`custody`: payout_id, seq, release, in order). The first candidate (by seq) takes the
    line; when that batch lets it go (`release`, a seq), the first candidate after the release
    takes it; and so on. A line whose last taker let it go has no `payout_id`."""
    ordered = candidates.sort(row, "seq")
    current = ordered.group_by(row, maintain_order=True).first()
    held = [current]
    while True:
        released = current.filter(pl.col("release").is_not_null())
        if released.is_empty():
            break
        later = (
            ordered.join(released.select(row, after=pl.col("release")), on=row)
            .filter(pl.col("seq") > pl.col("after"))
            .drop("after")
            .group_by(row, maintain_order=True)
            .first()
        )
        if later.is_empty():
            break
        held.append(later)
        current = pl.concat([current.filter(pl.col("release").is_null()), later], how="vertical_relaxed")
    custody = (
        pl.concat(held, how="vertical_relaxed")
        .sort(row, "seq")
        .group_by(row, maintain_order=True)
        .agg(custody=pl.struct("payout_id", "seq", "release"))
    )
    now = current.filter(pl.col("release").is_null()).select(row, "payout_id")
    return custody.join(now, on=row, how="left")
