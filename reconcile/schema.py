"""Frame shapes: what the reconciler reads and what it materialises.

Inputs are coerced once (`prepare_raw`, `prepare_programs`, `prepare_partners`) so the transforms
can rely on exact dtypes: ids are strings, money is Int64 minor units, times are aware UTC.
Outputs are declared here as ordered schemas; `conform` casts and orders a frame to one, which
also gives empty results the right columns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import polars as pl

from ingest.domain.bounds import PerCurrencyValue, per_currency

UTC = pl.Datetime("us", "UTC")
# Every query runs on Polars' in-memory engine: the frames here are mid-sized and reused, and it
# is measurably faster for them than the streaming engine (bench: about 15 % on 1M events).
ENGINE: Literal["in-memory"] = "in-memory"
STR = pl.String()
INT = pl.Int64()
BOOL = pl.Boolean()
STR_LIST = pl.List(pl.String)

# The columns of `raw_events` the reconciler reads (see ingest/storage/schema.py for their meaning).
# `headers` is never read; `body` only for engineer actions (backfill, period_close).
RAW_SCHEMA: dict[str, pl.DataType] = {
    "seq": INT,
    "received_at": UTC,
    "source": STR,
    "kind": STR,
    "program_id": STR,
    "outcome": STR,
    "event_id": STR,
    "event_type": STR,
    "object_id": STR,
    "livemode": BOOL,
    "test_mode": BOOL,
    "occurred_at": UTC,
    "transaction_id": STR,
    "invoice_id": STR,
    "payment_intent_id": STR,
    "checkout_session_id": STR,
    "charge_id": STR,
    "subscription_id": STR,
    "billing_reason": STR,
    "checkout_mode": STR,
    "customer_key": STR,
    "processor_customer_id": STR,
    "email": STR,
    "click_id": STR,
    "partner_code": STR,
    "meta_program_id": STR,
    "sub_metadata_present": BOOL,
    "amount": INT,
    "tax": INT,
    "currency": STR,
    "is_recurring": BOOL,
    "sale_type": STR,
    "refund_id": STR,
    "lead_status": STR,
    "stripe_account": STR,
    "body": STR,
    "promo_code": STR,
}

# What the reconciler reads of each kind of row (the job reads only these; every other column
# is null to the pipeline). tests/reconcile/test_job.py checks the job against the pure pipeline
# on random logs, so a column missing here cannot go unnoticed.
_COMMON = (
    "seq",
    "received_at",
    "source",
    "kind",
    "program_id",
    "outcome",
    "event_id",
    "occurred_at",
    "test_mode",
)
READ_COLUMNS: dict[str, tuple[str, ...]] = {
    "stripe": (
        *_COMMON,
        "livemode",
        "event_type",
        "object_id",
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
        "stripe_account",
        "promo_code",
    ),
    "click": (*_COMMON, "click_id", "partner_code"),
    "other": (
        *_COMMON,
        "livemode",
        "transaction_id",
        "subscription_id",
        "customer_key",
        "processor_customer_id",
        "email",
        "click_id",
        "meta_program_id",
        "amount",
        "tax",
        "currency",
        "is_recurring",
        "refund_id",
        "lead_status",
        "promo_code",
        "object_id",  # promo-code assignments: the processor's promotion code id
        "partner_code",  # promo-code assignments: the partner
        "body",
    ),
}

PROGRAM_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "commission_type": STR,
    "commission_bps": INT,
    "commission_flat": STR,  # a per-currency setting as JSON text (`setting_text`)
    "recurring_months": INT,
    "platform_fee_bps": INT,
    "holding_days": INT,
    "requires_server_side_leads": BOOL,
    "stripe_account_id": STR,
}

# Defaults for settings a program does not set: those of ingest's ProgramSettings (CONTRACT
# section 6; tests/reconcile/test_job.py keeps them equal). `recurring_months` null = lifetime.
PROGRAM_DEFAULTS: dict[str, object] = {
    "commission_type": "percent",
    "commission_bps": 3000,
    "commission_flat": "0",
    "platform_fee_bps": 0,
    "holding_days": 30,
    "requires_server_side_leads": False,
}

PARTNER_SCHEMA: dict[str, pl.DataType] = {"program_id": STR, "code": STR, "email": STR}


def setting_text(value: PerCurrencyValue) -> str:
    """A per-currency setting (ingest/domain/bounds.py `PerCurrency`: minor units in every
    currency, or an object by currency) as the JSON text the frames carry: `500`,
    `{"jpy":500,"usd":5000}` (codes in order, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def setting_value(text: str | None) -> PerCurrencyValue:
    """The setting a JSON text (`setting_text`'s, or the raw log's in any layout) holds; one
    that is not a valid per-currency setting reads as 0 in every currency, the default (as an
    unreadable term always has)."""
    try:
        parsed: Any = json.loads(text) if text is not None else 0
        return per_currency(parsed)
    except ValueError:  # json.JSONDecodeError is one
        return 0


SALES_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "sale_id": STR,
    "transaction_id": STR,
    "source": STR,
    "amount": INT,
    "gross_amount": INT,
    "tax": INT,
    "currency": STR,
    "is_recurring": BOOL,
    "test_mode": BOOL,
    "customer_key": STR,
    "processor_customer_id": STR,
    "email": STR,
    "click_id": STR,
    "subscription_id": STR,
    "invoice_id": STR,
    "payment_intent_id": STR,
    "checkout_session_id": STR,
    "charge_id": STR,
    "metadata_source": STR,
    "partner_code": STR,
    "attribution_rule": STR,
    "unattributed_reason": STR,
    "warnings": STR_LIST,
    "commission": INT,
    "platform_fee": INT,
    "commission_status": STR,
    "refunded": INT,
    "occurred_at": UTC,
    "period": STR,
    # the month its figures count in: `period`, or, for a sale logged after its month was
    # closed, the month it was logged (reconcile/latecomers.py)
    "booked_period": STR,
}

