"""Normalisation: the raw log's sale-ish rows become one typed sale per real transaction.

Connect (processor) sales
-------------------------
Only accepted deliveries routed to a program count. Retried deliveries share an event id and are
read once. The sale records are

- checkout sessions (`checkout.session.completed`, `checkout.session.async_payment_succeeded`)
  in mode `payment` or `subscription` (mode `setup` is never a sale), and
- invoices (`invoice.payment_succeeded`, `invoice.paid`).

Records are grouped into sales by a *sale key*: an invoice's key is its id; a session's key is
the invoice id it carries, else (mode subscription) the id of the `subscription_create` invoice
of the same subscription (the smallest id should there be several), else the session id. So a
subscription checkout and its first invoice are one sale whichever arrived first, an invoice
delivered as both `invoice.paid` and `invoice.payment_succeeded` is one sale, and duplicate
event objects (same object id and type) collapse into the sale they describe.

Within a sale, each field is the first non-null value over its records in the record order
(occurred_at, event_id). The sale's amount, tax and currency come from its invoice records when
it has any, else from its session records; a sale whose gross amount is missing or not positive
is no sale (zero-amount invoices, free trials). Amount is net of tax (gross - tax, never below
zero). Attribution metadata comes from the session when the sale has one, else from the
invoice's subscription metadata (`metadata_source` = `subscription`, or `invoice` for an invoice
without subscription). `occurred_at` is the earliest record time; `test_mode` is set when any
record is a test (`livemode: false`). A sale is recurring when it has no session and its invoice's
billing reason is a subscription cycle, update or threshold.

transaction_id = invoice id, else payment intent id, else checkout session id; sale_id = the sale
key.

Self-hosted sales
-----------------
Accepted `track` rows of kind `sale`: sale_id = the row's event id, tax 0, currency default
`usd`. Test sales (which may carry nothing but the flag) are kept and visible; a real one needs a
positive amount.
"""

from __future__ import annotations

import polars as pl

SESSION_EVENTS = ("checkout.session.completed", "checkout.session.async_payment_succeeded")
INVOICE_EVENTS = ("invoice.payment_succeeded", "invoice.paid")
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
    "record_ids",
)


def accepted_stripe(raw: pl.LazyFrame) -> pl.LazyFrame:
    """Accepted, routed processor deliveries, each event id once (retries collapse)."""
    return raw.filter(
        (pl.col("kind") == "stripe")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_id").is_not_null()
    ).unique(subset=["program_id", "event_id"], keep="any")


def is_test() -> pl.Expr:
    return pl.col("test_mode").fill_null(False) | (pl.col("livemode") == False).fill_null(False)  # noqa: E712


def _first(name: str, where: pl.Expr | None = None) -> pl.Expr:
    col = pl.col(name) if where is None else pl.col(name).filter(where)
    return col.drop_nulls().first()


