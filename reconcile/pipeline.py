"""reconcile(): the raw log in, the numbers finance pays from out. Pure: no I/O, no clock.

Stages (each module's docstring states its rules):

1. reconcile/normalise.py: one typed sale per real transaction (connect and self-hosted).
2. reconcile/doubles.py: self-hosted records of connect sales are not counted; pairs reported
   (with the partner each record named, and each sale's money once).
3. reconcile/fixes.py: backfilled metadata fixes folded into the sales' metadata.
4. reconcile/leads.py + reconcile/promos.py + reconcile/attribution.py: the ladder, per program.
5. reconcile/customers.py + reconcile/commissions.py: eligibility (real, attributed, inside the
   customer's recurring window), amounts, under the program's terms in force when the sale
   occurred (reconcile/terms.py).
6. reconcile/layers.py: each sale's values before and after each applied backfill.
7. reconcile/refunds.py: refunds matched, capped, reversing commission and fee pro rata.
8. reconcile/ledger.py: commission lines frozen once approved; later refunds and backfills as
   clawback and adjustment lines of their own; reconcile/bookings.py: what was booked (approved,
   held, released, voided) read back from the log, and what the log implies since as new lines.
9. reconcile/periods.py: closed months frozen, later changes as adjustment lines.
10. reconcile/manual.py: owners' manual entries as approved lines of their own.
11. reconcile/payouts.py: the lines each payout batch holds (by its snapshot), cancels and failed
    rows letting them go; paid batches' lines `paid`. reconcile/entries.py: each booked line's
    later entries (holds, releases, voids, batches letting it go) for partners' statements.
12. reconcile/explain.py: the ladder in words, rendered from the evidence on demand.

Determinism: only accepted rows count, and nothing depends on arrival order except the engineer
actions (metadata fixes, backfills, period closes, payout batches and their payment, changes of
a program's terms, promo-code assignments, bookings and finance actions), which are ordered by
`seq`. Everything else
is ordered by business time and stable ids: records by (occurred_at, event_id), sales by
(occurred_at, sale_id), leads by (occurred_at, lead_id), refunds by (occurred_at, event_id).
The same log gives the same rows whatever the order of its rows (`Result.sorted()` puts them in
a canonical order; the pipeline itself does not spend time sorting its outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial

import polars as pl

from reconcile import (
    attribution,
    bookings,
    commissions,
    doubles,
    entries,
    explain,
    fixes,
    latecomers,
    layers,
    leads,
    manual,
    normalise,
    payouts,
    periods,
    promos,
    terms,
    unroutable,
)
from reconcile import ledger as ledger_rules
from reconcile import refunds as refund_rules
from reconcile.lookup import lookup
from reconcile.schema import (
    COMMISSIONS_SCHEMA,
    DOUBLE_COUNTS_SCHEMA,
    ENGINE,
    EVIDENCE_SCHEMA,
    PAYOUTS_SCHEMA,
    REFUNDS_SCHEMA,
    SALES_SCHEMA,
    UTC,
    conform,
    norm_email,
    period_of,
    prepare_partners,
    prepare_programs,
    prepare_raw,
)

SALES_ORDER = ("program_id", "occurred_at", "sale_id")
COMMISSIONS_ORDER = ("program_id", "period", "sale_id", "kind", "partner_code", "cause")
REFUNDS_ORDER = ("program_id", "occurred_at", "event_id", "source")
DOUBLES_ORDER = ("program_id", "kind", "transaction_id", "duplicate_id")
EXPLAIN_ORDER = ("program_id", "sale_id", "step")
EVIDENCE_ORDER = ("program_id", "sale_id")
UNROUTABLE_ORDER = ("occurred_at", "event_id")
PAYOUTS_ORDER = ("program_id", "number")


@dataclass(frozen=True)
class Result:
    """The materialised results of one reconcile run (schemas in reconcile/schema.py).

    Rows come in no particular order (`sorted()` gives the canonical one). `evidence` is what
    the ladder found per sale (table `rc_evidence`); `explain` renders it as steps (the view
    `rc_explain` renders the same from the table).
    """

    sales: pl.DataFrame
    commissions: pl.DataFrame
    refunds: pl.DataFrame
    double_counts: pl.DataFrame
    evidence: pl.DataFrame
    unroutable: pl.DataFrame
    payouts: pl.DataFrame

    @property
    def explain(self) -> pl.DataFrame:
        """Every sale's ladder, step by step (reconcile/explain.py)."""
        return explain.steps(self.evidence, self.sales)

    def sorted(self) -> Result:
        """The same result with every table in its canonical row order."""
        return Result(
            sales=self.sales.sort(SALES_ORDER, nulls_last=True),
            commissions=self.commissions.sort(COMMISSIONS_ORDER, nulls_last=True),
            refunds=self.refunds.sort(REFUNDS_ORDER, nulls_last=True),
            double_counts=self.double_counts.sort(DOUBLES_ORDER, nulls_last=True),
            evidence=self.evidence.sort(EVIDENCE_ORDER, nulls_last=True),
            unroutable=self.unroutable.sort(UNROUTABLE_ORDER, nulls_last=True),
            payouts=self.payouts.sort(PAYOUTS_ORDER, nulls_last=True),
        )


