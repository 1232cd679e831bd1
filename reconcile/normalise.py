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

Records are ordered by (occurred_at, event_id). A sale has an invoice side and a session side,
each read from its earliest record. Amount, tax and currency come from the invoice side when
there is one, else from the session side; a sale whose gross amount is missing or not positive
is no sale (zero-amount invoices, free trials). Amount is net of tax (gross - tax, never below
zero). Attribution metadata (click id, customer key, program id) comes from the session side when
the sale has one, else from the invoice's subscription metadata (`metadata_source` =
`subscription`, or `invoice` for an invoice without subscription). Email and processor customer:
session side first. Ids (invoice, payment intent, charge, subscription): invoice side first;
checkout session id: session side first. `occurred_at` is the earliest record time; `test_mode`
is set when any record is a test (`livemode: false`); `record_ids` lists every record's event id
in record order. A sale is recurring when it has no session and its invoice's billing reason is
a subscription cycle, update or threshold.

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

from reconcile.schema import distinct, materialise

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


STRIPE_COLUMNS = (
    "program_id",
    "event_id",
    "event_type",
    "object_id",
    "livemode",
    "test_mode",
    "occurred_at",
    "invoice_id",
    "payment_intent_id",
    "checkout_session_id",
    "charge_id",
    "subscription_id",
    "billing_reason",
    "checkout_mode",
    "customer_key",
    "processor_customer_id",
    "email",
    "click_id",
    "meta_program_id",
    "sub_metadata_present",
    "amount",
    "tax",
    "currency",
    "refund_id",
)


def accepted_stripe(raw: pl.LazyFrame) -> pl.LazyFrame:
    """Accepted, routed processor deliveries, each event id once (retries collapse)."""
    accepted = raw.filter(
        (pl.col("kind") == "stripe")
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("event_id").is_not_null()
    ).select(STRIPE_COLUMNS)
    return distinct(accepted, ["program_id", "event_id"])


def is_test() -> pl.Expr:
    return pl.col("test_mode").fill_null(False) | (pl.col("livemode") == False).fill_null(False)  # noqa: E712


SIDE_FIELDS = (
    "amount",
    "tax",
    "currency",
    "email",
    "processor_customer_id",
    "click_id",
    "customer_key",
    "meta_program_id",
    "sub_metadata_present",
    "billing_reason",
    "invoice_id",
    "payment_intent_id",
    "checkout_session_id",
    "charge_id",
    "subscription_id",
)


def _sale_records(stripe: pl.LazyFrame) -> pl.LazyFrame:
    """Sale-ish processor records with their sale key (see the module docstring)."""
    session = pl.col("event_type").is_in(SESSION_EVENTS)
    records = materialise(
        stripe.filter(
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
    by_subscription = (
        pl.col("is_session")
        & pl.col("invoice_id").is_null()
        & (pl.col("checkout_mode") == "subscription")
        & pl.col("subscription_id").is_not_null()
    )
    direct = records.filter(~by_subscription).with_columns(
        sale_key=pl.coalesce(pl.col("invoice_id"), pl.col("checkout_session_id"))
    )
    looked_up = (
        records.filter(by_subscription)
        .join(creates, on=["program_id", "subscription_id"], how="left")
        .with_columns(sale_key=pl.coalesce("create_invoice", "checkout_session_id"))
        .drop("create_invoice")
    )
    return pl.concat([direct, looked_up]).filter(pl.col("sale_key").is_not_null())


def connect_sales(stripe: pl.LazyFrame) -> pl.LazyFrame:
    """One typed sale per processor transaction (see the module docstring)."""
    key = ["program_id", "sale_key"]
    ordered = materialise(_sale_records(stripe).sort("occurred_at", "event_id"))
    summary = ordered.group_by(key).agg(
        occurred_at=pl.col("occurred_at").min(),
        test_mode=pl.col("test_mode").any(),
        record_ids=pl.col("event_id"),
    )
    earliest = materialise(distinct(ordered, [*key, "is_session"]))

    def side(is_session: bool, prefix: str) -> pl.LazyFrame:
        chosen = pl.col("is_session") if is_session else ~pl.col("is_session")
        return earliest.filter(chosen).select(
            *key,
            pl.lit(True).alias(f"has_{prefix}"),
            *(pl.col(f).alias(f"{prefix}_{f}") for f in SIDE_FIELDS),
        )

    grouped = summary.join(side(False, "i"), on=key, how="left").join(side(True, "s"), on=key, how="left")
    has_s = pl.col("has_s").fill_null(False)
    has_i = pl.col("has_i").fill_null(False)

    def pick(field: str) -> pl.Expr:
        """The sale's value of an amount/metadata field: invoice side when it has one."""
        return pl.when(has_i).then(pl.col(f"i_{field}")).otherwise(pl.col(f"s_{field}"))

    def meta(field: str) -> pl.Expr:
        """Attribution metadata: the session's when the sale has one, else the invoice's."""
        return pl.when(has_s).then(pl.col(f"s_{field}")).otherwise(pl.col(f"i_{field}"))

    subscription_id = pl.coalesce("i_subscription_id", "s_subscription_id")
    meta_source = (
        pl.when(has_s)
        .then(pl.lit("checkout_session"))
        .when(subscription_id.is_not_null())
        .then(pl.lit("subscription"))
        .otherwise(pl.lit("invoice"))
    )
    gross = pick("amount")
    tax = pick("tax").fill_null(0)
    invoice_id = pl.coalesce("i_invoice_id", "s_invoice_id")
    intent_id = pl.coalesce("i_payment_intent_id", "s_payment_intent_id")
    session_id = pl.coalesce("s_checkout_session_id", "i_checkout_session_id")
    return (
        grouped.filter(gross > 0)
        .with_columns(metadata_source=meta_source)
        .select(
            "program_id",
            sale_id=pl.col("sale_key"),
            transaction_id=pl.coalesce(invoice_id, intent_id, session_id),
            source=pl.lit("connect"),
            amount=pl.max_horizontal(gross - tax, pl.lit(0)),
            gross_amount=gross,
            tax=tax,
            currency=pl.when(has_i)
            .then(pl.coalesce("i_currency", "s_currency"))
            .otherwise(pl.col("s_currency")),
            is_recurring=~has_s & pl.col("i_billing_reason").is_in(RECURRING_REASONS).fill_null(False),
            test_mode="test_mode",
            customer_key=meta("customer_key"),
            processor_customer_id=pl.coalesce("s_processor_customer_id", "i_processor_customer_id"),
            email=pl.coalesce("s_email", "i_email"),
            click_id=meta("click_id"),
            meta_program_id=meta("meta_program_id"),
            metadata_source="metadata_source",
            metadata_missing=(pl.col("metadata_source") == "subscription")
            & ~pl.col("i_sub_metadata_present").fill_null(False),
            subscription_id=subscription_id,
            invoice_id=invoice_id,
            payment_intent_id=intent_id,
            checkout_session_id=session_id,
            charge_id=pl.coalesce("i_charge_id", "s_charge_id"),
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
