"""Normalisation: the raw log's sale-ish rows become one typed sale per real transaction.

Connect (processor) sales
-------------------------
Only accepted deliveries routed to a program count. The sale records are

- checkout sessions (`checkout.session.completed`, `checkout.session.async_payment_succeeded`)
  in mode `payment` or `subscription` (mode `setup` is never a sale), and
- invoices (`invoice.payment_succeeded`, `invoice.paid`).

Records are grouped into sales by a *sale key*: an invoice's key is its id; a session's key is
the invoice id it carries, else (mode subscription) the id of the `subscription_create` invoice
of the same subscription (the smallest id should there be several), else the session id. So a
subscription checkout and its first invoice are one sale whichever arrived first, an invoice
delivered as both `invoice.paid` and `invoice.payment_succeeded` is one sale, and retried
deliveries (same event id) and duplicate event objects (same object id and type) collapse into
the sale they describe.

Records are ordered by (occurred_at, event_id). A sale has an invoice side and a session side,
each read from its earliest record. Amount, tax and currency come from the invoice side when
there is one, else from the session side; a sale whose gross amount is missing or not positive
is no sale (zero-amount invoices, free trials). Amount is net of tax (gross - tax, never below
zero). Attribution metadata (click id, customer key, program id) comes from the session side when
the sale has one, else from the invoice's subscription metadata (`metadata_source` =
`subscription`, or `invoice` for an invoice without subscription). Email and processor customer:
session side first. The promotion code id (`promo_code`) is the session side's only (an invoice
names discounts, not codes; a renewal follows its customer, reconcile/attribution.py). Ids
(invoice, payment intent, charge, subscription): invoice side first;
checkout session id: session side first. `occurred_at` is the earliest record time; `test_mode`
is set when any record is a test (`livemode: false`). A sale is recurring when it has no session
and its invoice's billing reason is a subscription cycle, update or threshold.

transaction_id = invoice id, else payment intent id, else checkout session id; sale_id = the sale
key.

Self-hosted sales
-----------------
Accepted `track` rows of kind `sale`: sale_id = the row's event id, tax 0, currency default
`usd`. Test sales (which may carry nothing but the flag) are kept and visible; a real one needs a
positive amount.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ingest.domain.events import CHECKOUT_EVENTS
from ingest.domain.events import INVOICE_EVENTS as INVOICES
from reconcile.lookup import lookup
from reconcile.schema import ENGINE

# The processor's event types (ingest/domain/events.py), as lists for polars.
SESSION_EVENTS = sorted(CHECKOUT_EVENTS)
INVOICE_EVENTS = sorted(INVOICES)
SALE_MODES = ("payment", "subscription")
RECURRING_REASONS = ("subscription_cycle", "subscription_update", "subscription_threshold")

# Columns of the typed sale frame produced here (before attribution).
SALE_COLUMNS = (
    "program_id",
    "sale_id",
    "transaction_id",
    "source",
    "amount",
    "gross_amount",
    "tax",
    "currency",
    "is_recurring",
    "test_mode",
    "customer_key",
    "processor_customer_id",
    "email",
    "click_id",
    "meta_program_id",
    "metadata_source",
    "metadata_missing",
    "subscription_id",
    "invoice_id",
    "payment_intent_id",
    "checkout_session_id",
    "charge_id",
    "occurred_at",
    "promo_code",
)

# Read from the invoice side / the session side of a sale.
_BOTH_SIDES = (
    "amount",
    "tax",
    "currency",
    "email",
    "processor_customer_id",
    "click_id",
    "customer_key",
    "meta_program_id",
)
_IDS = ("invoice_id", "payment_intent_id", "checkout_session_id", "charge_id", "subscription_id")
INVOICE_SIDE = (*_BOTH_SIDES, "sub_metadata_present", "billing_reason", *_IDS)
SESSION_SIDE = (*_BOTH_SIDES, *_IDS, "promo_code")
KEY = ["program_id", "sale_key"]
ROW = "__row"


def is_test() -> pl.Expr:
    return pl.col("test_mode").fill_null(False) | (pl.col("livemode") == False).fill_null(False)  # noqa: E712


RECORD_FIELDS = tuple(dict.fromkeys([*INVOICE_SIDE, *SESSION_SIDE]))


def _sale_records(raw: pl.LazyFrame) -> pl.DataFrame:
    """The sale records: key columns, sale key, and the fields a sale reads from its sides."""
    session = pl.col("event_type").is_in(SESSION_EVENTS)
    invoice = pl.col("event_type").is_in(INVOICE_EVENTS)
    records = (
        raw.filter(
            (pl.col("kind") == "stripe")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("event_id").is_not_null()
            & ((session & pl.col("checkout_mode").is_in(SALE_MODES)) | invoice)
        )
        .select(
            *(c for c in RECORD_FIELDS if c not in ("invoice_id", "checkout_session_id")),
            "program_id",
            "event_id",
            "occurred_at",
            "checkout_mode",
            is_session=session,
            test_mode=is_test(),
            invoice_id=pl.when(session)
            .then(pl.col("invoice_id"))
            .otherwise(pl.coalesce("object_id", "invoice_id")),
            checkout_session_id=pl.when(session)
            .then(pl.coalesce("object_id", "checkout_session_id"))
            .otherwise(pl.col("checkout_session_id")),
        )
        .collect(engine=ENGINE)
    )
    creates = (
        records.lazy()
        .filter(
            ~pl.col("is_session")
            & (pl.col("billing_reason") == "subscription_create")
            & pl.col("subscription_id").is_not_null()
        )
        .group_by("program_id", "subscription_id")
        .agg(create_invoice=pl.col("invoice_id").min())
    )
    by_subscription = (
        pl.col("is_session")
        & pl.col("invoice_id").is_null()
        & (pl.col("checkout_mode") == "subscription")
        & pl.col("subscription_id").is_not_null()
    )
    probe = records.select(
        pl.when(by_subscription).then(pl.col("program_id")).alias("program_id"), "subscription_id"
    )
    create_invoice = lookup(probe, creates, ["program_id", "subscription_id"], ["create_invoice"]).to_series()
    keyed = records.with_columns(
        sale_key=pl.coalesce(pl.col("invoice_id"), create_invoice, pl.col("checkout_session_id"))
    )
    if keyed.get_column("sale_key").null_count():
        keyed = keyed.filter(pl.col("sale_key").is_not_null())
    return keyed.rechunk()


@dataclass(frozen=True)
class Connect:
    """Connect sales, and their records in record order (program_id, sale_key, event_id)."""

    sales: pl.DataFrame
    records: pl.DataFrame


def _side(records: pl.DataFrame, rows: pl.Series, fields: tuple[str, ...], prefix: str) -> pl.DataFrame:
    """The `fields` of the records at `rows`, prefixed. Where `rows` is null (the sale has no
    such side) the values are meaningless: every use is guarded by `has_i` / `has_s`."""
    return records.select(pl.col(f).alias(f"{prefix}_{f}") for f in fields).gather(rows.fill_null(0))


def connect_sales(raw: pl.LazyFrame) -> Connect:
    """One typed sale per processor transaction (see the module docstring)."""
    records = _sale_records(raw)
    ordered = (
        records.select(*KEY, "occurred_at", "event_id", "is_session", "test_mode")
        .with_row_index(ROW)
        .sort("occurred_at", "event_id")
    )
    session = pl.col("is_session")
    summary = ordered.group_by(KEY).agg(
        pl.col(ROW).filter(~session).first().alias("i_row"),
        pl.col(ROW).filter(session).first().alias("s_row"),
        pl.col("occurred_at").min(),
        pl.col("test_mode").any(),
    )
    grouped = summary.hstack(
        [
            *_side(records, summary.get_column("i_row"), INVOICE_SIDE, "i").get_columns(),
            *_side(records, summary.get_column("s_row"), SESSION_SIDE, "s").get_columns(),
        ]
    ).with_columns(has_i=pl.col("i_row").is_not_null(), has_s=pl.col("s_row").is_not_null())
    del records
    has_i, has_s = pl.col("has_i"), pl.col("has_s")

    def inv(field: str) -> pl.Expr:
        return pl.when(has_i).then(pl.col(f"i_{field}"))

    def ses(field: str) -> pl.Expr:
        return pl.when(has_s).then(pl.col(f"s_{field}"))

    def pick(field: str) -> pl.Expr:
        """Amount fields: the invoice side when the sale has one."""
        return pl.when(has_i).then(pl.col(f"i_{field}")).otherwise(pl.col(f"s_{field}"))

    def meta(field: str) -> pl.Expr:
        """Attribution metadata: the session side when the sale has one."""
        return pl.when(has_s).then(pl.col(f"s_{field}")).otherwise(pl.col(f"i_{field}"))

    subscription_id = pl.coalesce(inv("subscription_id"), ses("subscription_id"))
    invoice_id = pl.coalesce(inv("invoice_id"), ses("invoice_id"))
    intent_id = pl.coalesce(inv("payment_intent_id"), ses("payment_intent_id"))
    session_id = pl.coalesce(ses("checkout_session_id"), inv("checkout_session_id"))
    metadata_source = (
        pl.when(has_s)
        .then(pl.lit("checkout_session"))
        .when(subscription_id.is_not_null())
        .then(pl.lit("subscription"))
        .otherwise(pl.lit("invoice"))
    )
    gross = pick("amount")
    tax = pick("tax").fill_null(0)
    sales = (
        grouped.lazy()
        .filter(gross > 0)
        .select(
            "program_id",
            sale_id=pl.col("sale_key"),
            transaction_id=pl.coalesce(invoice_id, intent_id, session_id),
            source=pl.lit("connect"),
            amount=pl.max_horizontal(gross - tax, pl.lit(0)),
            gross_amount=gross,
            tax=tax,
            currency=pl.coalesce(inv("currency"), ses("currency")),
            is_recurring=~has_s & pl.col("i_billing_reason").is_in(RECURRING_REASONS).fill_null(False),
            test_mode="test_mode",
            customer_key=meta("customer_key"),
            processor_customer_id=pl.coalesce(ses("processor_customer_id"), inv("processor_customer_id")),
            email=pl.coalesce(ses("email"), inv("email")),
            click_id=meta("click_id"),
            meta_program_id=meta("meta_program_id"),
            metadata_source=metadata_source,
            metadata_missing=~has_s
            & subscription_id.is_not_null()
            & ~inv("sub_metadata_present").fill_null(False),
            subscription_id=subscription_id,
            invoice_id=invoice_id,
            payment_intent_id=intent_id,
            checkout_session_id=session_id,
            charge_id=pl.coalesce(inv("charge_id"), ses("charge_id")),
            occurred_at="occurred_at",
            promo_code=ses("promo_code"),
        )
        .collect(engine=ENGINE)
    )
    return Connect(sales=sales, records=ordered.select(*KEY, "event_id"))


def record_ids(records: pl.DataFrame, sales: pl.DataFrame) -> pl.DataFrame:
    """program_id, sale_id, record_ids (event ids in record order) for the given connect sales."""
    wanted = sales.select("program_id", sale_key=pl.col("sale_id"))
    return (
        records.lazy()
        .join(wanted.lazy(), on=KEY, how="semi", maintain_order="left")
        .group_by(KEY, maintain_order=True)
        .agg(record_ids=pl.col("event_id").unique(maintain_order=True))
        .rename({"sale_key": "sale_id"})
        .collect(engine=ENGINE)
    )


def self_hosted_sales(raw: pl.LazyFrame) -> pl.DataFrame:
    """Accepted self-hosted `track/sale` rows as typed sales (test sales included)."""
    test = is_test()
    gross = pl.col("amount").fill_null(0)
    tax = pl.col("tax").fill_null(0)
    return (
        raw.filter(
            (pl.col("kind") == "sale")
            & (pl.col("source") == "track")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("event_id").is_not_null()
            & (test | (pl.col("amount") > 0))
        )
        .select(
            "program_id",
            sale_id=pl.col("event_id"),
            transaction_id="transaction_id",
            source=pl.lit("self_hosted"),
            amount=pl.max_horizontal(gross - tax, pl.lit(0)),
            gross_amount=gross,
            tax=tax,
            currency=pl.col("currency").fill_null("usd"),
            is_recurring=pl.col("is_recurring").fill_null(False),
            test_mode=test,
            customer_key="customer_key",
            processor_customer_id="processor_customer_id",
            email="email",
            click_id="click_id",
            meta_program_id="meta_program_id",
            metadata_source=pl.lit("track"),
            metadata_missing=pl.lit(False),
            subscription_id="subscription_id",
            invoice_id=pl.lit(None, pl.String),
            payment_intent_id=pl.lit(None, pl.String),
            checkout_session_id=pl.lit(None, pl.String),
            charge_id=pl.lit(None, pl.String),
            occurred_at="occurred_at",
            promo_code="promo_code",
        )
        .collect(engine=ENGINE)
    )