@dataclass(frozen=True)
class Ledger:
    """What one pass over (a prefix of) the log yields, before periods are applied."""

    sales: pl.DataFrame
    lines: pl.DataFrame
    refunds: pl.DataFrame
    double_counts: pl.DataFrame
    evidence: pl.DataFrame
    books: pl.DataFrame  # the log's booked lines (reconcile/bookings.py `booked`)


def reconcile(
    raw: pl.DataFrame | pl.LazyFrame,
    programs: pl.DataFrame,
    partners: pl.DataFrame,
    now: datetime,
    batch_lines: bool = True,
) -> Result:
    """Reconcile the raw log (columns of ingest/storage/schema.py) as of `now` (aware).

    `batch_lines`: include the lines payout batches book themselves (their rounding,
    reconcile/payouts.py), which come from engineer actions alone: a run in parts asks for them
    in one part only, and an incremental run (after no engineer action) not at all.

    `programs`: program_id plus the settings of reconcile/schema.py PROGRAM_SCHEMA (unset ones
    take the defaults); `partners`: program_id, code, email. A LazyFrame `raw` is collected once.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        msg = "reconcile needs an aware `now`"
        raise ValueError(msg)
    log = prepare_raw(raw if isinstance(raw, pl.DataFrame) else raw.collect(engine=ENGINE))
    settings = prepare_programs(programs).collect(engine=ENGINE)
    people = prepare_partners(partners).collect(engine=ENGINE)
    # The terms over time come from the whole log, for every prefix too (reconcile/terms.py).
    history = terms.history(log, settings)
    current = ledger(log, history, people, now)
    # Closed months first, then what was booked: a booking holds the lines as they were shown
    # (closed months applied), and every later difference is a line of its own.
    closed = periods.closes(log)
    lines = bookings.overlay(
        periods.apply(
            log,
            current.lines,
            partial(_prefixes, history=history, people=people, now=now),
            current.sales,
            now,
        ),
        log,
        current.sales,
        now,
        current.books,
        closed,
    )
    acts = bookings.actions(log)
    made = payouts.batches(log)
    settled = payouts.outcomes(log, made)
    failed = payouts.failures(log, made, settled)
    columns = [*lines.columns, "payout_id"]
    lines = pl.concat(
        [
            lines.with_columns(payout_id=pl.lit(None, pl.String)),
            _manual_lines(log, closed, acts, now, columns),
            *([payouts.rounding_lines(made, columns)] if batch_lines else []),
        ],
        how="vertical_relaxed",
    )
    held = payouts.assign(lines, made, settled, acts, failed, keep_custody=True)
    return Result(
        sales=_conform(latecomers.booked_in(current.sales, log, closed), SALES_SCHEMA),
        commissions=_conform(entries.history(held, acts, log), COMMISSIONS_SCHEMA),
        refunds=_conform(refund_rules.booked_in(current.refunds, log, closed), REFUNDS_SCHEMA),
        double_counts=_conform(current.double_counts, DOUBLE_COUNTS_SCHEMA),
        evidence=_conform(current.evidence, EVIDENCE_SCHEMA),
        unroutable=unroutable.listing(log, settings),
        payouts=_conform(payouts.table(made, settled, failed), PAYOUTS_SCHEMA),
    )


def close_bookings(
    raw: pl.DataFrame | pl.LazyFrame, programs: pl.DataFrame, partners: pl.DataFrame, now: datetime
) -> pl.DataFrame:
    """What the closes of `raw` that no booking holds yet book (reconcile/periods.py `to_book`):
    their snapshots valued as `reconcile` values them, once."""
    log = prepare_raw(raw if isinstance(raw, pl.DataFrame) else raw.collect(engine=ENGINE))
    settings = prepare_programs(programs).collect(engine=ENGINE)
    people = prepare_partners(partners).collect(engine=ENGINE)
    history = terms.history(log, settings)
    compute = partial(_prefixes, history=history, people=people, now=now)
    columns = ledger(log.head(0), history, people, now).lines.columns
    return periods.to_book(log, compute, columns, now)


def _manual_lines(
    log: pl.LazyFrame, closed: pl.DataFrame, acts: pl.DataFrame, now: datetime, columns: list[str]
) -> pl.DataFrame:
    """The manual entries' lines (reconcile/manual.py), with finance's holds and voids applied
    (closed months kept: `bookings.apply_actions`); the entry's reason and author stay where no
    action gives its own."""
    found = manual.lines(log, closed, [c for c in columns if c != bookings.FROZEN])
    if found.is_empty():
        return found.with_columns(pl.lit(None, pl.Int64).alias(bookings.FROZEN)).select(columns)
    kept = found.rename({"status_reason": "__reason", "status_by": "__by"})
    acted = bookings.apply_actions(kept, acts, now, closed)
    return acted.with_columns(
        status_reason=pl.coalesce("status_reason", "__reason"),
        status_by=pl.coalesce("status_by", "__by"),
    ).select(columns)


def _prefixes(
    log: pl.LazyFrame, aliases: pl.DataFrame, history: pl.DataFrame, people: pl.DataFrame, now: datetime
) -> pl.DataFrame:
    """The ledger lines of the prefixes `log` stacks (reconcile/periods.py `stacked`) in one
    pass: each alias valued with its program's terms over time and its partners."""

    def aliased(frame: pl.DataFrame) -> pl.DataFrame:
        return (
            frame.join(aliases, on="program_id")
            .with_columns(program_id=pl.col("alias"))
            .drop("alias")
            .select(frame.columns)
        )

    terms_over_time = aliased(history).sort("program_id", "since", nulls_last=False)  # as terms.history
    return ledger(log, terms_over_time, aliased(people), now).lines


