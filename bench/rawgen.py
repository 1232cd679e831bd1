"""bench/rawgen: a realistic raw event log for the reconcile benchmark, vectorised and seeded.

`generate(n)` draws 13 months (2025-01-01 to 2026-02-01) of traffic of 20 programs with 40
partners each, as ingest would have logged it, and returns the first `n` events in arrival order
(`seq` 1..n). Everything is drawn with numpy from one seed; ids are bijective hashes of counters
(`clk_`, `ck_`, `cus_`, `cs_`, `in_`, `sub_`, `pi_`, `ch_`, `evt_`... followed by up to 20 digits).

The model. Customers (about 8.5 % of the events) each belong to one program (program sizes are
Zipf-like), came through one partner's link (80 %; the others are organic) and start at a time
that grows with the business. Programs 16-19 bill outside the processor (self-hosted track
sales); the others use Connect, and programs 2, 5 and 9 also report their Connect sales through
track (double counts). The mix, as shares of the log:

- clicks 48 %: one per customer, the rest anonymous traffic;
- leads 10 %: 85 % settled, 15 % provisional; provisional ones carry the click, settled ones
  mostly (the others are bound through an earlier provisional lead);
- checkout sessions 8 %: 55 % subscription (70 % carrying their invoice id), 43 % payment,
  2 % setup; svc metadata on 90 % (0.5 % with a click of no program, 0.3 % naming another
  program), 1 % test mode, 35 % taxed, three currencies by program;
- first invoices (`subscription_create`) 5 % merged with their subscription checkout; renewals
  19 % (96 % `subscription_cycle`, 4 % `subscription_update`, 2 % zero amount), 25 % without
  subscription metadata; invoices in the current (`parent.subscription_details`) and legacy
  layout (60/40); 25 % of first invoices and 15 % of renewals delivered as both `invoice.paid`
  and `invoice.payment_succeeded` (duplicate event objects);
- self-hosted track sales 7 %: 78 % own transactions, 15 % double counts of Connect sales,
  4 % repeats of an own transaction, 3 % refused at ingest (outcome duplicate); 1.5 % test;
- refunds 2 %: track refunds of own sales (3 % of an unknown transaction) and `charge.refunded`
  with cumulative amounts (30 % of partial ones refunded again later);
- retried deliveries (same event id, outcome duplicate) 3 % of processor events; unroutable
  processor events 0.3 %;
- engineer actions: a metadata fix for 0.2 % of subscriptions renewing without metadata and one
  backfill per program that has fixes; `period_closes` programs close every month up to two
  months before the end (default none: each close costs the reconciler one more pass);
  `payouts` programs make a payout batch on the 3rd of every month up to the previous month's
  end, marked paid on the 8th (default none).

Why one module of about 670 lines: `generate` is one seeded draw (about 380 of them) in which
each kind of event takes its counts, ids and times from the draws before it, in order; split, the
parts would pass that state back and forth.
"""

from __future__ import annotations

import functools
import json
import tempfile
import zlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from bench.rawbodies import render
from ingest.storage import migrations
from ingest.storage.schema import RAW_EVENT_COLUMNS

START = datetime(2025, 1, 1, tzinfo=UTC)
END = datetime(2026, 2, 1, tzinfo=UTC)
NOW = END + timedelta(hours=1)
US = 1_000_000
DAY = 86_400 * US
MONTH = int(30.44 * DAY)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T0 = (START - _EPOCH) // timedelta(microseconds=1)
T1 = (END - _EPOCH) // timedelta(microseconds=1)

PROGRAMS = 20
PARTNERS = 40
SELF_HOSTED = np.arange(16, 20)
DOUBLE_REPORTING = np.array([2, 5, 9])
PROGRAM_IDS = pl.Series([f"prog_{i:02d}" for i in range(PROGRAMS)])
PARTNER_CODES = pl.Series([f"pt{j:03d}" for j in range(PARTNERS)])
CURRENCIES = pl.Series(["eur" if i % 7 == 3 else "gbp" if i % 11 == 5 else "usd" for i in range(PROGRAMS)])
PRICES = np.array([900, 1_900, 2_900, 4_900, 9_900, 19_900, 49_900])
PRICE_WEIGHTS = np.array([0.10, 0.25, 0.25, 0.20, 0.12, 0.06, 0.02])
# Rows drawn per unit of `scale` (see `generate`): about 0.845, so n / 0.845 * 1.03 leaves a margin.
_SCALE = 1.03 / 0.845