# Commission ledger lines (reconcile/ledger.py, reconcile/periods.py, reconcile/payouts.py).
# Every money column is the line's own contribution, so any of them can be summed over lines
# (per currency): `amount` = commission net of reversals (gross = amount + reversed),
# `platform_fee` = fee net of `platform_fee_reversed`, `refunded` = refunded amount. `kind`
# `commission` is a sale's line in its own month (`period` = `sale_period`), frozen once
# approved; `clawback` (a refund after approval) and `adjustment` (a later backfill, or a later
# change to a closed month) are lines of their own, dated (`dated_at`) when the change happened,
# with `adjusts` = the sale's transaction id. A line is identified by (program_id, sale_id,
# partner_code, kind, cause, period): `cause` is "" for commission lines, else the refund event
# or backfill that made the line. `manual` lines are owners' entries (reconcile/manual.py).
# `payout_id`: the payout batch that holds the line, if any. `booked_seq` / `booked_at`: the log
# position and time of the booking that holds the line (reconcile/bookings.py); `history`: its
# entries since (reconcile/entries.py, JSON).
COMMISSIONS_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "sale_id": STR,
    "transaction_id": STR,
    "partner_code": STR,
    "kind": STR,
    "cause": STR,
    "adjusts": STR,
    "period": STR,
    "sale_period": STR,
    "currency": STR,
    "amount": INT,
    "reversed": INT,
    "platform_fee": INT,
    "platform_fee_reversed": INT,
    "refunded": INT,
    "status": STR,
    "self_referral": BOOL,
    "occurred_at": UTC,
    "available_at": UTC,
    "dated_at": UTC,
    "payout_id": STR,
    "booked_seq": INT,
    "status_reason": STR,
    "status_by": STR,
    "booked_at": UTC,
    "history": STR,
}

