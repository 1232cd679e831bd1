"""Refunds: matched to their sale, capped at it, and reversing commission and fee pro rata.

Two sources:

- self-hosted `track/refund` rows (kind `refund`): one refund each, matched by the body's
  transaction id against every id a counted sale is known by (reconcile/doubles.py `id_map`);
- processor `charge.refunded` deliveries: the charge's *cumulative* `amount_refunded`. Each
  distinct cumulative level of a charge is one refund of (level - previous level), dated by the
  earliest delivery that reported it, so retries and repeated event objects count once. The
  charge is matched to its sale by invoice id, else payment intent id, else charge id, else
  the invoice an `invoice_payment.paid` of its program links its payment intent (else its
  charge) to (`links`; the smallest invoice id should there be several): in API 2025-03-31 and
  later an invoice names no payment intent or charge and a charge names no invoice, so that link
  is how a renewal's refund finds its sale, whichever arrived first.

When the processor reported refunds for a sale, self-hosted refunds of that sale are not
counted (`superseded_by_processor`): the processor's record wins, as for sales. A refund whose
sale is unknown is kept with outcome `sale_not_found`.

Counted refunds of a sale are applied in the order (occurred_at, event_id); the cumulative
refunded amount is capped at the sale's gross amount. After each refund, the commission (and
fee) reversed so far is round_half_even(commission * refunded_so_far / gross_amount), and exactly
the whole commission once the sale is fully refunded; each refund reverses the difference.

Each refund also says when the log first held it (`known_at`: its row's receive time; for a
processor level, the earliest delivery reporting it): a refund reported after a payout batch
could pay its sale counts from then (reconcile/ledger.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ingest.domain.events import LINK_EVENTS as LINKS
from reconcile.lookup import lookup
from reconcile.money import pro_rata
from reconcile.schema import ENGINE, period_of

REFUND_ROW = (
    "program_id",
    "refund_id",
    "source",
    "event_id",
    "transaction_id",
    "charge_id",
    "sale_id",
    "amount",
    "occurred_at",
    "known_at",
    "raw_currency",
)


def _joined(
    rows: pl.LazyFrame, table: pl.LazyFrame, key: str, value: str, column: str, alias: str
) -> pl.LazyFrame:
    """`rows` with `table`'s `value` (as `alias`) where `column` is its `key`, in the same program."""
    return rows.join(
        table.select("program_id", key, pl.col(value).alias(alias)),
        left_on=["program_id", column],
        right_on=["program_id", key],
        how="left",
    )


def _match(rows: pl.LazyFrame, ids: pl.LazyFrame, column: str, alias: str) -> pl.LazyFrame:
    return _joined(rows, ids, "id", "sale_id", column, alias)


def track_refunds(raw: pl.LazyFrame, ids: pl.DataFrame) -> pl.LazyFrame:
    rows = raw.filter(
        (pl.col("kind") == "refund")
        & (pl.col("source") == "track")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_id").is_not_null()
        & (pl.col("amount") > 0)
    )
    return _match(rows, ids.lazy(), "transaction_id", "sale_id").select(
        "program_id",
        refund_id=pl.coalesce("refund_id", "event_id"),
        source=pl.lit("self_hosted"),
        event_id="event_id",
        transaction_id="transaction_id",
        charge_id=pl.lit(None, pl.String),
        sale_id="sale_id",
        amount="amount",
        occurred_at="occurred_at",
        known_at="received_at",
        raw_currency=pl.col("currency"),
    )


LINK_EVENTS = sorted(LINKS)  # (ingest/domain/events.py, as a list for polars)


def links(raw: pl.LazyFrame) -> pl.LazyFrame:
    """program_id, payment (a payment intent or charge id), invoice: what accepted
    `invoice_payment.paid` deliveries link (the smallest invoice id per payment)."""
    rows = raw.filter(
        (pl.col("kind") == "stripe")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_type").is_in(LINK_EVENTS)
        & pl.col("invoice_id").is_not_null()
    )
    return (
        pl.concat(
            [
                rows.select("program_id", payment=pl.col(column), invoice=pl.col("invoice_id"))
                for column in ("payment_intent_id", "charge_id")
            ]
        )
        .drop_nulls()
        .group_by("program_id", "payment")
        .agg(pl.col("invoice").min())
    )


