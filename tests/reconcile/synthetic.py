"""A large synthetic raw log, built vectorised with Polars, for benchmarks of the reconciler.

`synthetic_log(n)` returns about `n` raw_events rows (all columns of ingest/schema.py) with a
realistic mix: clicks, leads (some provisional), checkout sessions in payment and subscription
mode, their first invoices, renewals with and without subscription metadata, retried deliveries,
self-hosted sales (some duplicating connect sales, some refused at ingest), refunds of both kinds
and a few unroutable events. Deterministic for a given seed (hash-based pseudo-random numbers).
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import polars as pl

from tests.reconcile.builders import PARTNER_POLARS_SCHEMA, PROGRAM_POLARS_SCHEMA, RAW_POLARS_SCHEMA

START = datetime(2025, 1, 1, tzinfo=UTC)
SPAN_SECONDS = 400 * 86_400


class _Random:
    """Vectorised pseudo-random draws: hashes of row numbers, one salt per draw."""

    def __init__(self, seed: int) -> None:
        self.salts = itertools.count(seed * 1_000)

    def ints(self, low: int, high: int, n: int) -> pl.Series:
        hashed = pl.int_range(0, n, eager=True).hash(next(self.salts))
        return (hashed % (high - low)).cast(pl.Int64) + low

    def chance(self, p: float, n: int) -> pl.Series:
        return self.ints(0, 1_000_000, n) < int(p * 1_000_000)

    def times(self, n: int) -> pl.Series:
        micros = self.ints(0, SPAN_SECONDS, n) * 1_000_000
        return micros.cast(pl.Datetime("us", "UTC")) + (START - datetime(1970, 1, 1, tzinfo=UTC))


def _s(prefix: str, numbers: pl.Series) -> pl.Series:
    return pl.select(pl.lit(prefix) + numbers.cast(pl.String)).to_series()


def _maybe(values: pl.Series, keep: pl.Series) -> pl.Series:
    return pl.select(pl.when(keep).then(values)).to_series()


def _const(value: str | bool, n: int) -> pl.Series:
    return pl.repeat(value, n, eager=True)


def _frame(columns: dict[str, pl.Series], height: int) -> pl.DataFrame:
    """A raw frame of `height` rows: the given columns, all others NULL (body/headers '{}')."""
    defaults: dict[str, str | bool] = {
        "body": "{}",
        "headers": "{}",
        "test_mode": False,
        "outcome": "accepted",
    }
    data = {
        name: columns[name]
        if name in columns
        else pl.repeat(defaults.get(name), height, eager=True, dtype=dtype)
        for name, dtype in RAW_POLARS_SCHEMA.items()
    }
    return pl.DataFrame(data).cast(RAW_POLARS_SCHEMA)  # type: ignore[arg-type]


def synthetic_log(
    n: int, *, seed: int = 7, programs: int = 50
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(raw, programs, partners) with about `n` raw rows."""
    rnd = _Random(seed)
    customers = max(n // 10, 10)
    n_clicks, n_leads = int(n * 0.30), int(n * 0.15)
    n_sessions, n_renewals = int(n * 0.15), int(n * 0.20)
    n_track, n_refunds, n_retries = int(n * 0.08), int(n * 0.05), int(n * 0.04)
    parts: list[pl.DataFrame] = []

    click_program = rnd.ints(0, programs, n_clicks)
    parts.append(
        _frame(
            {
                "source": _const("track", n_clicks),
                "kind": _const("click", n_clicks),
                "program_id": _s("prog_", click_program),
                "event_id": _s("clk_", pl.int_range(0, n_clicks, eager=True)),
                "event_type": _const("track.click", n_clicks),
                "click_id": _s("clk_", pl.int_range(0, n_clicks, eager=True)),
                "partner_code": _s("p", rnd.ints(0, 20, n_clicks)),
                "occurred_at": rnd.times(n_clicks),
                "received_at": rnd.times(n_clicks),
            },
            n_clicks,
        )
    )

    # Every customer belongs to the program of "its" click; leads and sales point at that click.
    def own_click(of: pl.Series) -> pl.Series:
        return (of * 7919) % n_clicks

    def program_of(of: pl.Series) -> pl.Series:
        return _s("prog_", click_program.gather(own_click(of)))

    lead_customer = rnd.ints(0, customers, n_leads)
    parts.append(
        _frame(
            {
                "source": _const("track", n_leads),
                "kind": _const("lead", n_leads),
                "program_id": program_of(lead_customer),
                "event_id": _s("lead_", pl.int_range(0, n_leads, eager=True)),
                "event_type": _const("track.lead", n_leads),
                "customer_key": _s("ck_", lead_customer),
                "email": _maybe(_s("u", lead_customer) + "@x.test", rnd.chance(0.7, n_leads)),
                "click_id": _maybe(_s("clk_", own_click(lead_customer)), rnd.chance(0.8, n_leads)),
                "lead_status": pl.select(
                    pl.when(rnd.chance(0.1, n_leads)).then(pl.lit("provisional")).otherwise(pl.lit("settled"))
                ).to_series(),
                "occurred_at": rnd.times(n_leads),
                "received_at": rnd.times(n_leads),
            },
            n_leads,
        )
    )

    # Checkout sessions; half are subscriptions, with a first invoice each.
    session_customer = rnd.ints(0, customers, n_sessions)
    sub = rnd.chance(0.5, n_sessions)
    k = pl.int_range(0, n_sessions, eager=True)
    session_time = rnd.times(n_sessions)
    test = rnd.chance(0.02, n_sessions)
    parts.append(
        _frame(
            {
                "source": _const("stripe", n_sessions),
                "kind": _const("stripe", n_sessions),
                "program_id": program_of(session_customer),
                "event_id": _s("evt_s", k),
                "event_type": _const("checkout.session.completed", n_sessions),
                "object_id": _s("cs_", k),
                "livemode": ~test,
                "test_mode": test,
                "checkout_session_id": _s("cs_", k),
                "checkout_mode": pl.select(
                    pl.when(sub).then(pl.lit("subscription")).otherwise(pl.lit("payment"))
                ).to_series(),
                "invoice_id": _maybe(_s("in_f", k), sub),
                "subscription_id": _maybe(_s("sub_", k), sub),
                "payment_intent_id": _maybe(_s("pi_", k), ~sub),
                "customer_key": _maybe(_s("ck_", session_customer), rnd.chance(0.8, n_sessions)),
                "click_id": _maybe(_s("clk_", own_click(session_customer)), rnd.chance(0.5, n_sessions)),
                "processor_customer_id": _s("cus_", session_customer),
                "email": _maybe(_s("u", session_customer) + "@x.test", rnd.chance(0.6, n_sessions)),
                "sub_metadata_present": _const(True, n_sessions),
                "amount": rnd.ints(100, 50_000, n_sessions),
                "tax": _maybe(rnd.ints(0, 2_000, n_sessions), rnd.chance(0.3, n_sessions)),
                "currency": _const("usd", n_sessions),
                "occurred_at": session_time,
                "received_at": session_time,
            },
            n_sessions,
        )
    )
    firsts = k.filter(sub)
    n_firsts = firsts.len()
    parts.append(
        _frame(
            {
                "source": _const("stripe", n_firsts),
                "kind": _const("stripe", n_firsts),
                "program_id": program_of(session_customer.gather(firsts)),
                "event_id": _s("evt_f", firsts),
                "event_type": _const("invoice.paid", n_firsts),
                "object_id": _s("in_f", firsts),
                "invoice_id": _s("in_f", firsts),
                "billing_reason": _const("subscription_create", n_firsts),
                "subscription_id": _s("sub_", firsts),
                "charge_id": _s("ch_f", firsts),
                "processor_customer_id": _s("cus_", session_customer.gather(firsts)),
                "sub_metadata_present": _const(False, n_firsts),
                "amount": rnd.ints(100, 50_000, n_firsts),
                "currency": _const("usd", n_firsts),
                "occurred_at": session_time.gather(firsts),
                "received_at": session_time.gather(firsts),
                "livemode": _const(True, n_firsts),
            },
            n_firsts,
        )
    )

    # Renewals of random subscriptions, 70 % with subscription metadata; some of zero amount.
    owner = firsts.gather(rnd.ints(0, max(n_firsts, 1), n_renewals))
    owner_customer = session_customer.gather(owner)
    meta = rnd.chance(0.7, n_renewals)
    r = pl.int_range(0, n_renewals, eager=True)
    parts.append(
        _frame(
            {
                "source": _const("stripe", n_renewals),
                "kind": _const("stripe", n_renewals),
                "program_id": program_of(owner_customer),
                "event_id": _s("evt_r", r),
                "event_type": _const("invoice.payment_succeeded", n_renewals),
                "object_id": _s("in_r", r),
                "invoice_id": _s("in_r", r),
                "billing_reason": _const("subscription_cycle", n_renewals),
                "subscription_id": _s("sub_", owner),
                "charge_id": _s("ch_r", r),
                "payment_intent_id": _s("pi_r", r),
                "customer_key": _maybe(_s("ck_", owner_customer), meta),
                "sub_metadata_present": meta,
                "processor_customer_id": _s("cus_", owner_customer),
                "amount": rnd.ints(0, 50_000, n_renewals),
                "tax": _maybe(rnd.ints(0, 2_000, n_renewals), rnd.chance(0.3, n_renewals)),
                "currency": _const("usd", n_renewals),
                "occurred_at": rnd.times(n_renewals),
                "received_at": rnd.times(n_renewals),
                "livemode": _const(True, n_renewals),
            },
            n_renewals,
        )
    )

    # Self-hosted sales: 10 % repeat a renewal (double counts), 3 % refused at ingest.
    track_customer = rnd.ints(0, customers, n_track)
    tx = pl.select(
        pl.when(rnd.chance(0.1, n_track))
        .then(_s("in_r", rnd.ints(0, max(n_renewals, 1), n_track)))
        .otherwise(_s("tx_", pl.int_range(0, n_track, eager=True)))
    ).to_series()
    parts.append(
        _frame(
            {
                "source": _const("track", n_track),
                "kind": _const("sale", n_track),
                "program_id": program_of(track_customer),
                "outcome": pl.select(
                    pl.when(rnd.chance(0.03, n_track)).then(pl.lit("duplicate")).otherwise(pl.lit("accepted"))
                ).to_series(),
                "event_id": _s("sale_", pl.int_range(0, n_track, eager=True)),
                "event_type": _const("track.sale", n_track),
                "transaction_id": tx,
                "customer_key": _s("ck_", track_customer),
                "email": _maybe(_s("u", track_customer) + "@x.test", rnd.chance(0.5, n_track)),
                "amount": rnd.ints(1, 30_000, n_track),
                "currency": _const("usd", n_track),
                "occurred_at": rnd.times(n_track),
                "received_at": rnd.times(n_track),
            },
            n_track,
        )
    )

    # Refunds: half self-hosted (of self-hosted sales), half charge.refunded (of renewals).
    half = n_refunds // 2
    target = rnd.ints(0, max(n_track, 1), half)
    parts.append(
        _frame(
            {
                "source": _const("track", half),
                "kind": _const("refund", half),
                "program_id": program_of(track_customer.gather(target)),
                "event_id": _s("rfd_", pl.int_range(0, half, eager=True)),
                "event_type": _const("track.refund", half),
                "transaction_id": _s("tx_", target),
                "refund_id": _s("re_", pl.int_range(0, half, eager=True)),
                "amount": rnd.ints(1, 20_000, half),
                "occurred_at": rnd.times(half),
                "received_at": rnd.times(half),
            },
            half,
        )
    )
    charge = rnd.ints(0, max(n_renewals, 1), half)
    parts.append(
        _frame(
            {
                "source": _const("stripe", half),
                "kind": _const("stripe", half),
                "program_id": program_of(owner_customer.gather(charge)),
                "event_id": _s("evt_c", pl.int_range(0, half, eager=True)),
                "event_type": _const("charge.refunded", half),
                "object_id": _s("ch_r", charge),
                "charge_id": _s("ch_r", charge),
                "payment_intent_id": _s("pi_r", charge),
                "amount": rnd.ints(1, 50_000, half),
                "currency": _const("usd", half),
                "occurred_at": rnd.times(half),
                "received_at": rnd.times(half),
                "livemode": _const(True, half),
            },
            half,
        )
    )

    raw = pl.concat(parts)
    stripe = raw.filter(pl.col("kind") == "stripe")
    retries = stripe.sample(min(n_retries, stripe.height), seed=seed).with_columns(
        outcome=pl.lit("duplicate")
    )
    unroutable = stripe.head(min(1_000, stripe.height)).with_columns(
        program_id=pl.lit(None, pl.String),
        outcome=pl.lit("unroutable"),
        event_id=pl.col("event_id") + "u",
    )
    raw = pl.concat([raw, retries, unroutable]).sample(fraction=1.0, shuffle=True, seed=seed)
    raw = raw.with_columns(seq=pl.int_range(1, raw.height + 1, dtype=pl.Int64))
    return raw, _programs(programs), _partners(programs)


def _programs(count: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "program_id": [f"prog_{i}" for i in range(count)],
            "commission_type": ["flat" if i % 5 == 0 else "percent" for i in range(count)],
            "commission_bps": [2_000 + 100 * (i % 10) for i in range(count)],
            "commission_flat": [500] * count,
            "recurring_months": [None if i % 3 == 0 else i % 13 for i in range(count)],
            "platform_fee_bps": [500] * count,
            "holding_days": [30] * count,
            "requires_server_side_leads": [i % 4 == 0 for i in range(count)],
            "stripe_account_id": [f"acct_{i}" for i in range(count)],
        },
        schema=PROGRAM_POLARS_SCHEMA,
    )


def _partners(count: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "program_id": [f"prog_{i}" for i in range(count) for _ in range(20)],
            "code": [f"p{j}" for _ in range(count) for j in range(20)],
            "email": [f"u{j}@x.test" for _ in range(count) for j in range(20)],
        },
        schema=PARTNER_POLARS_SCHEMA,
    )