_SQL_TO_POLARS: dict[str, pl.DataType] = {
    "BIGINT": pl.Int64(),
    "TIMESTAMPTZ": pl.Datetime("us", "UTC"),
    "VARCHAR": pl.String(),
    "BOOLEAN": pl.Boolean(),
}
RAW_POLARS: dict[str, pl.DataType] = {name: _SQL_TO_POLARS[sql.split()[0]] for name, sql in RAW_EVENT_COLUMNS}
# Generated frames: raw_events without `headers` (rendered later), plus the body template name.
EVENT_SCHEMA: dict[str, pl.DataType] = {
    **{k: v for k, v in RAW_POLARS.items() if k != "headers"},
    "tpl": pl.String(),
}


@dataclass(frozen=True)
class Log:
    """Generated rows (`events`: raw_events columns but `headers`, plus `tpl`; `body` set for engineer
    actions only) and the `programs` and `partners` rows of the control plane."""

    events: pl.DataFrame
    programs: pl.DataFrame
    partners: pl.DataFrame

    def raw(self) -> pl.DataFrame:
        """The rows exactly as `raw_events` holds them (bodies and headers rendered)."""
        return render(self.events)


def _mix(numbers: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64, so distinct numbers give distinct ids."""
    z = numbers.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def ident(prefix: str, numbers: np.ndarray, keep: np.ndarray | None = None, *, shard: int = 0) -> pl.Series:
    """`prefix` + a hash of each number (null where `keep` is false). Each `shard` (`generate`)
    hashes with a salt of its own, so the ids of two shards never meet (shard 0: as ever)."""
    salt = zlib.crc32(prefix.encode() if shard == 0 else f"{prefix}#{shard}".encode())
    digits = pl.Series(_mix(numbers, salt)).cast(pl.String)
    return _keep(prefix + digits, keep)


def _keep(values: pl.Series, keep: np.ndarray | None) -> pl.Series:
    if keep is None:
        return values
    return pl.select(pl.when(pl.lit(pl.Series(keep))).then(pl.lit(values))).to_series()


def _choose(mask: np.ndarray, yes: str, no: str) -> pl.Series:
    return pl.select(pl.when(pl.lit(pl.Series(mask))).then(pl.lit(yes)).otherwise(pl.lit(no))).to_series()


class _Draw:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, PROGRAMS + 1) ** 0.8
        self.program_weights = weights / weights.sum()

    def chance(self, p: float, n: int) -> np.ndarray:
        return self.rng.random(n) < p

    def pick(self, pool: np.ndarray, n: int) -> np.ndarray:
        return pool[self.rng.integers(0, len(pool), n)]

    def programs(self, n: int) -> np.ndarray:
        return self.rng.choice(PROGRAMS, n, p=self.program_weights)

    def partners(self, n: int) -> np.ndarray:
        return np.minimum(self.rng.zipf(1.6, n) - 1, PARTNERS - 1)

    def times(self, n: int) -> np.ndarray:
        """Microsecond times in [START, END - 1 day), denser towards the end (growth)."""
        return T0 + (self.rng.random(n) ** 0.8 * (T1 - T0 - DAY)).astype(np.int64)

    def after(self, t: np.ndarray, mean: float) -> np.ndarray:
        """Some exponential delay after `t`, never past END."""
        return np.minimum(t + self.rng.exponential(mean, len(t)).astype(np.int64), T1 - 1)

    def prices(self, n: int) -> np.ndarray:
        return self.rng.choice(PRICES, n, p=PRICE_WEIGHTS)


def _frame(columns: dict[str, object]) -> pl.DataFrame:
    """A part of the log: array columns as given, scalars broadcast, times from microseconds."""
    arrays = {k: v for k, v in columns.items() if isinstance(v, (pl.Series, np.ndarray))}
    frame = pl.DataFrame({k: pl.Series(k, v) for k, v in arrays.items()})
    frame = frame.with_columns(pl.lit(v).alias(k) for k, v in columns.items() if k not in arrays)
    times = [pl.col(c).cast(pl.Datetime("us", "UTC")) for c in ("occurred_at", "received_at") if c in frame]
    return frame.with_columns(times)


def _stripe(columns: dict[str, object]) -> pl.DataFrame:
    base: dict[str, object] = {"source": "stripe", "kind": "stripe", "outcome": "accepted"}
    return _frame({**base, **columns})


def _track(kind: str, columns: dict[str, object]) -> pl.DataFrame:
    base: dict[str, object] = {
        "source": "track",
        "kind": kind,
        "outcome": "accepted",
        "event_type": f"track.{kind}",
        "tpl": kind,
        "test_mode": False,
    }
    return _frame({**base, **columns})


def _twins(frame: pl.DataFrame, chosen: np.ndarray) -> pl.DataFrame:
    """The `chosen` invoice rows delivered again under the other invoice event type."""
    return frame.filter(pl.Series(chosen)).with_columns(
        event_type=pl.when(pl.col("event_type") == "invoice.paid")
        .then(pl.lit("invoice.payment_succeeded"))
        .otherwise(pl.lit("invoice.paid")),
        received_at=pl.col("received_at") + pl.duration(seconds=2),
    )


def _micros(series: pl.Series) -> np.ndarray:
    return series.dt.epoch("us").to_numpy()


def _later(series: pl.Series, micros: np.ndarray) -> pl.Series:
    return series + pl.Series(micros).cast(pl.Duration("us"))


def generate(
    n: int, *, seed: int = 20_250_101, period_closes: int = 0, payouts: int = 0, shard: int = 0
) -> Log:
    """The first `n` events (arrival order) of the generated log; see the module docstring.
    `shard` > 0 draws the ids of its customers, clicks, sales and events apart from every other
    shard's (programs, partners and accounts are the same): `write_sharded` merges several
    shards into one log too large to draw at once."""
    draw = _Draw(seed)
    rng = draw.rng
    scale = n * _SCALE
    accounts = ident("acct_", np.arange(PROGRAMS))
    ids = functools.partial(ident, shard=shard)
    parts: list[pl.DataFrame] = []
    stripe_parts: list[pl.DataFrame] = []

    # Customers.
    n_cust = max(int(scale * 0.07), 100)
    cust = np.arange(n_cust)
    cust_prog = draw.programs(n_cust)
    cust_partner = draw.partners(n_cust)
    cust_t0 = draw.times(n_cust)
    cust_linked = draw.chance(0.8, n_cust)
    cust_key = ids("ck_", cust)
    partner_email = PARTNER_CODES.gather(cust_partner) + "@partners.example"
    cust_email = pl.select(  # a few partners buy through their own link (self-referral)
        pl.when(pl.lit(pl.Series(draw.chance(0.002, n_cust))))
        .then(pl.lit(partner_email))
        .otherwise(pl.lit("u" + ids("", cust) + "@example.com"))
    ).to_series()
    cust_pc = ids("cus_", cust)
    cust_click = ids("clk_", cust)  # clicks 0..n_cust-1 are the customers' own

    # Clicks: the customers' own, then anonymous traffic.
    n_click = max(int(scale * 0.40), n_cust)
    anon = n_click - n_cust
    click_t = np.concatenate([np.maximum(cust_t0 - rng.integers(0, 3 * DAY, n_cust), T0), draw.times(anon)])
    click_id = ids("clk_", np.arange(n_click))
    parts.append(
        _track(
            "click",
            {
                "program_id": PROGRAM_IDS.gather(np.concatenate([cust_prog, draw.programs(anon)])),
                "event_id": click_id,
                "click_id": click_id,
                "partner_code": PARTNER_CODES.gather(np.concatenate([cust_partner, draw.partners(anon)])),
                "occurred_at": click_t,
                "received_at": click_t + rng.integers(50_000, 2 * US, n_click),
            },
        )
    )

    # Leads.
    n_lead = int(scale * 0.08)
    c = rng.integers(0, n_cust, n_lead)
    settled = draw.chance(0.85, n_lead)
    lead_t = draw.after(cust_t0[c], DAY)
    parts.append(
        _track(
            "lead",
            {
                "program_id": PROGRAM_IDS.gather(cust_prog[c]),
                "event_id": ids("lead_", np.arange(n_lead)),
                "customer_key": _keep(cust_key.gather(c), draw.chance(0.95, n_lead)),
                "email": _keep(cust_email.gather(c), draw.chance(0.85, n_lead)),
                "click_id": _keep(
                    cust_click.gather(c), cust_linked[c] & (~settled | draw.chance(0.7, n_lead))
                ),
                "lead_status": _choose(settled, "settled", "provisional"),
                "occurred_at": lead_t,
                "received_at": lead_t + rng.integers(50_000, 2 * US, n_lead),
            },
        )
    )

    # Checkout sessions of the Connect programs' customers.
    n_s = int(scale * 0.065)
    s = np.arange(n_s)
    sc = draw.pick(np.flatnonzero(~np.isin(cust_prog, SELF_HOSTED)), n_s)
    s_prog = cust_prog[sc]
    mode = rng.random(n_s)
    sub, setup = mode < 0.55, mode > 0.98
    s_t = draw.after(cust_t0[sc], 3 * DAY)
    s_test = draw.chance(0.01, n_s)
    s_tax = np.where(draw.chance(0.35, n_s), draw.prices(n_s) // 5, 0)
    s_gross = np.where(setup, 0, draw.prices(n_s) + s_tax)
    meta = draw.chance(0.9, n_s)
    stale = meta & draw.chance(0.005, n_s)  # a click id no program knows
    s_click = pl.select(
        pl.when(pl.lit(pl.Series(stale)))
        .then(pl.lit(ids("clk_", s + 2**40)))
        .otherwise(pl.lit(_keep(cust_click.gather(sc), meta & cust_linked[sc])))
    ).to_series()
    s_key = _keep(cust_key.gather(sc), meta & draw.chance(0.97, n_s))
    named = np.where(draw.chance(0.003, n_s), (s_prog + 1) % PROGRAMS, s_prog)
    s_meta_prog = _keep(PROGRAM_IDS.gather(named), meta)
    stripe_parts.append(
        _stripe(
            {
                "program_id": PROGRAM_IDS.gather(s_prog),
                "event_type": "checkout.session.completed",
                "tpl": "session",
                "object_id": ids("cs_live_", s),
                "checkout_session_id": ids("cs_live_", s),
                "checkout_mode": pl.Series(["payment", "subscription", "setup"]).gather(
                    np.where(sub, 1, np.where(setup, 2, 0))
                ),
                "invoice_id": ids("in_", s, sub & draw.chance(0.7, n_s)),
                "subscription_id": ids("sub_", s, sub),
                "payment_intent_id": ids("pi_", s, ~sub & ~setup),
                "customer_key": s_key,
                "click_id": s_click,
                "meta_program_id": s_meta_prog,
                "sub_metadata_present": meta,
                "processor_customer_id": cust_pc.gather(sc),
                "email": _keep(cust_email.gather(sc), draw.chance(0.95, n_s)),
                "amount": s_gross,
                "tax": _keep(pl.Series(s_tax), s_tax > 0),
                "currency": CURRENCIES.gather(s_prog),
                "livemode": ~s_test,
                "test_mode": s_test,
                "stripe_account": accounts.gather(s_prog),
                "occurred_at": s_t,
                "received_at": s_t + rng.integers(US, 30 * US, n_s),
            }
        )
    )

    # Invoices: each subscription's first (subscription_create, merged with its checkout), then
    # renewals, older subscriptions renewing more. They carry the subscription's metadata (copied
    # from the checkout) unless it was never set on the subscription.
    f = np.flatnonzero(sub)
    n_f = len(f)
    f_t = s_t[f] + rng.integers(US, 20 * US, n_f)
    n_r = int(scale * 0.14)
    months = (T1 - f_t) // MONTH
    pool = np.flatnonzero(months >= 1)
    j = pool[rng.choice(len(pool), n_r, p=months[pool] / months[pool].sum())]
    k = 1 + (rng.random(n_r) * months[j]).astype(np.int64)
    r_t = np.minimum(f_t[j] + k * MONTH + rng.integers(0, 6 * 3_600 * US, n_r), T1 - 1)
    owner = np.concatenate([f, f[j]])  # the checkout of each invoice's subscription
    n_inv = n_f + n_r
    inv = np.concatenate([f, n_s + np.arange(n_r)])
    inv_t = np.concatenate([f_t, r_t])
    inv_meta = (
        meta[owner] & draw.chance(0.85, n_inv) & np.concatenate([np.ones(n_f, bool), draw.chance(0.88, n_r)])
    )
    inv_gross = np.concatenate([s_gross[f], np.where(draw.chance(0.02, n_r), 0, s_gross[f[j]])])
    inv_tax = s_tax[owner]
    reason = np.concatenate([np.zeros(n_f, np.int64), np.where(draw.chance(0.04, n_r), 2, 1)])
    o_prog = s_prog[owner]
    invoices = _stripe(
        {
            "program_id": PROGRAM_IDS.gather(o_prog),
            "event_type": _choose(draw.chance(0.5, n_inv), "invoice.paid", "invoice.payment_succeeded"),
            "tpl": _choose(draw.chance(0.6, n_inv), "invoice", "invoice_legacy"),
            "object_id": ids("in_", inv),
            "invoice_id": ids("in_", inv),
            "billing_reason": pl.Series(
                ["subscription_create", "subscription_cycle", "subscription_update"]
            ).gather(reason),
            "subscription_id": ids("sub_", owner),
            "charge_id": ids("ch_", inv),
            "payment_intent_id": ids("pi_", inv + n_s),
            "customer_key": _keep(s_key.gather(owner), inv_meta),
            "click_id": _keep(s_click.gather(owner), inv_meta),
            "meta_program_id": _keep(s_meta_prog.gather(owner), inv_meta),
            "sub_metadata_present": inv_meta,
            "processor_customer_id": cust_pc.gather(sc[owner]),
            "email": cust_email.gather(sc[owner]),
            "amount": inv_gross,
            "tax": _keep(pl.Series(inv_tax), inv_tax > 0),
            "currency": CURRENCIES.gather(o_prog),
            "livemode": ~s_test[owner],
            "test_mode": s_test[owner],
            "stripe_account": accounts.gather(o_prog),
            "occurred_at": inv_t,
            "received_at": inv_t + rng.integers(US, 30 * US, n_inv),
        }
    )
    twice = rng.random(n_inv) < np.concatenate([np.full(n_f, 0.25), np.full(n_r, 0.15)])
    stripe_parts += [invoices, _twins(invoices, twice)]

    # charge.refunded on invoices' charges: cumulative amounts, a partial one sometimes topped up.
    charged = invoices.filter((pl.col("amount") > 0) & ~pl.col("test_mode"))
    n_cr = int(scale * 0.008)
    hit = charged[rng.integers(0, charged.height, n_cr)]
    gross = hit.get_column("amount").to_numpy()
    partial = draw.chance(0.4, n_cr)
    again = partial & draw.chance(0.3, n_cr)
    cr_t = draw.after(_micros(hit.get_column("occurred_at")), 15 * DAY)
    refund_columns = {
        "event_type": "charge.refunded",
        "tpl": "charge_refunded",
        "object_id": hit.get_column("charge_id"),
        "invoice_id": _keep(hit.get_column("invoice_id"), draw.chance(0.5, n_cr)),
        "refund_id": ids("re_", np.arange(n_cr)),
        "amount": np.where(
            partial, np.maximum(1, (gross * rng.uniform(0.1, 0.9, n_cr)).astype(np.int64)), gross
        ),
        "occurred_at": cr_t,
        "received_at": cr_t + rng.integers(US, 30 * US, n_cr),
        "livemode": True,
        "test_mode": False,
    }
    from_invoice = (
        "program_id",
        "charge_id",
        "payment_intent_id",
        "processor_customer_id",
        "currency",
        "stripe_account",
    )
    refunds = _stripe(refund_columns).hstack(hit.select(from_invoice))
    top_t = draw.after(cr_t[again], 7 * DAY)
    stripe_parts += [
        refunds,
        refunds.filter(pl.Series(again)).with_columns(
            amount=pl.Series(gross[again]),
            refund_id=ids("re_", n_cr + np.arange(int(again.sum()))),
            occurred_at=pl.Series(top_t).cast(pl.Datetime("us", "UTC")),
            received_at=pl.Series(top_t + US).cast(pl.Datetime("us", "UTC")),
        ),
    ]

    # Processor event ids, then retried deliveries and unroutable events.
    stripe = pl.concat(stripe_parts, how="diagonal_relaxed")
    stripe = stripe.with_columns(event_id=ids("evt_", np.arange(stripe.height)))
    retried = stripe[rng.integers(0, stripe.height, int(stripe.height * 0.03))]
    retried = retried.with_columns(
        outcome=pl.lit("duplicate"),
        received_at=_later(
            retried.get_column("received_at"), rng.exponential(1_800 * US, retried.height).astype(np.int64)
        ),
    )
    lost = stripe[rng.integers(0, stripe.height, int(stripe.height * 0.003))]
    lost = lost.with_columns(
        program_id=pl.lit(None, pl.String),
        outcome=pl.lit("unroutable"),
        event_id=ids("evt_", stripe.height + np.arange(lost.height)),
        stripe_account=ident("acct_", PROGRAMS + rng.integers(0, 50, lost.height)),
    )
    parts += [stripe, retried, lost]

    # Self-hosted sales: own transactions, double counts of Connect sales, repeats, refused.
    n_t = int(scale * 0.06)
    n_dc, n_rep, n_ref = int(n_t * 0.15), int(n_t * 0.04), int(n_t * 0.03)
    n_own = n_t - n_dc - n_rep - n_ref
    oc = draw.pick(np.flatnonzero(np.isin(cust_prog, SELF_HOSTED)), n_own)
    own_t = draw.after(cust_t0[oc], 3 * DAY)
    recurring = draw.chance(0.45, n_own)
    own = _track(
        "sale",
        {
            "program_id": PROGRAM_IDS.gather(cust_prog[oc]),
            "transaction_id": ids("tx_", np.arange(n_own)),
            "customer_key": _keep(cust_key.gather(oc), draw.chance(0.95, n_own)),
            "email": _keep(cust_email.gather(oc), draw.chance(0.7, n_own)),
            "click_id": _keep(cust_click.gather(oc), cust_linked[oc] & draw.chance(0.4, n_own)),
            "subscription_id": ids("ssub_", oc, recurring),
            "is_recurring": recurring,
            "sale_type": _choose(recurring, "subscription", "one_time"),
            "amount": draw.prices(n_own),
            "currency": CURRENCIES.gather(cust_prog[oc]),
            "test_mode": draw.chance(0.015, n_own),
            "occurred_at": own_t,
            "received_at": own_t + rng.integers(50_000, 2 * US, n_own),
        },
    )
    reporting = PROGRAM_IDS.gather(DOUBLE_REPORTING).implode()
    reported = charged.filter(pl.col("program_id").is_in(reporting))
    dc = reported[rng.integers(0, reported.height, n_dc)]
    dc_t = _micros(dc.get_column("occurred_at")) + rng.integers(US, 120 * US, n_dc)
    doubles = _track(
        "sale",
        {
            "transaction_id": dc.get_column("invoice_id"),
            "is_recurring": (dc.get_column("billing_reason") != "subscription_create").to_numpy(),
            "sale_type": "subscription",
            "occurred_at": dc_t,
            "received_at": dc_t + rng.integers(50_000, 2 * US, n_dc),
        },
    ).hstack(dc.select("program_id", "customer_key", "email", "amount", "currency", "subscription_id"))
    real = own.filter(~pl.col("test_mode"))
    repeated = real[rng.integers(0, real.height, n_rep + n_ref)]
    repeated = repeated.with_columns(
        received_at=_later(repeated.get_column("received_at"), rng.integers(US, 3_600 * US, n_rep + n_ref)),
        outcome=pl.Series(["accepted"] * n_rep + ["duplicate"] * n_ref),
    )
    sales = pl.concat([own, doubles, repeated], how="diagonal_relaxed")
    parts.append(sales.with_columns(event_id=ids("sale_", np.arange(sales.height))))

    # Track refunds of own sales (3 % of a transaction tally never saw).
    n_tr = int(scale * 0.008)
    target = real[rng.integers(0, real.height, n_tr)]
    amount = target.get_column("amount").to_numpy()
    tr_t = draw.after(_micros(target.get_column("occurred_at")), 10 * DAY)
    unknown = draw.chance(0.03, n_tr)
    parts.append(
        _track(
            "refund",
            {
                "event_id": ids("rfd_", np.arange(n_tr)),
                "transaction_id": pl.select(
                    pl.when(pl.lit(pl.Series(unknown)))
                    .then(pl.lit(ids("tx_", np.arange(n_tr) + 2**40)))
                    .otherwise(pl.lit(target.get_column("transaction_id")))
                ).to_series(),
                "refund_id": ids("re_", 2**41 + np.arange(n_tr)),
                "amount": np.where(
                    draw.chance(0.6, n_tr),
                    amount,
                    np.maximum(1, (amount * rng.uniform(0.1, 0.9, n_tr)).astype(np.int64)),
                ),
                "occurred_at": tr_t,
                "received_at": tr_t + rng.integers(50_000, 2 * US, n_tr),
            },
        ).hstack(target.select("program_id", "currency"))
    )

    # Engineer actions: metadata fixes of subscriptions renewing without metadata, a backfill per
    # program after them, and (optionally) monthly period closes.
    bare = np.unique(owner[(reason > 0) & ~inv_meta])
    fixed = np.sort(rng.choice(bare, min(len(bare), max(1, int(len(bare) * 0.002))), replace=False))
    n_fix = len(fixed)
    fix_t = rng.integers(T0 + 90 * DAY, T1 - 30 * DAY, n_fix)
    fixes = _frame(
        {
            "program_id": PROGRAM_IDS.gather(s_prog[fixed]),
            "kind": "metadata_fix",
            "event_id": ids("fix_", np.arange(n_fix)),
            "subscription_id": ids("sub_", fixed),
            "customer_key": cust_key.gather(sc[fixed]),
            "click_id": _keep(cust_click.gather(sc[fixed]), cust_linked[sc[fixed]]),
            "occurred_at": fix_t,
            "received_at": fix_t,
        }
    )
    fixes = fixes.with_columns(
        body=pl.concat_str(
            [
                pl.lit('{"subscription_id":"'),
                pl.col("subscription_id"),
                pl.lit('","svc_customer_key":"'),
                pl.col("customer_key"),
                pl.lit('"'),
                pl.format(',"svc_click_id":"{}"', "click_id").fill_null(""),
                pl.lit("}"),
            ]
        )
    )
    actions = [fixes]
    span = {"from": START.date().isoformat(), "to": END.date().isoformat()}
    for i, program in enumerate(sorted(set(s_prog[fixed].tolist()))):
        actions.append(_action("backfill", program, f"bf_{seed}_{i}", END - timedelta(days=20), span))
    for program in range(period_closes):
        for m in range(11):  # 2025-01 .. 2025-11
            month = datetime(2025 + m // 12, m % 12 + 1, 1, tzinfo=UTC)
            closed = datetime(2025 + (m + 1) // 12, (m + 1) % 12 + 1, 6, tzinfo=UTC)
            name = f"close_{program}_{m}"
            actions.append(
                _action("period_close", program, name, closed, {"period": month.strftime("%Y-%m")})
            )
    for program in range(payouts):
        for m in range(1, 13):  # batches made 2025-02-03 .. 2026-01-03
            made = datetime(2025 + m // 12, m % 12 + 1, 3, tzinfo=UTC)
            up_to = (made.replace(day=1) - timedelta(days=1)).date().isoformat()
            batch = f"po_{program}_{m}"
            actions.append(_action("payout_batch", program, batch, made, {"up_to": up_to, "by": "operator"}))
            if m < 12:
                body = {"payout_id": batch, "by": "operator"}
                actions.append(
                    _action("payout_paid", program, f"paid_{program}_{m}", made + timedelta(days=5), body)
                )
    parts.append(
        pl.concat(actions, how="diagonal_relaxed").with_columns(
            source=pl.lit("backfill"),
            outcome=pl.lit("accepted"),
            event_type=pl.col("kind"),
            test_mode=pl.lit(False),
            actor=pl.lit("operator"),
            tpl=pl.lit("engineer"),
        )
    )
    return Log(_assemble(parts, n), _programs(accounts), _partners())


def _action(kind: str, program: int, event_id: str, at: datetime, body: dict[str, str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "program_id": [PROGRAM_IDS[program]],
            "kind": [kind],
            "event_id": [event_id],
            "occurred_at": [at],
            "received_at": [at],
            "body": [json.dumps(body, sort_keys=True)],
        }
    )


def _assemble(parts: list[pl.DataFrame], n: int) -> pl.DataFrame:
    """All parts in arrival order (receive time, then event id), the first `n`, numbered."""
    frame = pl.concat(parts, how="diagonal_relaxed")
    frame = frame.select(
        (pl.col(name) if name in frame.columns else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in EVENT_SCHEMA.items()
    )
    frame = frame.sort("received_at", "event_id", "outcome").head(n)
    return frame.with_columns(seq=pl.int_range(1, frame.height + 1, dtype=pl.Int64))


def _programs(accounts: pl.Series) -> pl.DataFrame:
    """Rows of `programs`: percent and flat commissions, lifetime / 12 / 6 / first-sale-only
    recurring windows, holding periods of 14-60 days, settings as ingest stores them (JSON)."""
    settings = [
        {
            "commission_type": "flat" if i % 5 == 0 else "percent",
            "commission_bps": 2_000 + 100 * (i % 10),
            "commission_flat": 500 if i % 5 == 0 else 0,
            "recurring_months": 0 if i == 7 else None if i % 3 == 0 else 12 if i % 3 == 1 else 6,
            "platform_fee_bps": 500,
            "holding_days": (14, 60, 30, 30)[i % 4],
            "requires_server_side_leads": i % 6 == 0,
            "stripe_account_id": accounts[i],
        }
        for i in range(PROGRAMS)
    ]
    created = START - timedelta(days=30)
    return pl.DataFrame(
        {
            "program_id": PROGRAM_IDS,
            "workspace_id": [f"ws_{i % 5}" for i in range(PROGRAMS)],
            "name": [f"Program {i}" for i in range(PROGRAMS)],
            "settings": [json.dumps(v, sort_keys=True) for v in settings],
            "created_at": [created] * PROGRAMS,
            "updated_at": [created] * PROGRAMS,
        }
    )


def _partners() -> pl.DataFrame:
    codes = PARTNER_CODES.to_list()
    rows = [(PROGRAM_IDS[i], code) for i in range(PROGRAMS) for code in codes]
    return pl.DataFrame(
        {
            "program_id": [p for p, _ in rows],
            "code": [c for _, c in rows],
            "partner_id": [f"ptr_{p[5:]}_{c}" for p, c in rows],
            "name": [f"Partner {c}" for _, c in rows],
            "email": [f"{c}@partners.example" for _, c in rows],
            "created_at": [START - timedelta(days=30)] * len(rows),
        }
    )


def write_db(path: Path, log: Log, chunk_rows: int = 500_000) -> None:
    """A database file with the schema of ingest/storage/schema.py holding `log`."""
    con = duckdb.connect(str(path))
    try:
        migrations.apply(con)
        for table, frame in (("programs", log.programs), ("partners", log.partners)):
            con.register("_rows", frame.to_arrow())
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
            con.unregister("_rows")
        append(con, log.events, chunk_rows)
    finally:
        con.close()


def append(con: duckdb.DuckDBPyConnection, events: pl.DataFrame, chunk_rows: int = 500_000) -> None:
    """Append generated rows to `raw_events`, rendering bodies chunk by chunk (bounded memory)."""
    for offset in range(0, events.height, chunk_rows):
        con.register("_rows", render(events.slice(offset, chunk_rows)).to_arrow())
        con.execute("INSERT INTO raw_events BY NAME SELECT * FROM _rows")
        con.unregister("_rows")


def write_sharded(
    path: Path, tail: Path, size: int, held_back: int, shard_events: int, *, seed: int = 20_250_101
) -> Log:
    """A log too large to draw at once (`generate` holds about 1.3 KB a row at its peak): drawn as
    shards of at most `shard_events` events (`generate(..., shard=k)`, seed `seed + k`: the same
    programs, partners and accounts, ids of their own), merged in arrival order by DuckDB (which
    sorts out of core), numbered, and written: the first `size` rows to a database file as
    `write_db` writes it, the `held_back` after them to the Parquet file `tail` (unrendered, as
    `append` takes them). Returns the control plane (events: the first shard's first rows)."""
    total = size + held_back
    shards = -(-total // shard_events)
    first: Log | None = None
    with tempfile.TemporaryDirectory(prefix="rawgen-", dir=path.parent) as folder:
        files = []
        for k in range(shards):
            log = generate(-(-total // shards), seed=seed + k, shard=k)
            if first is None:
                first = Log(log.events.head(1_000), log.programs, log.partners)
            files.append(str(Path(folder) / f"shard-{k}.parquet"))
            log.events.drop("seq").write_parquet(files[-1])
            del log
        assert first is not None
        write_db(path, replace(first, events=first.events.head(0)))
        merge = duckdb.connect(config={"memory_limit": "2GB", "temp_directory": folder})
        merge.execute("SET enable_progress_bar = false")  # DuckDB 2 refuses it as a connect option
        # Bounded too: unbounded, DuckDB kept every block written (a 30M-event log peaked at 22.8 GiB).
        target = duckdb.connect(str(path), config={"memory_limit": "2GB"})
        try:
            ordered = merge.sql(
                f"SELECT * FROM read_parquet({files!r})"
                " ORDER BY received_at NULLS FIRST, event_id NULLS FIRST, outcome NULLS FIRST"
                f" LIMIT {total}"
            )
            done = 0
            held: list[pl.DataFrame] = []
            for batch in ordered.to_arrow_reader(500_000):
                frame = pl.from_arrow(batch)
                assert isinstance(frame, pl.DataFrame)
                numbered = pl.int_range(done + 1, done + frame.height + 1, dtype=pl.Int64)
                frame = frame.with_columns(seq=numbered).select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA)  # type: ignore[arg-type]
                head = frame.head(max(0, size - done))
                if head.height:
                    append(target, head)
                if head.height < frame.height:
                    held.append(frame.slice(head.height))
                done += frame.height
            pl.concat(held).write_parquet(tail)
        finally:
            target.close()
            merge.close()
    return first