def _linked(rows: pl.LazyFrame, link: pl.LazyFrame, column: str, alias: str) -> pl.LazyFrame:
    return _joined(rows, link, "payment", "invoice", column, alias)


def processor_refunds(raw: pl.LazyFrame, ids: pl.DataFrame) -> pl.LazyFrame:
    events = (
        raw.filter(
            (pl.col("kind") == "stripe")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("event_id").is_not_null()
            & (pl.col("event_type") == "charge.refunded")
        )
        .with_columns(charge=pl.coalesce("object_id", "charge_id"))
        .filter(pl.col("charge").is_not_null())
        .sort("occurred_at", "event_id")
    )
    charges = events.group_by("program_id", "charge").agg(
        c_invoice=pl.col("invoice_id").drop_nulls().first(),
        c_intent=pl.col("payment_intent_id").drop_nulls().first(),
        raw_currency=pl.col("currency").drop_nulls().first(),
    )
    levels = (
        events.filter(pl.col("amount") > 0)
        .group_by("program_id", "charge", "amount")
        .agg(
            occurred_at=pl.col("occurred_at").first(),
            event_id=pl.col("event_id").first(),
            refund_id=pl.col("refund_id").drop_nulls().first(),
            known_at=pl.col("received_at").min(),
        )
        .sort("program_id", "charge", "amount")
        .with_columns(previous=pl.col("amount").shift(1).over("program_id", "charge"))
        .with_columns(increment=pl.col("amount") - pl.col("previous").fill_null(0))
        .join(charges, on=["program_id", "charge"], how="left")
    )
    id_frame = ids.lazy()
    link = links(raw)
    linked = _linked(_linked(levels, link, "c_intent", "l_intent"), link, "charge", "l_charge")
    linked = linked.with_columns(c_linked=pl.coalesce("l_intent", "l_charge"))
    matched = _match(linked, id_frame, "c_invoice", "by_invoice")
    matched = _match(matched, id_frame, "c_intent", "by_intent")
    matched = _match(matched, id_frame, "charge", "by_charge")
    matched = _match(matched, id_frame, "c_linked", "by_link")
    return matched.select(
        "program_id",
        refund_id=pl.coalesce("refund_id", "event_id"),
        source=pl.lit("connect"),
        event_id="event_id",
        transaction_id=pl.col("charge"),
        charge_id=pl.col("charge"),
        sale_id=pl.coalesce("by_invoice", "by_intent", "by_charge", "by_link"),
        amount=pl.col("increment"),
        occurred_at="occurred_at",
        known_at="known_at",
        raw_currency="raw_currency",
    )


@dataclass(frozen=True)
class Applied:
    """Refund report rows; per sale: refunded, commission/fee reversed; and the counted refunds
    themselves (program_id, sale_id, event_id, amount as reported, occurred_at, known_at)."""

    rows: pl.DataFrame
    totals: pl.DataFrame
    counted: pl.DataFrame


