"""Hypothesis strategies: random raw-log streams shaped like ingest writes them.

Small id pools make collisions likely: the same customer across programs, sessions and invoices
that share ids, self-hosted sales reusing connect ids, refunds of known and unknown sales.
Values reach the edges ingest lets through: currencies with zero, two and three decimals,
amounts up to 10^12 minor units, times at any second (month ends, leap days, year ends), three
programs and four partners.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ingest.stripe import extract
from tests.hypothesis_profiles import examples
from tests.reconcile import builders as b
from tests.reconcile.reference import add_months


def profile(default: int, ci: int | None = None) -> settings:
    """Hypothesis settings of the stream tests: `default` cases (`ci` under TALLY_HYPOTHESIS=ci,
    tests/hypothesis_profiles.py), no deadline (a case reconciles a whole log), large streams
    allowed; derandomised and the rest as the loaded profile says."""
    return settings(
        max_examples=examples(default, ci),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


PROGRAMS = ("prog_a", "prog_b", "prog_c")
# Connect accounts of programs and of unroutable events (None: no account).
ACCOUNTS = ("acct_1", "acct_1", "acct_2", "acct_9", None)
PARTNERS = ("p1", "p2", "p3", "p4")
PARTNER_EMAILS = {"p1": "u1@x.com", "p2": "p2@x.com", "p3": None, "p4": "u3@x.com"}
CLICKS = tuple(f"clk_{i}" for i in range(1, 6))
CUSTOMERS = (1, 2, 3, 4)
MAX_AMOUNT = 10**12  # ingest/bounds.py: amounts 1..10^12 minor units
AMOUNTS = (0, 1, 2, 5, 6, 10, 15, 999, 1000, 1001, 2500, 10_000, 33_333, 999_999_999_999, MAX_AMOUNT)
# Zero-decimal (jpy, krw), two-decimal and three-decimal (bhd, kwd) currencies: amounts are minor
# units whatever the currency, so none may be rounded as if it had two decimals.
CURRENCIES = ("usd", "usd", "eur", "jpy", "krw", "bhd", "kwd")
# Instants at the edges of days, months and years, leap days included.
EDGES = tuple(
    datetime(*parts, tzinfo=UTC)
    for parts in (
        (2026, 1, 31, 23, 59, 59),
        (2026, 2, 1, 0, 0, 0),
        (2026, 2, 28, 23, 59, 59),
        (2026, 3, 1, 0, 0, 0),
        (2026, 3, 31, 23, 59, 59),
        (2026, 4, 30, 0, 0, 1),
        (2026, 12, 31, 23, 59, 59),
        (2027, 1, 1, 0, 0, 0),
        (2028, 1, 31, 12, 0, 0),
        (2028, 2, 29, 0, 0, 0),
        (2028, 2, 29, 23, 59, 59),
        (2028, 3, 1, 0, 0, 0),
        (2029, 2, 28, 23, 59, 59),
    )
)
ENGINEER = (
    "metadata_fix",
    "backfill",
    "period_close",
    "payout_batch",
    "payout_paid",
    "payout_cancel",
    "payout_row_failed",
    "manual_entry",
    "program_terms",
    "commission_action",
    "promo_code",
    "close_booking",
    "close_booked",
)


# Rows whose log position the books show (reconcile/bookings.py, payouts.py, manual.py): no
# data row crosses one when a test rearranges arrivals (`between_fixed`).
FIXED = (
    "booking",
    "close_booking",
    "close_booked",
    "period_close",
    "manual_entry",
    "payout_batch",
    "payout_paid",
    "payout_cancel",
    "payout_row_failed",
    "commission_action",
)


def between_fixed(rows: list[dict[str, Any]], order: list[int]) -> list[dict[str, Any]]:
    """`rows` in `order`, except that no row crosses a booking, a period close or an act whose
    log position the books show (a manual entry books itself there, a batch, its payment, cancel
    or failed row and a finance action are dated by it in rc_payouts and in lines' histories):
    what a booking booked and what a closed month holds are the log before them ("later" is the
    log's order), so rows only move among those between two."""
    segment, seen = [], 0.0
    for r in rows:
        if r["kind"] in FIXED:
            segment.append(seen + 0.5)
            seen += 1
        else:
            segment.append(seen)
    place = {i: n for n, i in enumerate(order)}
    return [rows[i] for i in sorted(range(len(rows)), key=lambda i: (segment[i], place[i]))]


# Promotion codes: processor ids a checkout names, codes customers type (any case), and the
# assignments that give either to a partner (now and then a second one of a code: the first wins).
PROMOTION_CODE_IDS = ("promo_1", "promo_2", "promo_3")
TYPED_CODES = ("SAVE10", "save10", "Creator", "CREATOR", "promo_1", "NOPE")
SESSION_TYPES = ("checkout.session.completed", "checkout.session.async_payment_succeeded")

Row = dict[str, Any]


@dataclass(frozen=True)
class Stream:
    rows: list[Row]
    programs: pl.DataFrame
    partners: pl.DataFrame
    now: datetime

    def frame(self) -> pl.DataFrame:
        return b.frame(self.rows)

    def __repr__(self) -> str:
        skip = {"seq", "received_at", "headers", "source", "outcome", "test_mode", "body"}
        lines = [repr({k: v for k, v in r.items() if v is not None and k not in skip}) for r in self.rows]
        return f"Stream(now={self.now}, rows=[\n  " + ",\n  ".join(lines) + "])"


def _maybe(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> Any:
    return draw(st.one_of(st.none(), values))


def _time(draw: st.DrawFn) -> datetime:
    """Mostly coarse times near T0 (so that ties and shared months are likely), else any second
    of those 100 days, or an edge of a month or year (leap days included)."""
    shape = draw(st.integers(0, 3))
    if shape == 2:
        return b.at(hours=draw(st.integers(0, 100 * 86_400)) / 3600)
    if shape == 3:
        return draw(st.sampled_from(EDGES))
    return b.at(days=draw(st.integers(0, 100)), hours=draw(st.sampled_from((0, 12))))


# One scale per stream (a shared strategy draws once per example), so that large sales meet
# large refunds: commission * refunded then passes 2^63 long before either reaches 10^12.
SCALE = st.shared(st.sampled_from((1, 1, 10**6, 10**8)), key="amount-scale")


def _amount(draw: st.DrawFn, *, zero: bool = True) -> int:
    """An amount of the small pool (ties and round numbers) times the stream's scale, capped at
    10^12, else any up to 10^12."""
    pool = AMOUNTS if zero else AMOUNTS[1:]
    if draw(st.integers(0, 3)) == 3:
        return draw(st.integers(1, MAX_AMOUNT))
    return min(draw(st.sampled_from(pool)) * draw(SCALE), MAX_AMOUNT)


def _currency(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(CURRENCIES))


def _email(draw: st.DrawFn, customer: int) -> str:
    return draw(st.sampled_from((f"u{customer}@x.com", f" U{customer}@X.com")))


def _customer_fields(draw: st.DrawFn) -> dict[str, Any]:
    customer = draw(st.sampled_from(CUSTOMERS))
    return {
        "email": _maybe(draw, st.just(_email(draw, customer))),
        "processor_customer_id": _maybe(draw, st.just(f"cus_{customer}")),
    }


def _sometimes(draw: st.DrawFn, value: Any, chance: int = 3) -> Any:
    """`value` with probability (chance - 1) / chance, else None."""
    return value if draw(st.integers(1, chance)) > 1 else None


# Most rows in one program (so that its customers meet), the rest in the other two.
WEIGHTED_PROGRAMS = ("prog_a", "prog_a", "prog_a", "prog_b", "prog_c")


def _program(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(WEIGHTED_PROGRAMS))


def _metadata(draw: st.DrawFn, program: str) -> dict[str, Any]:
    customer = draw(st.sampled_from(CUSTOMERS))
    return {
        "click_id": _maybe(draw, st.sampled_from(CLICKS)),
        "customer_key": _sometimes(draw, f"ck_{customer}", 4),
        "meta_program_id": draw(
            st.sampled_from((None, None, program, next(p for p in PROGRAMS if p != program)))
        ),
    }


def _live(draw: st.DrawFn) -> dict[str, Any]:
    test = draw(st.sampled_from((False, False, False, True)))
    return {"livemode": not test, "test_mode": test}


def _session(draw: st.DrawFn, n: int, program: str) -> Row:
    k = draw(st.integers(1, 6))
    mode = draw(st.sampled_from(("payment", "subscription", "subscription", "setup")))
    subscription = mode == "subscription"
    return b.session(
        f"evt_{n}",
        f"cs_{k}",
        _amount(draw),
        mode=mode,
        currency=_currency(draw),
        event_type=draw(st.sampled_from(SESSION_TYPES)),
        program_id=program,
        occurred_at=_time(draw),
        tax=_maybe(draw, st.sampled_from((0, 1, 100))),
        invoice_id=_maybe(draw, st.just(f"in_{k}")) if subscription else None,
        subscription_id=f"sub_{draw(st.integers(1, 3))}" if subscription else None,
        payment_intent_id=None if subscription else _maybe(draw, st.just(f"pi_{k}")),
        promo_code=_maybe(draw, st.sampled_from(PROMOTION_CODE_IDS)),
        **_metadata(draw, program),
        **_customer_fields(draw),
        **_live(draw),
    )


def _invoice(draw: st.DrawFn, n: int, program: str) -> Row:
    k = draw(st.integers(1, 8))
    with_metadata = draw(st.booleans())
    metadata = _metadata(draw, program) if with_metadata else {}
    present = any(v is not None for v in metadata.values())
    return b.invoice(
        f"evt_{n}",
        f"in_{k}",
        _amount(draw),
        currency=_currency(draw),
        billing_reason=draw(
            st.sampled_from(("subscription_create", "subscription_cycle", "subscription_cycle", "manual"))
        ),
        event_type=draw(st.sampled_from(("invoice.payment_succeeded", "invoice.paid"))),
        program_id=program,
        occurred_at=_time(draw),
        tax=_maybe(draw, st.sampled_from((0, 1, 100))),
        subscription_id=_maybe(draw, st.sampled_from(("sub_1", "sub_2", "sub_3"))),
        payment_intent_id=_maybe(draw, st.just(f"pi_{k}")),
        charge_id=_maybe(draw, st.just(f"ch_{k}")),
        sub_metadata_present=present,
        **metadata,
        **_customer_fields(draw),
        **_live(draw),
    )


def _invoice_delivery(draw: st.DrawFn, n: int, program: str) -> Row:
    """A renewal as the processor sends it, its subscription metadata in the 2025-03-31 layout
    (`parent.subscription_details`), the legacy one (`subscription_details`), both or neither,
    typed by ingest's own extraction."""
    k = draw(st.integers(1, 8))
    layout = draw(st.sampled_from(("new", "legacy", "both", "none")))
    paid = _time(draw)
    customer = draw(st.sampled_from(CUSTOMERS))
    keys = {"click_id": "svc_click_id", "customer_key": "svc_customer_key", "meta_program_id": "program_id"}
    metadata = {keys[k]: v for k, v in _metadata(draw, program).items() if v is not None}
    other = {keys[k]: v for k, v in _metadata(draw, program).items() if v is not None}
    subscription = draw(st.sampled_from(("sub_1", "sub_2", "sub_3")))
    invoice: dict[str, Any] = {
        "id": f"in_{k}",
        "object": "invoice",
        "amount_paid": _amount(draw),
        "currency": _currency(draw),
        "billing_reason": draw(st.sampled_from(("subscription_create", "subscription_cycle"))),
        "status_transitions": {"paid_at": int(paid.timestamp())},
        "customer": f"cus_{customer}",
        "customer_email": _maybe(draw, st.just(_email(draw, customer))),
    }
    if layout in ("new", "both"):
        invoice["parent"] = {"subscription_details": {"metadata": metadata, "subscription": subscription}}
    if layout in ("legacy", "both"):
        invoice["subscription_details"] = {"metadata": metadata if layout == "legacy" else other}
        invoice["subscription"] = subscription
    event = {
        "id": f"evt_{n}",
        "type": "invoice.payment_succeeded",
        "created": int(paid.timestamp()),
        "livemode": True,
        "account": "acct_1",
        "data": {"object": invoice},
    }
    return b.row(source="stripe", kind="stripe", program_id=program, body=json.dumps(event), **extract(event))


def _basil(draw: st.DrawFn, n: int, program: str) -> list[Row]:
    """A renewal in API 2025-03-31 and later: the invoice (naming no payment intent or charge),
    the `invoice_payment.paid` linking it to the payment intent that paid it (now and then a
    charge, or another invoice's intent), typed by ingest's own extraction, and refunds of the
    charge naming only that payment intent; now and then a part is missing. The caller puts each
    part at a random place in the log, so they arrive in any order."""
    k = draw(st.integers(1, 2))
    rows: list[Row] = []
    if draw(st.integers(0, 5)):
        rows.append(
            b.invoice(
                f"evt_{n}_i",
                f"in_b{k}",
                _amount(draw),
                currency=_currency(draw),
                event_type=draw(st.sampled_from(("invoice.paid", "invoice.payment_succeeded"))),
                program_id=program,
                occurred_at=_time(draw),
                subscription_id=f"sub_{k}",
                **_metadata(draw, program),
                **_customer_fields(draw),
                **_live(draw),
            )
        )
    for j in range(draw(st.integers(0, 2))):
        paid = _time(draw)
        invoice = draw(st.sampled_from((f"in_b{k}", f"in_b{k}", f"in_b{3 - k}", f"in_{k}")))
        payment = draw(
            st.sampled_from(
                (
                    {"type": "payment_intent", "payment_intent": f"pi_b{k}"},
                    {"type": "payment_intent", "payment_intent": f"pi_b{k}"},
                    {"type": "payment_intent", "payment_intent": f"pi_{k}"},
                    {"type": "charge", "charge": f"ch_b{k}"},
                )
            )
        )
        event = {
            "id": f"evt_{n}_l{j}",
            "type": "invoice_payment.paid",
            "created": int(paid.timestamp()),
            "livemode": True,
            "account": "acct_1",
            "data": {
                "object": {
                    "id": f"inpay_{n}_{j}",
                    "object": "invoice_payment",
                    "invoice": invoice,
                    "payment": payment,
                    "amount_paid": _amount(draw),
                    "status": "paid",
                    "is_default": True,
                    "livemode": True,
                    "created": int(paid.timestamp()),
                }
            },
        }
        rows.append(
            b.row(
                source="stripe", kind="stripe", program_id=program, body=json.dumps(event), **extract(event)
            )
        )
    for j in range(draw(st.integers(0, 2))):
        rows.append(
            b.charge_refunded(
                f"evt_{n}_r{j}",
                f"ch_b{k}",
                _amount(draw),
                currency=_currency(draw),
                program_id=program,
                occurred_at=_time(draw),
                payment_intent_id=f"pi_b{k}",
                refund_id=_maybe(draw, st.just(f"re_{n}_{j}")),
            )
        )
    return rows


def _track_sale(draw: st.DrawFn, n: int, program: str) -> Row:
    test = draw(st.sampled_from((False, False, False, True)))
    customer = draw(st.sampled_from(CUSTOMERS))
    tx = draw(st.sampled_from((f"tx_{n}", "tx_shared", "in_1", "in_2", "pi_1", "pi_2", "cs_1", "ch_3", None)))
    if not test and tx is None:
        tx = f"tx_{n}"
    return b.track_sale(
        f"sale_{n}",
        tx,
        None if test and draw(st.booleans()) else _amount(draw, zero=False),
        currency=_currency(draw),
        program_id=program,
        occurred_at=_time(draw),
        test_mode=test,
        outcome=draw(st.sampled_from(("accepted", "accepted", "accepted", "duplicate"))),
        customer_key=_maybe(draw, st.just(f"ck_{customer}")),
        email=_maybe(draw, st.just(_email(draw, customer))),
        click_id=_maybe(draw, st.sampled_from(CLICKS)),
        subscription_id=_maybe(draw, st.sampled_from(("sub_1", "sub_2"))),
        is_recurring=draw(st.booleans()),
        promo_code=_maybe(draw, st.sampled_from(TYPED_CODES)),
    )


def _promo(draw: st.DrawFn, n: int, program: str) -> Row:
    """An owner's assignment of a code (and/or a processor id) to a partner, at any time."""
    code = _maybe(draw, st.sampled_from(("SAVE10", "Save10", "creator")))
    promotion_code_id = (
        draw(st.sampled_from((None, *PROMOTION_CODE_IDS)))
        if code
        else draw(st.sampled_from(PROMOTION_CODE_IDS))
    )
    return b.promo_code(
        f"pa_{n}",
        code,
        draw(st.sampled_from(PARTNERS)),
        promotion_code_id,
        program_id=program,
        occurred_at=_time(draw),
    )


def _lead(draw: st.DrawFn, n: int, program: str) -> Row:
    customer = draw(st.sampled_from(CUSTOMERS))
    return b.lead(
        f"lead_{n}",
        _sometimes(draw, f"ck_{customer}", 4),
        click_id=_sometimes(draw, draw(st.sampled_from(CLICKS)), 4),
        email=_maybe(draw, st.just(_email(draw, customer))),
        settled=draw(st.sampled_from((True, True, False))),
        program_id=program,
        occurred_at=_time(draw),
    )


def _refund(draw: st.DrawFn, n: int, program: str) -> Row:
    if draw(st.booleans()):
        tx = draw(st.sampled_from(("in_1", "in_2", "in_3", "pi_1", "pi_2", "cs_1", "tx_shared", "nope")))
        return b.track_refund(
            f"re_{n}",
            tx,
            _amount(draw, zero=False),
            program_id=program,
            occurred_at=_time(draw),
        )
    k = draw(st.integers(1, 8))
    return b.charge_refunded(
        f"evt_{n}",
        f"ch_{k}",
        _amount(draw),
        currency=_currency(draw),
        program_id=program,
        occurred_at=_time(draw),
        invoice_id=_maybe(draw, st.just(f"in_{k}")),
        payment_intent_id=_maybe(draw, st.just(f"pi_{k}")),
        refund_id=_maybe(draw, st.just(f"re_{n}")),
    )


def _fix(draw: st.DrawFn, n: int, program: str) -> Row:
    target = draw(st.sampled_from(("subscription_id", "transaction_id")))
    value = draw(
        st.sampled_from(("sub_1", "sub_2", "sub_3"))
        if target == "subscription_id"
        else st.sampled_from(("in_1", "in_2", "in_3", "pi_1", "tx_shared"))
    )
    customer = draw(st.sampled_from(CUSTOMERS))
    return b.metadata_fix(
        f"fix_{n}",
        program_id=program,
        occurred_at=_time(draw),
        customer_key=_maybe(draw, st.just(f"ck_{customer}")),
        click_id=_maybe(draw, st.sampled_from(CLICKS)),
        **{target: value},
    )


def _backfill(draw: st.DrawFn, n: int, program: str) -> Row:
    """A range near T0, or one that starts or ends on the day of an edge instant (both bounds
    inclusive: a sale at 23:59:59 on the last day is covered)."""
    if draw(st.booleans()):
        start = b.at(days=draw(st.integers(-10, 60))).date()
        end = start + timedelta(days=draw(st.integers(20, 120)))
    else:
        edge = draw(st.sampled_from(EDGES)).date()
        before, after = draw(st.sampled_from(((0, 0), (0, 40), (40, 0), (400, 0), (800, 800))))
        start, end = edge - timedelta(days=before), edge + timedelta(days=after)
    return b.backfill(
        f"bf_{n}", start.isoformat(), end.isoformat(), program_id=program, occurred_at=_time(draw)
    )


def _close(draw: st.DrawFn, n: int, program: str) -> Row:
    period = draw(st.sampled_from(("2026-01", "2026-02", "2026-03", "2026-04", "2026-12", "2028-02")))
    return b.period_close(f"close_{n}", period, program_id=program, occurred_at=_time(draw))


# Payout cut-offs: month ends (leap day included), a day inside a month, years later.
CUTOFFS = ("2026-01-31", "2026-02-28", "2026-03-15", "2026-04-30", "2026-12-31", "2028-02-29", "2040-01-01")


def _payout(draw: st.DrawFn, n: int, program: str) -> Row:
    """A payout batch made at any of the stream's times, with a cut-off of CUTOFFS."""
    return b.payout_batch(
        f"po_{n}",
        draw(st.sampled_from(CUTOFFS)),
        minimum=draw(st.sampled_from((None, 0, 500, 10**6))),
        program_id=program,
        occurred_at=_time(draw),
    )


def _paid(draw: st.DrawFn, n: int, batches: list[Row]) -> Row | None:
    """Marks a batch of the stream paid (now and then naming another program's batch)."""
    if not batches:
        return None
    batch = draw(st.sampled_from(batches))
    return b.payout_paid(
        f"paid_{n}",
        batch["event_id"],
        program_id=_sometimes(draw, batch["program_id"], 6) or _program(draw),
        occurred_at=_time(draw),
    )


# Flat commissions by currency (CONTRACT 15): a sale in a currency one does not name earns
# nothing (`no_flat_amount_for_currency`); a code in capitals is the same currency.
FLAT_BY_CURRENCY = (
    {"usd": 150},
    {"usd": 999, "jpy": 5, "kwd": 1000},
    {"eur": 0, "bhd": 1500},
    {"JPY": 500, "krw": MAX_AMOUNT},
)


def _some_terms(draw: st.DrawFn) -> dict[str, Any]:
    """Money terms of a program (reconcile/terms.py TERMS)."""
    return {
        "commission_type": draw(st.sampled_from(("percent", "percent", "flat"))),
        "commission_bps": draw(st.sampled_from((0, 2500, 3000, 5000, 10_000))),
        "commission_flat": draw(st.sampled_from((0, 150, 999, *FLAT_BY_CURRENCY))),
        "recurring_months": draw(st.sampled_from((None, 0, 1, 12))),
        "platform_fee_bps": draw(st.sampled_from((0, 500, 10_000))),
        "holding_days": draw(st.sampled_from((0, 7, 30))),
    }


def _terms(draw: st.DrawFn, n: int, program: str) -> Row:
    """A change of the program's terms, at any of the stream's times."""
    return b.program_terms(
        f"terms_{n}", _some_terms(draw), _some_terms(draw), program_id=program, occurred_at=_time(draw)
    )


def _unroutable(draw: st.DrawFn, n: int) -> Row:
    return b.invoice(
        f"evt_{n}",
        f"in_u{n}",
        _amount(draw),
        currency=_currency(draw),
        program_id=None,
        outcome="unroutable",
        occurred_at=_time(draw),
        stripe_account=draw(st.sampled_from(ACCOUNTS)),
        meta_program_id=draw(st.sampled_from((None, None, *PROGRAMS, "prog_x"))),
        click_id=draw(st.sampled_from((None, *CLICKS))),
    )


MAKERS = {
    "session": _session,
    "invoice": _invoice,
    "delivery": _invoice_delivery,
    "track_sale": _track_sale,
    "lead": _lead,
    "refund": _refund,
    "metadata_fix": _fix,
    "backfill": _backfill,
    "period_close": _close,
    "payout_batch": _payout,
    "program_terms": _terms,
    "promo_code": _promo,
}


@st.composite
def streams(draw: st.DrawFn, *, closes: bool = True, max_events: int = 40) -> Stream:
    """A random raw log (clicks first so that ids are unique), with programs, partners, now."""
    rows: list[Row] = []
    for click_id in CLICKS:
        if draw(st.integers(0, 5)) > 0:
            rows.append(
                b.click(
                    click_id,
                    draw(st.sampled_from(PARTNERS)),
                    program_id=_program(draw),
                    occurred_at=_time(draw),
                )
            )
    kinds = [k for k in MAKERS if closes or k != "period_close"]
    weights = st.sampled_from(
        [k for k in kinds for _ in range(2 if k in ENGINEER else 4)]
        + ["retry", "copy", "unroutable", "pickup", "paid", "basil", "basil"]
    )
    for n in range(draw(st.integers(0, max_events))):
        kind = draw(weights)
        stripe_rows = [r for r in rows if r["kind"] == "stripe" and r["outcome"] == "accepted"]
        if kind in ("retry", "copy"):
            if not stripe_rows:
                continue
            original = draw(st.sampled_from(stripe_rows))
            if kind == "retry":
                outcome = draw(st.sampled_from(("duplicate", "accepted")))
                rows.append({**original, "outcome": outcome, "received_at": b.at(hours=n)})
            else:
                rows.append({**original, "event_id": f"evt_{n}", "occurred_at": _time(draw)})
        elif kind == "unroutable":
            rows.append(_unroutable(draw, n))
        elif kind == "pickup":  # a backfill's copy of an unroutable event, routed to a program
            stray = [r for r in rows if r["outcome"] == "unroutable"]
            if stray:
                original = draw(st.sampled_from(stray))
                rows.append(b.picked_up(original, _program(draw), received_at=b.at(hours=n)))
        elif kind == "basil":  # each part at a random place: any order of arrival
            for part in _basil(draw, n, _program(draw)):
                rows.insert(draw(st.integers(0, len(rows))), part)
        elif kind == "paid":
            mark = _paid(draw, n, [r for r in rows if r["kind"] == "payout_batch"])
            if mark is not None:
                rows.append(mark)
        else:
            rows.append(MAKERS[kind](draw, n, _program(draw)))
    return Stream(rows=rows, programs=_programs(draw), partners=_partners(), now=_now(draw))


def _programs(draw: st.DrawFn) -> pl.DataFrame:
    rows = []
    for program in PROGRAMS:
        rows.append(
            {
                "program_id": program,
                "commission_type": draw(st.sampled_from(("percent", "percent", "flat"))),
                "commission_bps": draw(st.sampled_from((0, 2500, 3000, 3333, 5000, 1, 9_999, 10_000))),
                "commission_flat": draw(st.sampled_from((0, 150, 999, MAX_AMOUNT, *FLAT_BY_CURRENCY))),
                "recurring_months": draw(st.sampled_from((None, 0, 1, 2, 12, 13, 1200))),
                "platform_fee_bps": draw(st.sampled_from((0, 500, 1250, 10_000))),
                "holding_days": draw(st.sampled_from((0, 7, 30, 3650))),
                "requires_server_side_leads": False,
                "stripe_account_id": draw(st.sampled_from(ACCOUNTS)),
            }
        )
    return b.program_frame(rows)


def _partners() -> pl.DataFrame:
    return pl.concat([b.partners(*PARTNER_EMAILS.items(), program=program) for program in PROGRAMS])


def _now(draw: st.DrawFn) -> datetime:
    """Before, inside or after the stream's times (a few edge instants fall years later)."""
    if draw(st.integers(0, 4)) == 4:
        return draw(st.sampled_from((EDGES[9], EDGES[10], datetime(2040, 1, 1, tzinfo=UTC))))
    return b.at(days=draw(st.sampled_from((0, 20, 45, 200))))


def _ledger_terms(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "holding_days": draw(st.sampled_from((0, 7, 14))),
        "recurring_months": draw(st.sampled_from((None, 0, 1, 12))),
        "commission_type": draw(st.sampled_from(("percent", "percent", "flat"))),
        "commission_bps": draw(st.sampled_from((3000, 3000, 5000))),
        "commission_flat": draw(st.sampled_from((150, 999, {"usd": 150, "jpy": 5}, {"kwd": 1250}))),
        "platform_fee_bps": 500,
    }


def _log_now(rows: list[Row], when: datetime) -> datetime:
    """When a run at `when` happens: not before anything already logged (a run sees the log)."""
    return max(when, *(r["received_at"] for r in rows))


@st.composite
def ledger_streams(draw: st.DrawFn, max_events: int = 30) -> Stream:
    """A log shaped to exercise the ledger (reconcile/ledger.py, reconcile/payouts.py): one
    program with a short holding period, customers bound to partners through leads, sales that
    link customer keys, subscriptions and emails, refunds, re-attribution through fixes and
    backfills, payout batches and payments, at times before and after each line's approval."""
    rows: list[Row] = [b.click(f"clk_{i}", PARTNERS[i - 1], occurred_at=b.at(days=-5)) for i in range(1, 5)]
    for customer in CUSTOMERS:
        rows.append(
            b.lead(
                f"lead_{customer}", f"ck_{customer}", click_id=f"clk_{customer}", occurred_at=b.at(days=-1)
            )
        )
    batches: list[str] = []
    snapshots: dict[str, list[tuple[str, str]]] = {}  # snapshot batches: the rows they pay
    sold = ["tx_unknown"]
    people = b.partners(*PARTNER_EMAILS.items())
    runs = 0
    terms = _ledger_terms(draw)  # the program's terms; a change moves them on, as the API does
    # the partners' payout details (method, currency), or none
    details = {
        code: draw(
            st.sampled_from((None, ("paypal", "usd"), ("paypal", "huf"), ("wise", "jpy"), ("wise", "kwd"))),
            label=f"details {code}",
        )
        for code in PARTNERS
    }
    for n in range(draw(st.integers(1, max_events))):
        kind = draw(
            st.sampled_from(
                (
                    "sale",
                    "sale",
                    "sale",
                    "refund",
                    "refund",
                    "fix",
                    "payout",
                    "paid",
                    "terms",
                    "book",
                    "lead",
                    "act",
                    "act",
                    "edge",
                    "edge",
                    "connect",
                    "close",
                    "cancel",
                    "fail",
                    "manual",
                )
            )
        )
        when = b.at(days=draw(st.integers(0, 60)), hours=draw(st.sampled_from((0, 12))))
        if kind == "sale":
            sold.append(f"tx_{n}")
            rows.append(
                b.track_sale(
                    f"sale_{n}",
                    f"tx_{n}",
                    _amount(draw, zero=False),
                    currency=draw(st.sampled_from(("usd", "jpy", "kwd"))),
                    occurred_at=when,
                    customer_key=_maybe(draw, st.sampled_from([f"ck_{c}" for c in CUSTOMERS])),
                    email=_maybe(draw, st.sampled_from(("u1@x.com", "u2@x.com", "p2@x.com"))),
                    subscription_id=_maybe(draw, st.sampled_from(("sub_1", "sub_2"))),
                    is_recurring=draw(st.booleans()),
                )
            )
        elif kind == "edge" and any(r["kind"] == "sale" and r["customer_key"] for r in rows):
            # a renewal of an attributed customer at the edge of its recurring window: its first
            # sale + the program's recurring months (or 1, 2, 12; month ends clamp), exactly or a
            # second either side
            keys = sorted({r["customer_key"] for r in rows if r["kind"] == "sale" and r["customer_key"]})
            key = draw(st.sampled_from(keys))
            base = min(
                (r for r in rows if r["kind"] == "sale" and r["customer_key"] == key),
                key=lambda r: (r["occurred_at"], r["event_id"]),
            )
            window = terms.get("recurring_months")
            months = window if isinstance(window, int) and window > 0 else draw(st.sampled_from((1, 2, 12)))
            edge = add_months(base["occurred_at"], months)
            edge += timedelta(seconds=draw(st.sampled_from((0, 0, -1, 1))))
            sold.append(f"tx_{n}")
            rows.append(
                b.track_sale(
                    f"sale_{n}",
                    f"tx_{n}",
                    _amount(draw, zero=False),
                    currency=base["currency"],
                    occurred_at=edge,
                    received_at=draw(st.sampled_from((edge, max(edge, when)))),
                    customer_key=key,
                    subscription_id=base["subscription_id"],
                    is_recurring=True,
                )
            )
        elif kind == "connect" and len(sold) > 1:
            # the processor's record of a sale first reported by track/sale, often after it was
            # booked: it wins (its amount and metadata count), and names a partner of its own
            chosen = draw(st.sampled_from(sold[1:]))
            sale = next(r for r in rows if r["kind"] == "sale" and r["transaction_id"] == chosen)
            rows.append(
                b.session(
                    f"evt_{n}",
                    f"cs_{n}",
                    draw(st.sampled_from((sale["amount"], _amount(draw, zero=False)))),
                    payment_intent_id=chosen,
                    currency=sale["currency"],
                    occurred_at=sale["occurred_at"],
                    received_at=max(when, sale["received_at"]),
                    click_id=_maybe(draw, st.sampled_from(CLICKS[:4])),
                    customer_key=_maybe(draw, st.sampled_from([f"ck_{c}" for c in CUSTOMERS])),
                )
            )
        elif kind == "close":  # finance closes January or February, once the month is over
            period = draw(st.sampled_from(("2026-01", "2026-02")))
            ended = datetime(2026, int(period[5:]) + 1, 1, tzinfo=UTC)
            rows.append(b.period_close(f"close_{n}", period, occurred_at=max(when, ended)))
        elif kind == "refund":
            rows.append(
                b.track_refund(
                    f"re_{n}",
                    draw(st.sampled_from(sold)),
                    _amount(draw, zero=False),
                    occurred_at=when,
                    received_at=draw(st.sampled_from((when, when + timedelta(days=40)))),
                )
            )
        elif kind == "fix":
            rows.append(
                b.metadata_fix(
                    f"fix_{n}",
                    occurred_at=when,
                    transaction_id=draw(st.sampled_from(sold)),
                    customer_key=f"ck_{draw(st.sampled_from(CUSTOMERS))}",
                )
            )
            rows.append(b.backfill(f"bf_{n}", "2026-01-01", "2026-12-31", occurred_at=when))
        elif kind == "payout":
            # the API books what is approved before it makes a batch (api/jobs.py `act`); a
            # booking run costs a reconcile, so a stream makes four at most
            if runs < 4:
                rows += b.bookings(rows, _log_now(rows, when), people, **terms)
                runs += 1
            batches.append(f"po_{n}")
            up_to = draw(st.sampled_from(CUTOFFS))
            if draw(st.sampled_from((True, True, True, False)), label=f"snapshot {n}"):
                minimum = draw(st.sampled_from((0, 0, 1_000, {"usd": 5_000, "jpy": 500})), label=f"min {n}")
                made = b.payout_snapshot(rows, _log_now(rows, when), people, details, up_to, minimum, **terms)
                # sorted: the draws below must not hang on the order a frame's rows came in
                snapshots[f"po_{n}"] = sorted((r["partner_code"], r["currency"]) for r in made["rows"])
                rows.append(b.payout_batch(f"po_{n}", up_to, minimum, made, occurred_at=when))
            else:  # a batch made before batches kept snapshots
                rows.append(b.payout_batch(f"po_{n}", up_to, occurred_at=when))
        elif kind == "cancel" and batches:  # finance cancels a batch (a paid one's cancel does nothing)
            rows.append(b.payout_cancel(f"cancel_{n}", draw(st.sampled_from(batches)), occurred_at=when))
        elif kind == "fail" and any(snapshots.values()):  # a paid row bounced (before payment: nothing)
            payout_id = draw(st.sampled_from(sorted(k for k, v in snapshots.items() if v)))
            code, currency = draw(st.sampled_from(snapshots[payout_id]))
            rows.append(b.payout_row_failed(f"fail_{n}", payout_id, code, currency, occurred_at=when))
        elif kind == "manual":  # an owner's bonus or correction, approved at once
            rows.append(
                b.manual_entry(
                    f"man_{n}",
                    draw(st.sampled_from(PARTNERS)),
                    draw(st.sampled_from((2_500, -700, 1))),
                    draw(st.sampled_from(("usd", "jpy", "huf"))),
                    occurred_at=when,
                )
            )
        elif kind == "book" and runs < 4:  # a scheduled reconcile run books what it shows approved
            rows += b.bookings(rows, _log_now(rows, when), people, **terms)
            runs += 1
        elif kind == "lead":  # a late lead: binds a customer's email to another partner
            rows.append(
                b.lead(
                    f"late_lead_{n}",
                    f"ck_late_{n}",
                    click_id=f"clk_{draw(st.sampled_from(CUSTOMERS))}",
                    email=draw(st.sampled_from(("u1@x.com", "u2@x.com"))),
                    occurred_at=b.at(days=-1),
                    received_at=when,
                )
            )
        elif kind == "act" and len(sold) > 1:  # finance holds, releases or voids a sale
            chosen = draw(st.sampled_from(sold[1:]))
            action = draw(st.sampled_from(("hold", "hold", "release", "void")))
            rows.append(
                b.commission_action(
                    f"act_{n}", f"sale_{chosen[3:]}", action, action, transaction_id=chosen, occurred_at=when
                )
            )
        elif kind == "terms":
            changed = _ledger_terms(draw)
            rows.append(b.program_terms(f"terms_{n}", terms, changed, occurred_at=when))
            terms = changed
        elif batches:
            rows.append(b.payout_paid(f"paid_{n}", draw(st.sampled_from(batches)), occurred_at=when))
    if len(sold) > 1 and draw(st.booleans()):
        # a tail after everything: a refund logged after the batches, booked, and batched too
        last = _log_now(rows, b.at(days=60)) + timedelta(days=draw(st.sampled_from((0, 1, 31))))
        rows.append(
            b.track_refund(
                "re_tail",
                draw(st.sampled_from(sold[1:])),
                _amount(draw, zero=False),
                occurred_at=b.at(days=1),
                received_at=last,
            )
        )
        rows += b.bookings(rows, last, people, **terms)
        rows.append(b.payout_batch("po_tail", draw(st.sampled_from(CUTOFFS[-3:])), occurred_at=last))
        if draw(st.booleans()):
            rows.append(b.payout_paid("paid_tail", "po_tail", occurred_at=last))
    programs = b.programs(**terms)
    return Stream(
        rows=rows,
        programs=programs,
        partners=people,
        now=b.at(days=draw(st.sampled_from((20, 45, 200)))),
    )