def _conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return conform(frame.lazy(), schema).collect(engine=ENGINE)


def ledger(raw: pl.LazyFrame, programs: pl.DataFrame, partners: pl.DataFrame, now: datetime) -> Ledger:
    """One full pass: sales, commission lines (no period close), refunds, doubles, evidence.
    `programs`: the programs' terms over time (reconcile/terms.py `history`)."""
    books = bookings.booked(raw)
    connect = normalise.connect_sales(raw)
    self_hosted = normalise.self_hosted_sales(raw)
    split = doubles.split_self_hosted(connect.sales, self_hosted)
    kept = bookings.kept_ids(split.pairs, books)
    if not kept.is_empty():
        connect = normalise.Connect(
            sales=bookings.renamed(connect.sales, kept),
            records=bookings.renamed(connect.records, kept, "sale_key"),
        )
        split = doubles.Split(counted=split.counted, pairs=bookings.renamed(split.pairs, kept))
    combined = pl.concat([connect.sales, split.counted.select(normalise.SALE_COLUMNS)], how="vertical")
    sales = fixes.apply(combined, fixes.effective_fixes(raw, combined)).rechunk()

    click_table = leads.clicks(raw)
    lead_frame = leads.leads(raw, click_table)
    by_key = leads.lookup_table(lead_frame, "customer_key")
    by_email = leads.lookup_table(lead_frame, "email_norm")
    promo_table = promos.assignments(raw)
    attributed = attribution.attribute(sales, click_table, by_key, by_email, promo_table)
    ghosts = doubles.uncounted(raw, self_hosted, split.pairs)
    named = ghosts.select("program_id", "sale_id").hstack(
        attribution.attribute(ghosts, click_table, by_key, by_email, promo_table)
        .select("partner_code")
        .get_columns()
    )
    del lead_frame, self_hosted, ghosts
    sales = sales.hstack(attributed.select(attribution.OUTPUT).get_columns())
    evidence = attributed.select(attribution.EVIDENCE)
    del attributed
    sales = sales.hstack(commissions.gross(sales, programs, partners).get_columns())

    engineer = raw.filter(pl.col("kind").is_in(["metadata_fix", "backfill"])).collect(engine=ENGINE).lazy()
    value = partial(_valued, (click_table, by_key, by_email, promo_table), programs, partners)
    states = layers.states(engineer, combined, sales.select("program_id", "sale_id", *layers.VALUES), value)
    del combined, click_table, by_key, by_email, promo_table, value

    ids = doubles.id_map(connect.sales, doubles.wanted_ids(raw), split.counted)
    refund_rows = pl.concat(
        [refund_rules.track_refunds(raw, ids), refund_rules.processor_refunds(raw, ids)]
    ).collect(engine=ENGINE)
    applied = refund_rules.apply(refund_rows, sales)
    final = commissions.finish(
        sales.with_columns(period=period_of(pl.col("occurred_at"))), applied.totals, pl.lit(now, UTC)
    ).with_columns(
        warnings=attribution.warnings(
            attributed=pl.col("partner_code").is_not_null(),
            click_unknown=pl.col("click_unknown"),
            missing=pl.col("metadata_missing"),
            fixed=pl.col("fixed"),
            self_referral=pl.col("self_referral"),
            no_flat_amount=pl.col("no_flat_amount"),
        )
    )
    pairs = split.pairs
    record_ids = normalise.record_ids(
        connect.records, pairs.filter(pl.col("kind") == "connect_and_self_hosted")
    )
    pairs = pairs.hstack(
        lookup(pairs, record_ids, ["program_id", "sale_id"], ["record_ids"])
        .rename({"record_ids": "connect_record_ids"})
        .get_columns()
    )
    double_counts = doubles.finish(
        pl.concat([pairs, doubles.refused(raw, ids)], how="diagonal_relaxed"), final, named
    )
    return Ledger(
        sales=final,
        lines=ledger_rules.lines(final, states, applied.counted, payouts.batches(raw), now),
        refunds=applied.rows,
        double_counts=double_counts,
        evidence=evidence,
        books=books,
    )


