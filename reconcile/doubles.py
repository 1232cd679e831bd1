"""Double counting: one sale seen twice is counted once, and every such pair is reported.

- A real self-hosted sale whose transaction id equals any id of a connect sale of the same
  program (invoice, payment intent, checkout session or charge id; looked up in that order) is
  the same sale seen twice: the connect record wins, the self-hosted one is not counted, and the
  pair is listed (kind `connect_and_self_hosted`).
- Two accepted real self-hosted sales with the same transaction id (ingest refuses these, so
  only an old or hand-edited log has them): the earliest in (occurred_at, sale_id) counts, the
  others are listed (kind `self_hosted_repeat`).
- Sale attempts refused at ingest (`kind = 'sale'`, `outcome = 'duplicate'`) are listed as they
  are (kind `ingest_refused`), with the counted sale they collided with when it can be found.

Each line also says which partner each record named (`finish`): `partner_code` is the counted
sale's partner (its attribution), `duplicate_partner_code` the partner the record that was not
counted names on its own: the ladder's rules click, email and customer key applied to it as it
came (`uncounted`; not rule 3, an earlier sale of the same processor customer, which is about
counted sales). `partner_mismatch` is true when the record not counted named a partner the
counted sale is not attributed to (to another partner, or to none): the processor's record and
the self-hosted call named different partners, and the counted one won. A record that names no
partner is no mismatch.

Money is counted once per sale (`distinct_amount`): the lines of one program are ordered as the
report shows them (occurred_at, kind, transaction id, duplicate id) and the first line of each
distinct sale (its counted sale id, else its transaction id, else the line itself) carries its
amount; the sale's other lines (a refused retry, say) carry 0. So summing `distinct_amount`
counts each sale seen twice once, however many times it was retried.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from reconcile import normalise
from reconcile.lookup import lookup
from reconcile.refunds import LINK_EVENTS
from reconcile.schema import ENGINE

ID_FIELDS = ("invoice_id", "payment_intent_id", "checkout_session_id", "charge_id")


def wanted_ids(raw: pl.LazyFrame) -> pl.DataFrame:
    """program_id, id: every id something in the log refers a sale by (self-hosted sales and
    refunds, refused sale attempts, processor refunds, the invoices `invoice_payment.paid`
    links a payment to). Only these need resolving."""
    track = raw.filter(pl.col("kind").is_in(["sale", "refund"]) & pl.col("program_id").is_not_null()).select(
        "program_id", id=pl.col("transaction_id")
    )
    refunds = raw.filter(
        (pl.col("kind") == "stripe")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & (pl.col("event_type") == "charge.refunded")
    )
    processor = [
        refunds.select("program_id", id=pl.col(column))
        for column in ("invoice_id", "payment_intent_id", "object_id", "charge_id")
    ]
    linked = raw.filter(
        (pl.col("kind") == "stripe")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_type").is_in(LINK_EVENTS)
    ).select("program_id", id=pl.col("invoice_id"))
    return (
        pl.concat([track, *processor, linked])
        .drop_nulls()
        .group_by("program_id", "id")
        .agg()
        .collect(engine=ENGINE)
    )


def id_map(
    connect: pl.DataFrame, wanted: pl.DataFrame, self_hosted: pl.DataFrame | None = None
) -> pl.DataFrame:
    """program_id, id -> sale_id, matched_on, for the `wanted` ids a counted sale is known by.

    Connect ids come first (in ID_FIELDS order), then self-hosted transaction ids of real sales,
    then of test sales; an id claimed by several sales resolves to the first by that rank, then
    the smallest sale id.
    """
    parts = [
        connect.lazy()
        .select(
            "program_id", "sale_id", id=pl.col(field), matched_on=pl.lit(field), rank=pl.lit(rank, pl.Int32)
        )
        .join(wanted.lazy(), on=["program_id", "id"], how="semi")
        for rank, field in enumerate(ID_FIELDS)
    ]
    if self_hosted is not None:
        parts.append(
            self_hosted.lazy()
            .select(
                "program_id",
                "sale_id",
                id=pl.col("transaction_id"),
                matched_on=pl.lit("transaction_id"),
                rank=pl.lit(len(ID_FIELDS), pl.Int32) + pl.col("test_mode").cast(pl.Int32),
            )
            .filter(pl.col("id").is_not_null())
        )
    return (
        pl.concat(parts)
        .sort("rank", "sale_id")
        .group_by("program_id", "id")
        .agg(pl.col("sale_id").first(), pl.col("matched_on").first())
        .collect(engine=ENGINE)
    )


@dataclass(frozen=True)
class Split:
    """Self-hosted sales that count, and the report rows for those that do not (the
    `connect_and_self_hosted` rows still without their `connect_record_ids`)."""

    counted: pl.DataFrame
    pairs: pl.DataFrame


def split_self_hosted(connect: pl.DataFrame, self_hosted: pl.DataFrame) -> Split:
    real = ~pl.col("test_mode") & pl.col("transaction_id").is_not_null()
    wanted = self_hosted.filter(real).select("program_id", id=pl.col("transaction_id"))
    connect_ids = id_map(connect, wanted)
    hit = lookup(
        self_hosted,
        connect_ids,
        ["program_id", "transaction_id"],
        ["sale_id", "matched_on"],
        right_on=["program_id", "id"],
    )
    matched = self_hosted.with_columns(
        connect_sale_id=hit.get_column("sale_id"), matched_on=hit.get_column("matched_on")
    ).with_columns(is_double=real & pl.col("connect_sale_id").is_not_null())
    doubled = matched.filter(pl.col("is_double"))
    winner = lookup(
        doubled.select("program_id", sale_id=pl.col("connect_sale_id")),
        connect,
        ["program_id", "sale_id"],
        ["transaction_id"],
    )
    pairs = doubled.select(
        "program_id",
        kind=pl.lit("connect_and_self_hosted"),
        transaction_id=winner.get_column("transaction_id"),
        sale_id=pl.col("connect_sale_id"),
        duplicate_id=pl.col("sale_id"),
        duplicate_transaction_id=pl.col("transaction_id"),
        matched_on="matched_on",
        amount=pl.col("gross_amount"),
        currency="currency",
        occurred_at="occurred_at",
    )
    remaining = matched.filter(~pl.col("is_double")).drop("connect_sale_id", "matched_on", "is_double")
    firsts = (
        remaining.lazy()
        .filter(real)
        .sort("occurred_at", "sale_id")
        .group_by("program_id", "transaction_id")
        .agg(first_sale=pl.col("sale_id").first())
    )
    probe = remaining.select(pl.when(real).then(pl.col("program_id")).alias("program_id"), "transaction_id")
    ranked = remaining.hstack(
        lookup(probe, firsts, ["program_id", "transaction_id"], ["first_sale"]).get_columns()
    )
    repeat = pl.col("first_sale").is_not_null() & (pl.col("first_sale") != pl.col("sale_id"))
    repeats = ranked.filter(repeat).select(
        "program_id",
        kind=pl.lit("self_hosted_repeat"),
        transaction_id="transaction_id",
        sale_id=pl.col("first_sale"),
        duplicate_id=pl.col("sale_id"),
        duplicate_transaction_id=pl.col("transaction_id"),
        matched_on=pl.lit("transaction_id"),
        amount=pl.col("gross_amount"),
        currency="currency",
        occurred_at="occurred_at",
    )
    counted = ranked.filter(~repeat).drop("first_sale")
    return Split(counted=counted, pairs=pl.concat([pairs, repeats]))


def refused(raw: pl.LazyFrame, sale_ids: pl.DataFrame) -> pl.DataFrame:
    """Report rows for the sale attempts ingest refused as duplicates."""
    attempts = raw.filter((pl.col("kind") == "sale") & (pl.col("outcome") == "duplicate")).collect(
        engine=ENGINE
    )
    hit = lookup(
        attempts,
        sale_ids,
        ["program_id", "transaction_id"],
        ["sale_id", "matched_on"],
        right_on=["program_id", "id"],
    )
    return attempts.hstack(hit.get_columns()).select(
        "program_id",
        kind=pl.lit("ingest_refused"),
        transaction_id="transaction_id",
        sale_id="sale_id",
        duplicate_id=pl.col("event_id"),
        duplicate_transaction_id=pl.col("transaction_id"),
        matched_on="matched_on",
        amount="amount",
        currency="currency",
        occurred_at="occurred_at",
    )


def uncounted(raw: pl.LazyFrame, self_hosted: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """The records double counts did not count, as the attribution ladder reads them
    (attribution.INPUT; `sale_id` is the line's `duplicate_id`): the self-hosted sales paired
    off (`pairs`) and the sale attempts refused at ingest, as they came (no fix applied), without
    their processor customer (see the module docstring)."""
    columns = (
        "program_id",
        "sale_id",
        "occurred_at",
        "test_mode",
        "click_id",
        "customer_key",
        "email",
        "promo_code",
    )
    paired = self_hosted.join(
        pairs.select("program_id", sale_id=pl.col("duplicate_id")), on=["program_id", "sale_id"], how="semi"
    ).select(*columns, "meta_program_id")
    refused = (
        raw.filter(
            (pl.col("kind") == "sale")
            & (pl.col("outcome") == "duplicate")
            & pl.col("program_id").is_not_null()
            & pl.col("event_id").is_not_null()
        )
        .select(
            "program_id",
            sale_id=pl.col("event_id"),
            occurred_at="occurred_at",
            test_mode=normalise.is_test(),
            click_id="click_id",
            customer_key="customer_key",
            email="email",
            promo_code="promo_code",
            meta_program_id="meta_program_id",
        )
        .collect(engine=ENGINE)
    )
    return pl.concat([paired, refused], how="vertical_relaxed").with_columns(
        processor_customer_id=pl.lit(None, pl.String),
        metadata_missing=pl.lit(False),
        source=pl.lit("self_hosted"),
    )


REPORT_ORDER = ("program_id", "occurred_at", "kind", "transaction_id", "duplicate_id")


def finish(lines: pl.DataFrame, sales: pl.DataFrame, named: pl.DataFrame) -> pl.DataFrame:
    """The double-count `lines` with `partner_code` (of the counted sale, from `sales`),
    `duplicate_partner_code` (from `named`: program_id, sale_id = the uncounted record,
    partner_code), `partner_mismatch` and `distinct_amount` (see the module docstring)."""
    counted = lookup(lines, sales, ["program_id", "sale_id"], ["partner_code"])
    other = lookup(
        lines,
        named,
        ["program_id", "duplicate_id"],
        ["partner_code"],
        right_on=["program_id", "sale_id"],
    ).rename({"partner_code": "duplicate_partner_code"})
    no_sale = pl.col("sale_id").is_null()
    sale = pl.struct(
        "program_id",
        "sale_id",
        pl.when(no_sale).then(pl.col("transaction_id")).alias("by_transaction"),
        pl.when(no_sale & pl.col("transaction_id").is_null()).then(pl.col("duplicate_id")).alias("by_line"),
    )
    return (
        lines.hstack([*counted.get_columns(), *other.get_columns()])
        .with_columns(
            partner_mismatch=pl.col("duplicate_partner_code").is_not_null()
            & pl.col("duplicate_partner_code").ne_missing(pl.col("partner_code"))
        )
        .sort(REPORT_ORDER, nulls_last=True)
        .with_columns(
            distinct_amount=pl.when(sale.is_first_distinct()).then(pl.col("amount").fill_null(0)).otherwise(0)
        )
    )