def apply(refund_rows: pl.DataFrame, sales: pl.DataFrame) -> Applied:
    """Apply refunds to `sales` (needs gross_amount, gross_commission, gross_fee)."""
    processor_refunded = (
        refund_rows.lazy()
        .filter((pl.col("source") == "connect") & pl.col("sale_id").is_not_null())
        .group_by("program_id", "sale_id")
        .agg(superseded=pl.lit(True))
    )
    sale_cols = lookup(
        refund_rows,
        sales.select(
            "program_id",
            "sale_id",
            "gross_amount",
            "gross_commission",
            "gross_fee",
            sale_transaction_id=pl.col("transaction_id"),
            sale_currency=pl.col("currency"),
        ),
        ["program_id", "sale_id"],
        ["gross_amount", "gross_commission", "gross_fee", "sale_transaction_id", "sale_currency"],
    )
    superseded = lookup(refund_rows, processor_refunded, ["program_id", "sale_id"], ["superseded"])
    rows = (
        refund_rows.hstack([*sale_cols.get_columns(), *superseded.get_columns()])
        .with_columns(
            outcome=pl.when(pl.col("gross_amount").is_null())
            .then(pl.lit("sale_not_found"))
            .when((pl.col("source") == "self_hosted") & pl.col("superseded").fill_null(False))
            .then(pl.lit("superseded_by_processor"))
            .otherwise(pl.lit("applied"))
        )
        .lazy()
    )
    group = ["program_id", "sale_id"]
    counted = pl.col("outcome") == "applied"
    applied = (
        rows.filter(counted)
        .sort("occurred_at", "event_id")
        .with_columns(cumulative=pl.col("amount").cum_sum().over(group))
        .with_columns(
            applied_cum=pl.min_horizontal("cumulative", "gross_amount"),
        )
        .with_columns(
            rev_c=pro_rata(pl.col("gross_commission"), pl.col("applied_cum"), pl.col("gross_amount")),
            rev_f=pro_rata(pl.col("gross_fee"), pl.col("applied_cum"), pl.col("gross_amount")),
        )
        .with_columns(
            applied_amount=pl.col("applied_cum") - pl.col("applied_cum").shift(1).over(group).fill_null(0),
            commission_reversed=pl.col("rev_c") - pl.col("rev_c").shift(1).over(group).fill_null(0),
            platform_fee_reversed=pl.col("rev_f") - pl.col("rev_f").shift(1).over(group).fill_null(0),
        )
        .collect(engine=ENGINE)
    )
    totals = applied.group_by(group).agg(
        refunded=pl.col("applied_amount").sum(),
        reversed=pl.col("commission_reversed").sum(),
        fee_reversed=pl.col("platform_fee_reversed").sum(),
    )
    zero = pl.lit(0, pl.Int64)
    not_applied = rows.filter(~counted).with_columns(
        applied_amount=zero, commission_reversed=zero, platform_fee_reversed=zero
    )
    columns = [
        *REFUND_ROW,
        "sale_transaction_id",
        "sale_currency",
        "outcome",
        "applied_amount",
        "commission_reversed",
        "platform_fee_reversed",
    ]
    report = pl.concat([applied.select(columns), not_applied.select(columns).collect(engine=ENGINE)]).select(
        "program_id",
        "refund_id",
        "source",
        "event_id",
        "transaction_id",
        "charge_id",
        "sale_id",
        "sale_transaction_id",
        "amount",
        "applied_amount",
        "outcome",
        "commission_reversed",
        "platform_fee_reversed",
        currency=pl.coalesce("sale_currency", "raw_currency"),
        occurred_at="occurred_at",
        period=period_of(pl.col("occurred_at")),
    )
    counted_rows = applied.select("program_id", "sale_id", "event_id", "amount", "occurred_at", "known_at")
    return Applied(rows=report, totals=totals, counted=counted_rows)


def booked_in(rows: pl.DataFrame, log: pl.LazyFrame, closed: pl.DataFrame) -> pl.DataFrame:
    """`rows` (the refunds report) with `booked_period`: the month a refund counts in. It is the
    month it occurred in, unless that month was closed before the refund was logged (a higher
    `seq` than the close): then the month it was logged in (its `received_at`), and never before
    the month after the closed one — a closed month's figures never change, and the refund
    shows where it was booked (reconcile/periods.py `closes`)."""
    if closed.is_empty():
        return rows.with_columns(booked_period=pl.col("period"))
    logged = (
        log.filter((pl.col("outcome") == "accepted") & pl.col("event_id").is_not_null())
        .group_by("program_id", "event_id")
        .agg(pl.col("seq").min(), pl.col("received_at").sort_by("seq").first())
        .collect(engine=ENGINE)
    )
    year, month = (
        pl.col("period").str.slice(0, 4).cast(pl.Int32),
        pl.col("period").str.slice(5, 2).cast(pl.Int32),
    )
    after_close = pl.format(
        "{}-{}",
        (year + month // 12).cast(pl.String).str.zfill(4),
        (month % 12 + 1).cast(pl.String).str.zfill(2),
    )
    late = pl.col("close_seq").is_not_null() & (pl.col("seq") > pl.col("close_seq"))
    return (
        rows.join(logged, on=["program_id", "event_id"], how="left")
        .join(closed, on=["program_id", "period"], how="left")
        .with_columns(
            booked_period=pl.when(late.fill_null(False))
            .then(pl.max_horizontal(period_of(pl.col("received_at")), after_close))
            .otherwise(pl.col("period"))
        )
        .drop("seq", "received_at", "close_seq")
    )
