"""reconcile(): the raw log in, the numbers finance pays from out. Pure: no I/O, no clock.

Stages (each module's docstring states its rules):

1. reconcile/normalise.py: one typed sale per real transaction (connect and self-hosted).
2. reconcile/doubles.py: self-hosted records of connect sales are not counted; pairs reported.
3. reconcile/fixes.py: backfilled metadata fixes folded into the sales' metadata.
4. reconcile/leads.py + reconcile/attribution.py: the ladder, per program.
5. reconcile/commissions.py: eligibility (real, attributed, recurring window), amounts.
6. reconcile/refunds.py: refunds matched, capped, reversing commission and fee pro rata.
7. reconcile/periods.py: closed months frozen, later changes as adjustment lines.
8. reconcile/explain.py: the ladder in words.

Determinism: only accepted rows count, and nothing depends on arrival order except the engineer
actions (metadata fixes, backfills, period closes), which are ordered by `seq`. Everything else
is ordered by business time and stable ids: records by (occurred_at, event_id), sales by
(occurred_at, sale_id), leads by (occurred_at, lead_id), refunds by (occurred_at, event_id).
Outputs are sorted, so the same log gives the same frames whatever the order of its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from reconcile import attribution, commissions, doubles, explain, fixes, leads, normalise, periods
from reconcile import refunds as refund_rules
from reconcile.schema import (
    COMMISSIONS_SCHEMA,
    DOUBLE_COUNTS_SCHEMA,
    EXPLAIN_SCHEMA,
    REFUNDS_SCHEMA,
    SALES_SCHEMA,
    UNROUTABLE_SCHEMA,
    UTC,
    conform,
    period_of,
    prepare_partners,
    prepare_programs,
    prepare_raw,
)

SALES_ORDER = ("program_id", "occurred_at", "sale_id")
COMMISSIONS_ORDER = ("program_id", "period", "sale_id", "kind", "partner_code")
REFUNDS_ORDER = ("program_id", "occurred_at", "event_id", "source")
DOUBLES_ORDER = ("program_id", "kind", "transaction_id", "duplicate_id")
EXPLAIN_ORDER = ("program_id", "sale_id", "step")
UNROUTABLE_ORDER = ("occurred_at", "event_id")


@dataclass(frozen=True)
class Result:
    """The materialised results of one reconcile run (schemas in reconcile/schema.py)."""

    sales: pl.DataFrame
    commissions: pl.DataFrame
    refunds: pl.DataFrame
    double_counts: pl.DataFrame
    explain: pl.DataFrame
    unroutable: pl.DataFrame


@dataclass(frozen=True)
class Ledger:
    """What one pass over (a prefix of) the log yields, before periods are applied."""

    sales: pl.DataFrame
    lines: pl.DataFrame
    refunds: pl.DataFrame
    double_counts: pl.DataFrame
    explain: pl.DataFrame


def reconcile(
    raw: pl.DataFrame | pl.LazyFrame,
    programs: pl.DataFrame,
    partners: pl.DataFrame,
    now: datetime,
) -> Result:
    """Reconcile the raw log (columns of ingest/schema.py) as of `now` (aware)."""
    if now.tzinfo is None or now.utcoffset() is None:
        msg = "reconcile needs an aware `now`"
        raise ValueError(msg)
    log = prepare_raw(raw).collect().lazy()
    settings = prepare_programs(programs).collect().lazy()
    people = prepare_partners(partners).collect().lazy()
    current = ledger(log, settings, people, now)
    lines = periods.apply(log, current.lines, lambda prefix: ledger(prefix, settings, people, now).lines)
    return Result(
        sales=_sorted(current.sales, SALES_SCHEMA, SALES_ORDER),
        commissions=_sorted(lines, COMMISSIONS_SCHEMA, COMMISSIONS_ORDER),
        refunds=_sorted(current.refunds, REFUNDS_SCHEMA, REFUNDS_ORDER),
        double_counts=_sorted(current.double_counts, DOUBLE_COUNTS_SCHEMA, DOUBLES_ORDER),
        explain=_sorted(current.explain, EXPLAIN_SCHEMA, EXPLAIN_ORDER),
        unroutable=_sorted(unroutable(log).collect(), UNROUTABLE_SCHEMA, UNROUTABLE_ORDER),
    )


def _sorted(frame: pl.DataFrame, schema: dict[str, pl.DataType], order: tuple[str, ...]) -> pl.DataFrame:
    return conform(frame.lazy(), schema).sort(order, nulls_last=True).collect()


def ledger(log: pl.LazyFrame, programs: pl.LazyFrame, partners: pl.LazyFrame, now: datetime) -> Ledger:
    """One full pass: sales, commission lines (no period close), refunds, doubles, explain."""
    stripe = normalise.accepted_stripe(log)
    connect, self_hosted, click_table, lead_frame = pl.collect_all(
        [
            normalise.connect_sales(stripe),
            normalise.self_hosted_sales(log),
            leads.clicks(log),
            leads.leads(log, leads.clicks(log)),
        ]
    )
    split = doubles.split_self_hosted(connect.lazy(), self_hosted.lazy())
    counted, pairs = pl.collect_all([split.counted, split.pairs])
    sales = pl.concat([connect.lazy(), counted.lazy().select(normalise.SALE_COLUMNS)], how="vertical")
    sales = fixes.apply(sales, fixes.effective_fixes(log, sales))
    lead_lazy = lead_frame.lazy()
    attributed = attribution.attribute(
        sales,
        click_table.lazy(),
        leads.lookup(lead_lazy, "customer_key"),
        leads.lookup(lead_lazy, "email_norm"),
    ).collect()
    ids = doubles.id_map(connect.lazy(), counted.lazy())
    valued = commissions.gross(attributed.lazy(), programs, partners)
    refund_rows = pl.concat(
        [refund_rules.track_refunds(log, ids), refund_rules.processor_refunds(stripe, ids)]
    )
    valued_frame, refund_frame, id_frame = pl.collect_all([valued, refund_rows, ids])
    applied = refund_rules.apply(refund_frame.lazy(), valued_frame.lazy())
    refund_report, totals = pl.collect_all([applied.rows, applied.totals])
    final = commissions.finish(
        valued_frame.lazy().with_columns(period=period_of(pl.col("occurred_at"))),
        totals.lazy(),
        pl.lit(now, UTC),
    ).collect()
    refused = doubles.refused(log, id_frame.lazy())
    double_counts = pl.concat([pairs.lazy(), refused]).collect()
    return Ledger(
        sales=final,
        lines=commissions.lines(final.lazy()).collect(),
        refunds=refund_report,
        double_counts=double_counts,
        explain=explain.steps(attributed.lazy()).collect(),
    )


def unroutable(log: pl.LazyFrame) -> pl.LazyFrame:
    """Processor events that matched no program, each event id once."""
    return (
        log.filter(pl.col("outcome") == "unroutable")
        .sort("occurred_at", "event_id")
        .group_by("event_id")
        .agg(
            pl.col("event_type").first(),
            pl.col("object_id").first(),
            pl.col("stripe_account").first(),
            pl.col("meta_program_id").first(),
            pl.col("livemode").first(),
            pl.col("test_mode").first(),
            pl.col("amount").first(),
            pl.col("currency").first(),
            pl.col("occurred_at").first(),
            pl.col("received_at").min(),
        )
    )