def _valued(
    lookups: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame],
    programs: pl.DataFrame,
    partners: pl.DataFrame,
    jobs: list[layers.Job],
) -> list[pl.DataFrame]:
    """Sales before fixes (whole customers of one program each) valued with other effective
    fixes (layers.Value): partner and commission, with the ladder's lookups (clicks, leads by
    customer key, leads by email; the promo codes whole), cut down once to the rows these sales can
    find (a lookup's
    cost grows with its table)."""
    # Jobs of different programs are valued together (every rule is per program): round r holds
    # the r-th job of each program, so one attribution and one commission pass serve a round.
    rounds: list[list[int]] = []
    taken: dict[str, int] = {}
    for index, (program_id, _, _) in enumerate(jobs):
        r = taken.get(program_id, 0)
        taken[program_id] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(index)
    fixed = [
        fixes.apply(pl.concat([jobs[i][1] for i in members]), pl.concat([jobs[i][2] for i in members]))
        for members in rounds
    ]
    every = pl.concat(fixed)
    clicks, by_key, by_email, promo_table = lookups
    wanted = (
        clicks.filter(pl.col("click_id").is_in(every.get_column("click_id").drop_nulls().implode())),
        by_key.filter(pl.col("customer_key").is_in(every.get_column("customer_key").drop_nulls().implode())),
        by_email.filter(
            pl.col("email_norm").is_in(
                every.select(norm_email(pl.col("email"))).to_series().drop_nulls().implode()
            )
        ),
        promo_table,
    )
    out: list[pl.DataFrame] = [pl.DataFrame()] * len(jobs)
    for members, mine in zip(rounds, fixed, strict=True):
        found = attribution.attribute(mine, *wanted)
        attributed = mine.hstack(found.select(attribution.OUTPUT).get_columns())
        valued = attributed.select("program_id", "sale_id", "partner_code").hstack(
            commissions.gross(attributed, programs, partners).get_columns()
        )
        offset = 0
        for i in members:  # aligned with the round's rows: each job's slice, in order
            out[i] = valued.slice(offset, jobs[i][1].height)
            offset += jobs[i][1].height
    return out