# Payout batches (reconcile/payouts.py): one row per batch action of the raw log; `number` is
# the batch's place among its program's batches (1, 2, ...), the order they take lines in;
# `payout_minimum` the program's minimum when it was made (reports/payouts.py nets with it);
# `status` open | paid | cancelled; `snapshot` what it pays, as recorded when it was made (JSON,
# null for a batch made before snapshots); `failures` its rows whose payment failed (JSON list).
PAYOUTS_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "payout_id": STR,
    "number": INT,
    "up_to": STR,
    "created_at": UTC,
    "created_by": STR,
    "status": STR,
    "paid_at": UTC,
    "paid_by": STR,
    "payout_minimum": INT,
    "seq": INT,
    "paid_seq": INT,
    "cancelled_at": UTC,
    "cancelled_by": STR,
    "cancel_reason": STR,
    "snapshot": STR,
    "failures": STR,
}

REFUNDS_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "refund_id": STR,
    "source": STR,
    "event_id": STR,
    "transaction_id": STR,
    "charge_id": STR,
    "sale_id": STR,
    "sale_transaction_id": STR,
    "amount": INT,
    "applied_amount": INT,
    "outcome": STR,
    "commission_reversed": INT,
    "platform_fee_reversed": INT,
    "currency": STR,
    "occurred_at": UTC,
    "period": STR,
    "booked_period": STR,
}

DOUBLE_COUNTS_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "kind": STR,
    "transaction_id": STR,
    "sale_id": STR,
    "connect_record_ids": STR_LIST,
    "duplicate_id": STR,
    "duplicate_transaction_id": STR,
    "matched_on": STR,
    "amount": INT,
    "currency": STR,
    "occurred_at": UTC,
    "partner_code": STR,
    "duplicate_partner_code": STR,
    "partner_mismatch": BOOL,
    "distinct_amount": INT,
}

EXPLAIN_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "sale_id": STR,
    "transaction_id": STR,
    "step": INT,
    "rule": STR,
    "looked_up": STR,
    "found": STR,
    "result": STR,
}

# What the ladder found per sale (table rc_evidence; reconcile/explain.py renders it, with the
# sale's ids and answer read from the sale itself, as the view rc_explain). Lead
# lookups: `*_lead` the binding settled lead, `*_click` its click, `*_partner` that click's
# partner, `*_provisional` whether provisional leads exist; prefix `e` by email, `k` by customer
# key. `f_sale`/`f_partner`: the customer's first attributed sale; `pc_partner` set when earlier.
# `eff_promo`: the sale's promotion code (reconcile/promos.py), `promo_partner` the partner it names.
EVIDENCE_SCHEMA: dict[str, pl.DataType] = {
    "program_id": STR,
    "sale_id": STR,
    "mismatch": BOOL,
    "metadata_missing": BOOL,
    "meta_program_id": STR,
    "eff_click": STR,
    "click_partner": STR,
    "eff_promo": STR,
    "promo_partner": STR,
    "email_norm": STR,
    "e_lead": STR,
    "e_click": STR,
    "e_partner": STR,
    "e_provisional": BOOL,
    "f_sale": STR,
    "f_partner": STR,
    "pc_partner": STR,
    "eff_key": STR,
    "k_lead": STR,
    "k_click": STR,
    "k_partner": STR,
    "k_provisional": BOOL,
}

# The id columns of the raw log: event, processor object and transaction ids, click ids and
# customer identities (the links of reconcile/run/closure.py).
RAW_IDS = (
    "event_id",
    "object_id",
    "transaction_id",
    "invoice_id",
    "payment_intent_id",
    "checkout_session_id",
    "charge_id",
    "subscription_id",
    "click_id",
    "customer_key",
    "processor_customer_id",
)

# Materialised string columns holding ids that are unique, or nearly, per row: stored without
# compression (reconcile/run/job.py `_put` says why).
UNIQUE_STRINGS = frozenset(
    {
        *RAW_IDS,
        "sale_id",
        "email",
        "refund_id",
        "sale_transaction_id",
        "duplicate_id",
        "duplicate_transaction_id",
        "eff_click",
        "eff_key",
        "email_norm",
        "e_lead",
        "e_click",
        "k_lead",
        "k_click",
        "f_sale",
    }
)

UNROUTABLE_SCHEMA: dict[str, pl.DataType] = {
    "event_id": STR,
    "reason": STR,
    "routes_to": STR,
    "event_type": STR,
    "object_id": STR,
    "stripe_account": STR,
    "meta_program_id": STR,
    "livemode": BOOL,
    "test_mode": BOOL,
    "amount": INT,
    "currency": STR,
    "occurred_at": UTC,
    "received_at": UTC,
}