def connect_sales(stripe: pl.LazyFrame) -> pl.LazyFrame:
    """One typed sale per processor transaction (see the module docstring)."""
    session = pl.col("event_type").is_in(SESSION_EVENTS)
    records = stripe.filter(
        (session & pl.col("checkout_mode").is_in(SALE_MODES)) | pl.col("event_type").is_in(INVOICE_EVENTS)
    ).with_columns(
        is_session=session,
        test_mode=is_test(),
        invoice_id=pl.when(session)
        .then(pl.col("invoice_id"))
        .otherwise(pl.coalesce("object_id", "invoice_id")),
        checkout_session_id=pl.when(session)
        .then(pl.coalesce("object_id", "checkout_session_id"))
        .otherwise(pl.col("checkout_session_id")),
    )
    creates = (
        records.filter(
            ~pl.col("is_session")
            & (pl.col("billing_reason") == "subscription_create")
            & pl.col("subscription_id").is_not_null()
        )
        .group_by("program_id", "subscription_id")
        .agg(create_invoice=pl.col("invoice_id").min())
    )
    keyed = records.join(creates, on=["program_id", "subscription_id"], how="left").with_columns(
        sale_key=pl.when(~pl.col("is_session"))
        .then(pl.col("invoice_id"))
        .when(pl.col("invoice_id").is_not_null())
        .then(pl.col("invoice_id"))
        .when((pl.col("checkout_mode") == "subscription") & pl.col("create_invoice").is_not_null())
        .then(pl.col("create_invoice"))
        .otherwise(pl.col("checkout_session_id"))
    )
    is_s = pl.col("is_session")
    grouped = (
        keyed.filter(pl.col("sale_key").is_not_null())
        .sort("occurred_at", "event_id")
        .group_by("program_id", "sale_key")
        .agg(
            has_session=is_s.any(),
            has_invoice=(~is_s).any(),
            s_gross=_first("amount", is_s),
            s_tax=_first("tax", is_s),
            s_currency=_first("currency", is_s),
            s_email=_first("email", is_s),
            s_customer=_first("processor_customer_id", is_s),
            s_click=_first("click_id", is_s),
            s_key=_first("customer_key", is_s),
            s_meta_program=_first("meta_program_id", is_s),
            i_gross=_first("amount", ~is_s),
            i_tax=_first("tax", ~is_s),
            i_currency=_first("currency", ~is_s),
            i_email=_first("email", ~is_s),
            i_customer=_first("processor_customer_id", ~is_s),
            i_click=_first("click_id", ~is_s),
            i_key=_first("customer_key", ~is_s),
            i_meta_program=_first("meta_program_id", ~is_s),
            i_meta_present=_first("sub_metadata_present", ~is_s),
            i_reason=_first("billing_reason", ~is_s),
            invoice_id=_first("invoice_id"),
            payment_intent_id=_first("payment_intent_id"),
            checkout_session_id=_first("checkout_session_id"),
            charge_id=_first("charge_id"),
            subscription_id=_first("subscription_id"),
            occurred_at=pl.col("occurred_at").min(),
            test_mode=pl.col("test_mode").any(),
            record_ids=pl.col("event_id").unique().sort(),
        )
    )
    has_s = pl.col("has_session")
    has_i = pl.col("has_invoice")
    gross = pl.when(has_i).then(pl.col("i_gross")).otherwise(pl.col("s_gross"))
    tax = pl.when(has_i).then(pl.col("i_tax")).otherwise(pl.col("s_tax")).fill_null(0)
    meta_source = (
        pl.when(has_s)
        .then(pl.lit("checkout_session"))
        .when(pl.col("subscription_id").is_not_null())
        .then(pl.lit("subscription"))
        .otherwise(pl.lit("invoice"))
    )
    return (
        grouped.with_columns(gross_amount=gross, tax=tax, metadata_source=meta_source)
        .filter(pl.col("gross_amount") > 0)
        .select(
            "program_id",
            sale_id=pl.col("sale_key"),
            transaction_id=pl.coalesce("invoice_id", "payment_intent_id", "checkout_session_id"),
            source=pl.lit("connect"),
            amount=pl.max_horizontal(pl.col("gross_amount") - pl.col("tax"), pl.lit(0)),
            gross_amount="gross_amount",
            tax="tax",
            currency=pl.when(has_i)
            .then(pl.coalesce("i_currency", "s_currency"))
            .otherwise(pl.col("s_currency")),
            is_recurring=~has_s & pl.col("i_reason").is_in(RECURRING_REASONS).fill_null(False),
            test_mode="test_mode",
            customer_key=pl.when(has_s).then(pl.col("s_key")).otherwise(pl.col("i_key")),
            processor_customer_id=pl.coalesce("s_customer", "i_customer"),
            email=pl.coalesce("s_email", "i_email"),
            click_id=pl.when(has_s).then(pl.col("s_click")).otherwise(pl.col("i_click")),
            meta_program_id=pl.when(has_s).then(pl.col("s_meta_program")).otherwise(pl.col("i_meta_program")),
            metadata_source="metadata_source",
            metadata_missing=(pl.col("metadata_source") == "subscription")
            & ~pl.col("i_meta_present").fill_null(False),
            subscription_id="subscription_id",
            invoice_id="invoice_id",
            payment_intent_id="payment_intent_id",
            checkout_session_id="checkout_session_id",
            charge_id="charge_id",
            occurred_at="occurred_at",
            record_ids="record_ids",
        )
    )


def self_hosted_sales(raw: pl.LazyFrame) -> pl.LazyFrame:
    """Accepted self-hosted `track/sale` rows as typed sales (test sales included)."""
    test = is_test()
    gross = pl.col("amount").fill_null(0)
    tax = pl.col("tax").fill_null(0)
    return raw.filter(
        (pl.col("kind") == "sale")
        & (pl.col("source") == "track")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_id").is_not_null()
        & (test | (pl.col("amount") > 0))
    ).select(
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
        record_ids=pl.concat_list(pl.col("event_id")),
    )