def conform(frame: pl.LazyFrame, schema: dict[str, pl.DataType]) -> pl.LazyFrame:
    """Select exactly `schema`'s columns, in order, cast to its dtypes."""
    return frame.select(pl.col(name).cast(dtype) for name, dtype in schema.items())


def empty(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def _coerce(frame: pl.LazyFrame, schema: dict[str, pl.DataType]) -> pl.LazyFrame:
    names = frame.collect_schema().names()
    exprs: list[pl.Expr] = []
    for name, dtype in schema.items():
        if name not in names:
            exprs.append(pl.lit(None, dtype).alias(name))
        elif dtype == UTC:
            exprs.append(_utc(pl.col(name), frame.collect_schema()[name]).alias(name))
        else:
            exprs.append(pl.col(name).cast(dtype))
    return frame.select(exprs)


def _utc(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    if isinstance(dtype, pl.Datetime):
        if dtype.time_zone is None:
            msg = "naive datetimes are not accepted: the raw log stores aware UTC times"
            raise ValueError(msg)
        return expr.dt.convert_time_zone("UTC").dt.cast_time_unit("us")
    return expr.cast(UTC)


def prepare_raw(raw: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """The raw log, lazily, with the columns of RAW_SCHEMA (missing optional ones are null).

    Lazy on purpose: every stage reads only the rows and columns it needs, so a frame backed by
    the database (duckdb `relation.pl(lazy=True)`) is never loaded whole. Columns that already
    have the right type pass untouched. A row without business time (a processor event without
    `created`) takes its receive time.
    """
    frame = raw.lazy()
    schema = frame.collect_schema()
    fixes: list[pl.Expr] = []
    for name, dtype in RAW_SCHEMA.items():
        if name not in schema:
            fixes.append(pl.lit(None, dtype).alias(name))
        elif dtype == UTC and schema[name] != UTC:
            fixes.append(_utc(pl.col(name), schema[name]).alias(name))
        elif dtype != UTC and schema[name] != dtype:
            fixes.append(pl.col(name).cast(dtype))
    if fixes:
        frame = frame.with_columns(fixes)
    return frame.with_columns(occurred_at=pl.coalesce("occurred_at", "received_at"))


def prepare_programs(programs: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """Program settings with defaults filled in for anything a program leaves unset."""
    frame = _coerce(programs.lazy(), PROGRAM_SCHEMA)
    return frame.with_columns(
        pl.col(name).fill_null(pl.lit(value, PROGRAM_SCHEMA[name]))
        for name, value in PROGRAM_DEFAULTS.items()
    ).unique(subset=["program_id"], keep="first", maintain_order=True)


def prepare_partners(partners: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    return _coerce(partners.lazy(), PARTNER_SCHEMA).unique(
        subset=["program_id", "code"], keep="first", maintain_order=True
    )


def distinct(frame: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    """The first row of each `keys` value, in frame order (nulls compare equal)."""
    return frame.filter(pl.struct(keys).is_first_distinct())


def norm_email(expr: pl.Expr) -> pl.Expr:
    """Emails compare case-insensitively and without surrounding blanks; empty means none."""
    cleaned = expr.str.strip_chars().str.to_lowercase()
    return pl.when(cleaned.str.len_bytes() > 0).then(cleaned)


def period_of(expr: pl.Expr) -> pl.Expr:
    """The 'YYYY-MM' month of an aware UTC timestamp."""
    return expr.dt.strftime("%Y-%m")


def next_month(period: str) -> str:
    """The month after `period` (YYYY-MM)."""
    year, month = int(period[:4]), int(period[5:7])
    return f"{year + month // 12:04d}-{month % 12 + 1:02d}"


def first_open(month: str, shut: Callable[[str], bool]) -> str:
    """`month`, or the first month after it that is not `shut` (reconcile/periods.py and
    reconcile/bookings.py: where a correction of a closed month goes)."""
    while shut(month):
        month = next_month(month)
    return month
