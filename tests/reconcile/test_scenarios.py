"""Scenarios with exact cents, one per rule, each written from the text it quotes.

Every scenario also runs the reference implementation and requires it to agree (`checked`).
Default program: 30 % commission (3000 bps), 5 % platform fee, 30 holding days, lifetime.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ingest.stripe import extract
from reconcile.pipeline import Result
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.compare import checked

NOW = at(days=100)
PARTNERS = b.partners(("p1", "p1@partner.test"), ("p2", "p2@partner.test"), ("p3", None))


def run(
    rows: list[dict[str, Any]],
    *,
    now: datetime = NOW,
    partners: pl.DataFrame = PARTNERS,
    **settings: Any,
) -> Result:
    return checked(b.frame(rows), b.programs(**settings), partners, now)


def sale(result: Result, sale_id: str) -> dict[str, Any]:
    rows = result.sales.filter(pl.col("sale_id") == sale_id)
    assert rows.height == 1, f"{sale_id}: {rows.height} sales"
    return rows.row(0, named=True)


def lines(result: Result, sale_id: str) -> list[dict[str, Any]]:
    return result.commissions.filter(pl.col("sale_id") == sale_id).to_dicts()


def attributed_sale(sale_id: str, amount: int, **kw: Any) -> list[dict[str, Any]]:
    """A click of p1, a settled lead binding `ck_1` to it, and a self-hosted sale of ck_1."""
    return [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        b.track_sale(sale_id, f"tx_{sale_id}", amount, customer_key="ck_1", **kw),
    ]


# --- commissions and fees --------------------------------------------------------------------


def test_percent_commission_and_platform_fee_on_a_click_attributed_checkout() -> None:
    """CONTRACT 7: commission = rule applied to the sale amount; platform fee = platform_fee_bps
    of the same amount. SEED 6.2 (1): svc_click_id (direct click)."""
    result = run(
        [
            b.click("clk_1", "p1"),
            b.session("evt_1", "cs_1", 10_000, payment_intent_id="pi_1", click_id="clk_1"),
        ]
    )
    s = sale(result, "cs_1")
    assert (s["transaction_id"], s["partner_code"], s["attribution_rule"]) == ("pi_1", "p1", "click")
    assert (s["commission"], s["platform_fee"]) == (3_000, 500)
    assert lines(result, "cs_1")[0]["amount"] == 3_000


def test_flat_commission_is_the_same_whatever_the_amount() -> None:
    """CONTRACT 6: commission_type flat, commission_flat in minor units."""
    rows = [
        *attributed_sale("sale_big", 10000),
        b.track_sale("sale_small", "tx_small", 1, customer_key="ck_1"),
    ]
    result = run(rows, commission_type="flat", commission_flat=999)
    assert sale(result, "sale_big")["commission"] == 999
    assert sale(result, "sale_small")["commission"] == 999
    assert (sale(result, "sale_big")["platform_fee"], sale(result, "sale_small")["platform_fee"]) == (
        500,
        0,
    )


def test_a_flat_commission_by_currency_pays_only_in_the_currencies_it_names() -> None:
    """CONTRACT 15: `commission_flat` by currency; a sale in a currency it does not name earns
    nothing (its platform fee is due as ever), with `no_flat_amount_for_currency` in the sale's
    warnings and a `commission` step in explain. JPY amounts are whole yen."""
    rows = [
        *attributed_sale("sale_usd", 10_000),
        b.track_sale("sale_eur", "tx_eur", 10_000, currency="eur", customer_key="ck_1"),
        b.track_sale("sale_jpy", "tx_jpy", 1_000, currency="jpy", customer_key="ck_1"),
    ]
    result = run(rows, commission_type="flat", commission_flat={"usd": 500, "JPY": 500})
    got = {
        s: (sale(result, s)["commission"], sale(result, s)["platform_fee"])
        for s in ("sale_usd", "sale_eur", "sale_jpy")
    }
    assert got == {"sale_usd": (500, 500), "sale_eur": (0, 500), "sale_jpy": (500, 50)}
    assert [sale(result, s)["warnings"] for s in ("sale_usd", "sale_eur", "sale_jpy")] == [
        [],
        ["no_flat_amount_for_currency"],
        [],
    ]
    assert [line["amount"] for line in lines(result, "sale_eur")] == [0]
    steps = result.explain.filter(pl.col("sale_id") == "sale_eur").sort("step").to_dicts()
    assert [s["rule"] for s in steps][-2:] == ["result", "commission"]
    assert (steps[-1]["step"], steps[-1]["looked_up"], steps[-1]["result"]) == (
        7,
        "currency=eur",
        "no_flat_amount_for_currency",
    )
    assert "EUR" in steps[-1]["found"]
    assert result.explain.filter(pl.col("sale_id") == "sale_usd").height == 6
    # an integer still pays in every currency, as before
    every = run(rows, commission_type="flat", commission_flat=500)
    assert [sale(every, s)["commission"] for s in ("sale_usd", "sale_eur", "sale_jpy")] == [500, 500, 500]
    assert sale(every, "sale_eur")["warnings"] == []


def test_a_change_of_terms_to_a_flat_commission_by_currency_applies_from_then_on() -> None:
    """CONTRACT 15 with terms over time: the terms log holds the object as set; sales before
    the change keep the integer they were earned under."""
    rows = [
        *attributed_sale("sale_before", 10_000, currency="eur", occurred_at=at(days=1)),
        b.program_terms(
            "terms_1",
            {"commission_type": "flat", "commission_flat": 300},
            {"commission_type": "flat", "commission_flat": {"usd": 700}},
            occurred_at=at(days=2),
        ),
        b.track_sale(
            "sale_after", "tx_after", 10_000, currency="eur", customer_key="ck_1", occurred_at=at(days=3)
        ),
        b.track_sale("sale_usd", "tx_usd", 10_000, customer_key="ck_1", occurred_at=at(days=3)),
    ]
    result = run(rows, commission_type="flat", commission_flat={"usd": 700})
    assert [sale(result, s)["commission"] for s in ("sale_before", "sale_after", "sale_usd")] == [300, 0, 700]
    assert sale(result, "sale_after")["warnings"] == ["no_flat_amount_for_currency"]


@pytest.mark.parametrize(
    ("amount", "expected"),
    [(2, 0), (6, 2), (10, 2), (14, 4), (3, 1), (4, 1)],
    ids=["0.5->0", "1.5->2", "2.5->2", "3.5->4", "0.75->1", "1.0->1"],
)
def test_rounding_is_half_to_even_in_integer_minor_units(amount: int, expected: int) -> None:
    """CONTRACT 7: rounded half-to-even to the minor unit (25 % of the amount)."""
    result = run(attributed_sale("sale_1", amount), commission_bps=2_500, platform_fee_bps=2_500)
    assert (sale(result, "sale_1")["commission"], sale(result, "sale_1")["platform_fee"]) == (
        expected,
        expected,
    )


def _subscription(times: list[datetime]) -> list[dict[str, Any]]:
    """A subscription checkout (sub_1) attributed by click, then renewals at `times[1:]`."""
    rows = [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        b.session(
            "evt_cs",
            "cs_1",
            10_000,
            mode="subscription",
            invoice_id="in_0",
            subscription_id="sub_1",
            click_id="clk_1",
            customer_key="ck_1",
            occurred_at=times[0],
        ),
    ]
    for i, moment in enumerate(times[1:], start=1):
        rows.append(
            b.invoice(
                f"evt_in_{i}",
                f"in_{i}",
                10_000,
                subscription_id="sub_1",
                customer_key="ck_1",
                occurred_at=moment,
            )
        )
    return rows


RENEWALS = [
    datetime(2026, 1, 31, 12, tzinfo=UTC),
    datetime(2026, 2, 28, 12, tzinfo=UTC),
    datetime(2026, 3, 30, 12, tzinfo=UTC),
    datetime(2026, 3, 31, 12, tzinfo=UTC),
    datetime(2026, 4, 30, 12, tzinfo=UTC),
]


@pytest.mark.parametrize(
    ("months", "commissioned"),
    [
        (None, ["in_0", "in_1", "in_2", "in_3", "in_4"]),
        (0, ["in_0"]),
        (2, ["in_0", "in_1", "in_2"]),
    ],
    ids=["lifetime", "first-payment-only", "two-months"],
)
def test_recurring_window(months: int | None, commissioned: list[str]) -> None:
    """CONTRACT 6: recurring_months null = lifetime, 0 = first payment only, N = payments in the
    first N months after the first commissioned sale (Jan 31 + 2 months = Mar 31, exclusive)."""
    result = run(_subscription(RENEWALS), recurring_months=months)
    assert sorted(result.commissions["sale_id"].to_list()) == commissioned
    for sale_id in {"in_0", "in_1", "in_2", "in_3", "in_4"} - set(commissioned):
        assert (sale(result, sale_id)["commission"], sale(result, sale_id)["platform_fee"]) == (0, 0)
        assert sale(result, sale_id)["partner_code"] == "p1"


def test_holding_period_pending_then_approved() -> None:
    """Commissions are pending until holding_days after the sale, then approved."""
    rows = attributed_sale("sale_1", 10_000, occurred_at=at(days=1))
    assert lines(run(rows, now=at(days=30, hours=23)), "sale_1")[0]["status"] == "pending"
    approved = lines(run(rows, now=at(days=31)), "sale_1")[0]
    assert (approved["status"], approved["available_at"]) == ("approved", at(days=31))
    assert lines(run(rows, now=at(days=1), holding_days=0), "sale_1")[0]["status"] == "approved"


def test_self_referral_is_held_not_approved() -> None:
    """CONTRACT 7: a self-referral (customer email equal to the partner's email) is held."""
    partners = b.partners(("p1", "Pat@Example.com"))
    result = run(attributed_sale("sale_1", 10_000, email=" pat@example.COM"), partners=partners)
    line = lines(result, "sale_1")[0]
    assert (line["status"], line["self_referral"], line["amount"]) == ("held", True, 3_000)
    assert sale(result, "sale_1")["warnings"] == ["self_referral"]


# --- refunds ---------------------------------------------------------------------------------


def test_partial_then_full_refund_reverses_pro_rata_then_exactly_what_is_left() -> None:
    """CONTRACT 7: refunds reverse both pro rata; the refund that empties a sale reverses exactly
    what is left. 3000 * 3333 / 10000 = 999.9 -> 1000; 500 * 3333 / 10000 = 166.65 -> 167."""
    rows = [
        *attributed_sale("sale_1", 10000),
        b.track_refund("re_1", "tx_sale_1", 3333, occurred_at=at(days=2)),
    ]
    partial = run(rows)
    s = sale(partial, "sale_1")
    assert (s["refunded"], s["commission"], s["platform_fee"]) == (3_333, 2_000, 333)
    assert lines(partial, "sale_1")[0]["status"] == "approved"
    full = run([*rows, b.track_refund("re_2", "tx_sale_1", 6_667, occurred_at=at(days=3))])
    s = sale(full, "sale_1")
    assert (s["refunded"], s["commission"], s["platform_fee"], s["commission_status"]) == (
        10_000,
        0,
        0,
        "reversed",
    )
    refunds = full.refunds.sort("occurred_at")
    assert refunds["commission_reversed"].to_list() == [1_000, 2_000]
    assert refunds["platform_fee_reversed"].to_list() == [167, 333]


def test_refund_reversal_rounds_half_to_even_and_caps_at_the_sale() -> None:
    """A 5-cent commission half refunded reverses 2.5 -> 2; a refund beyond the sale applies
    only what is left of it."""
    rows = [
        *attributed_sale("sale_1", 50),
        b.track_refund("re_1", "tx_sale_1", 25, occurred_at=at(days=2)),
        b.track_refund("re_2", "tx_sale_1", 40, occurred_at=at(days=3)),
    ]
    result = run(rows, commission_bps=1_000, platform_fee_bps=0)
    refunds = result.refunds.sort("occurred_at")
    assert refunds["applied_amount"].to_list() == [25, 25]
    assert refunds["commission_reversed"].to_list() == [2, 3]
    assert sale(result, "sale_1")["refunded"] == 50


def test_processor_refunds_are_cumulative_and_win_over_self_hosted_refunds() -> None:
    """charge.refunded carries the charge's cumulative amount_refunded; matched by payment
    intent. The processor's record wins over a self-hosted refund of the same sale."""
    rows = [
        b.click("clk_1", "p1"),
        b.session("evt_1", "cs_1", 10_000, payment_intent_id="pi_1", click_id="clk_1"),
        b.charge_refunded("evt_r1", "ch_1", 2_500, payment_intent_id="pi_1", occurred_at=at(2)),
        b.charge_refunded("evt_r1", "ch_1", 2_500, payment_intent_id="pi_1", occurred_at=at(2)),
        b.charge_refunded("evt_r2", "ch_1", 10_000, payment_intent_id="pi_1", occurred_at=at(3)),
        b.track_refund("re_1", "pi_1", 2_500, occurred_at=at(2)),
    ]
    result = run(rows)
    refunds = result.refunds.sort("occurred_at", "source")
    assert refunds.select("source", "amount", "outcome", "commission_reversed").rows() == [
        ("connect", 2_500, "applied", 750),
        ("self_hosted", 2_500, "superseded_by_processor", 0),
        ("connect", 7_500, "applied", 2_250),
    ]
    assert (sale(result, "cs_1")["refunded"], sale(result, "cs_1")["commission"]) == (10_000, 0)


def test_refund_of_an_unknown_sale_is_kept() -> None:
    """CONTRACT 4: unknown sale: recorded ... (reconciled later)."""
    result = run([b.track_refund("re_1", "tx_nowhere", 100)])
    assert result.refunds.select("outcome", "sale_id").rows() == [("sale_not_found", None)]


# --- normalisation ---------------------------------------------------------------------------


def _checkout_and_first_invoice(*, session_knows_invoice: bool) -> list[dict[str, Any]]:
    return [
        b.click("clk_1", "p1"),
        b.session(
            "evt_cs",
            "cs_1",
            10_000,
            mode="subscription",
            subscription_id="sub_1",
            invoice_id="in_1" if session_knows_invoice else None,
            click_id="clk_1",
            customer_key="ck_1",
        ),
        b.invoice(
            "evt_in",
            "in_1",
            10_000,
            billing_reason="subscription_create",
            subscription_id="sub_1",
            charge_id="ch_1",
            occurred_at=at(hours=1),
        ),
    ]


@pytest.mark.parametrize("session_knows_invoice", [True, False], ids=["by-invoice", "by-sub"])
def test_checkout_and_its_subscription_create_invoice_are_one_sale_in_either_order(
    session_knows_invoice: bool,
) -> None:
    """CONTRACT 5: billing_reason = subscription_create is the same sale as its checkout
    session and is counted once (matched by the session's invoice, else the subscription)."""
    rows = _checkout_and_first_invoice(session_knows_invoice=session_knows_invoice)
    session_first = run(rows)
    invoice_first = run([rows[0], rows[2], rows[1]])
    assert_frame_equal(session_first.sales, invoice_first.sales)
    s = sale(session_first, "in_1")
    assert session_first.sales.height == 1
    assert (s["transaction_id"], s["checkout_session_id"], s["charge_id"]) == ("in_1", "cs_1", "ch_1")
    assert (s["is_recurring"], s["commission"], s["occurred_at"]) == (False, 3_000, at())
    assert (s["attribution_rule"], s["metadata_source"]) == ("click", "checkout_session")


def test_retries_and_duplicate_event_objects_count_once() -> None:
    """Retried deliveries share an event id; duplicate event objects share object id and type;
    invoice.paid and invoice.payment_succeeded of one invoice are one sale."""
    original = b.invoice("evt_1", "in_1", 10_000, customer_key="ck_1", subscription_id="sub_1")
    rows = [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        original,
        {**original, "outcome": "duplicate", "received_at": at(hours=1)},
        {**original, "received_at": at(hours=2)},
        {**original, "event_id": "evt_2", "occurred_at": at(hours=3)},
        {**original, "event_id": "evt_3", "event_type": "invoice.paid"},
    ]
    result = run([*rows, b.track_sale("sale_1", "in_1", 10_000, customer_key="ck_1")])
    assert result.sales.height == 1
    s = sale(result, "in_1")
    assert (s["amount"], s["commission"]) == (10_000, 3_000)
    # the records behind the one sale, each once, in record order (occurred_at, event_id)
    assert result.double_counts["connect_record_ids"].to_list() == [["evt_1", "evt_3", "evt_2"]]


def test_zero_amount_invoices_setup_sessions_and_free_trials_are_no_sale() -> None:
    """CONTRACT 7: zero-amount invoices are not sales; checkout mode setup is no sale."""
    rows = [
        b.session("evt_1", "cs_setup", 0, mode="setup"),
        b.session("evt_2", "cs_trial", 0, mode="subscription", invoice_id="in_1", subscription_id="sub_1"),
        b.invoice("evt_3", "in_1", 0, billing_reason="subscription_create", subscription_id="sub_1"),
        b.invoice("evt_4", "in_2", 0, subscription_id="sub_1"),
        b.invoice("evt_5", "in_3", 1_500, subscription_id="sub_1"),
    ]
    result = run(rows)
    assert result.sales["sale_id"].to_list() == ["in_3"]


def test_amounts_are_net_of_tax_where_the_processor_reports_it() -> None:
    """CONTRACT 7: commission = rule applied to the sale amount net of tax."""
    rows = [
        b.click("clk_1", "p1"),
        b.session("evt_1", "cs_1", 12_000, tax=2_000, payment_intent_id="pi_1", click_id="clk_1"),
    ]
    s = sale(run(rows), "cs_1")
    assert (s["gross_amount"], s["tax"], s["amount"]) == (12_000, 2_000, 10_000)
    assert (s["commission"], s["platform_fee"]) == (3_000, 500)


def test_test_events_are_visible_and_never_commissioned() -> None:
    """SEED 4.1: a test sale creates no commission and no platform fee; CONTRACT 5:
    livemode false events are test events: stored, never commissioned."""
    rows = [
        b.click("clk_1", "p1"),
        b.session("evt_1", "cs_1", 10_000, click_id="clk_1", test_mode=True),
        b.track_sale("sale_t", None, None, test_mode=True),
    ]
    result = run(rows)
    assert result.sales.select("sale_id", "test_mode", "partner_code", "commission").rows() == [
        ("cs_1", True, "p1", 0),
        ("sale_t", True, None, 0),
    ]
    assert result.commissions.is_empty()


# --- renewals and the subscription's own metadata --------------------------------------------


def _stripe_invoice(
    event_id: str,
    invoice_id: str,
    *,
    new: dict[str, str] | None = None,
    legacy: dict[str, str] | None = None,
    paid_at: datetime = NOW,
) -> dict[str, Any]:
    """A renewal delivery, through ingest's own extraction (ingest/stripe.py)."""
    stamp = int(paid_at.timestamp())
    obj: dict[str, Any] = {
        "id": invoice_id,
        "object": "invoice",
        "amount_paid": 2_000,
        "currency": "usd",
        "billing_reason": "subscription_cycle",
        "customer": f"cus_{invoice_id}",
        "status_transitions": {"paid_at": stamp},
    }
    if new is not None:
        obj["parent"] = {"subscription_details": {"metadata": new, "subscription": "sub_9"}}
    if legacy is not None:
        obj["subscription_details"] = {"metadata": legacy}
        obj["subscription"] = {"id": "sub_9", "object": "subscription"}
    event = {
        "id": event_id,
        "type": "invoice.payment_succeeded",
        "created": stamp - 60,
        "livemode": True,
        "account": "acct_1",
        "data": {"object": obj},
    }
    return b.row(source="stripe", kind="stripe", body=json.dumps(event), **extract(event))


def test_renewals_read_the_subscription_metadata_new_layout_first_then_legacy() -> None:
    """SEED 6.3: in API versions from 2025-03-31 the metadata is under
    invoice.parent.subscription_details.metadata, in older accounts under
    invoice.subscription_details.metadata; read the newer path first, fall back to the legacy."""
    rows = [
        b.click("clk_1", "p1"),
        b.click("clk_2", "p2"),
        b.lead("lead_1", "ck_new", click_id="clk_1"),
        b.lead("lead_2", "ck_old", click_id="clk_2"),
        _stripe_invoice("evt_1", "in_new", new={"svc_customer_key": "ck_new"}),
        _stripe_invoice("evt_2", "in_old", legacy={"svc_customer_key": "ck_old"}),
        _stripe_invoice(
            "evt_3",
            "in_both",
            new={"svc_customer_key": "ck_new"},
            legacy={"svc_customer_key": "ck_old"},
        ),
    ]
    result = run(rows)
    for sale_id, partner in [("in_new", "p1"), ("in_old", "p2"), ("in_both", "p1")]:
        s = sale(result, sale_id)
        assert (s["partner_code"], s["attribution_rule"]) == (partner, "customer_key")
        assert (s["subscription_id"], s["is_recurring"], s["commission"]) == ("sub_9", True, 600)


def test_renewal_without_subscription_metadata() -> None:
    """SEED 6.1: with empty Subscription metadata renewals cannot be attributed; a renewal that
    still matches by processor customer is attributed and flagged as a warning."""
    rows = [
        b.click("clk_1", "p1"),
        b.session(
            "evt_cs",
            "cs_1",
            10_000,
            mode="subscription",
            invoice_id="in_0",
            subscription_id="sub_1",
            click_id="clk_1",
            processor_customer_id="cus_1",
        ),
        b.invoice(
            "evt_1",
            "in_1",
            10_000,
            subscription_id="sub_1",
            processor_customer_id="cus_1",
            occurred_at=at(30),
        ),
        b.invoice(
            "evt_2",
            "in_2",
            10_000,
            subscription_id="sub_2",
            processor_customer_id="cus_2",
            occurred_at=at(30),
        ),
    ]
    result = run(rows)
    matched = sale(result, "in_1")
    assert (matched["partner_code"], matched["attribution_rule"]) == ("p1", "processor_customer")
    assert (matched["warnings"], matched["commission"]) == (["subscription_metadata_missing"], 3_000)
    lost = sale(result, "in_2")
    assert (lost["partner_code"], lost["unattributed_reason"], lost["commission"]) == (
        None,
        "subscription_metadata_missing",
        0,
    )


# --- leads -----------------------------------------------------------------------------------


def test_provisional_lead_never_attributes_until_a_server_lead_settles_it() -> None:
    """SEED 3.2: browser-mode lead on a program requiring server-side leads -> provisional;
    a server-mode lead call -> settled (and it keeps the click the browser lead carried)."""
    provisional = [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1", settled=False),
        b.track_sale("sale_1", "tx_1", 10_000, customer_key="ck_1", occurred_at=at(2)),
    ]
    s = sale(run(provisional, requires_server_side_leads=True), "sale_1")
    assert (s["partner_code"], s["unattributed_reason"], s["commission"]) == (
        None,
        "lead_provisional",
        0,
    )
    settled = [*provisional, b.lead("lead_2", "ck_1", occurred_at=at(1))]
    s = sale(run(settled, requires_server_side_leads=True), "sale_1")
    assert (s["partner_code"], s["attribution_rule"], s["commission"]) == ("p1", "customer_key", 3_000)


def test_first_settled_lead_binds_by_business_time_not_arrival() -> None:
    """CONTRACT 4: the first settled lead binds a customer to its click's partner; later leads
    do not rebind. CONTRACT 7: "earlier" means earlier occurred_at, not earlier arrival."""
    rows = [
        b.click("clk_1", "p1"),
        b.click("clk_2", "p2"),
        b.lead("lead_late", "ck_1", click_id="clk_2", occurred_at=at(3)),
        b.lead("lead_early", "ck_1", click_id="clk_1", occurred_at=at(2)),
        b.track_sale("sale_1", "tx_1", 10_000, customer_key="ck_1", occurred_at=at(4)),
    ]
    assert sale(run(rows), "sale_1")["partner_code"] == "p1"


# --- the ladder ------------------------------------------------------------------------------


def _ladder_world() -> list[dict[str, Any]]:
    """p1 via click clk_1; p2 bound to an email lead; p3 bound to customer ck_3; cus_9's
    first sale attributed to p3."""
    return [
        b.click("clk_1", "p1"),
        b.click("clk_2", "p2"),
        b.click("clk_3", "p3"),
        b.lead("lead_e", None, click_id="clk_2", email="mail@x.test"),
        b.lead("lead_k", "ck_3", click_id="clk_3"),
        b.track_sale("sale_0", "tx_0", 100, customer_key="ck_3", processor_customer_id="cus_9"),
    ]


@pytest.mark.parametrize(
    ("fields", "partner", "rule", "warnings"),
    [
        ({"click_id": "clk_1", "email": "mail@x.test", "customer_key": "ck_3"}, "p1", "click", []),
        ({"click_id": "clk_x", "email": "MAIL@x.test"}, "p2", "email", ["click_not_found"]),
        ({"email": "other@x.test", "processor_customer_id": "cus_9"}, "p3", "processor_customer", []),
        ({"customer_key": "ck_3", "email": "other@x.test"}, "p3", "customer_key", []),
    ],
    ids=["click", "email", "processor-customer", "customer-key"],
)
def test_attribution_ladder_in_order(
    fields: dict[str, str], partner: str, rule: str, warnings: list[str]
) -> None:
    """SEED 6.2: 1. svc_click_id 2. email against the lead record 3. processor customer id of a
    previous attributed session 4. svc_customer_key alone against the lead record."""
    rows = [*_ladder_world(), b.track_sale("sale_1", "tx_1", 1_000, occurred_at=at(1), **fields)]
    s = sale(run(rows), "sale_1")
    assert (s["partner_code"], s["attribution_rule"], s["warnings"]) == (partner, rule, warnings)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, "no_attribution_data"),
        ({"click_id": "clk_x", "customer_key": "ck_0"}, "click_not_found"),
        ({"customer_key": "ck_0"}, "customer_not_found"),
        ({"email": "nobody@x.test"}, "customer_not_found"),
        ({"customer_key": "ck_p"}, "lead_provisional"),
        ({"click_id": "clk_1", "meta_program_id": "prog_other"}, "program_mismatch"),
    ],
)
def test_unattributed_sales_are_kept_with_one_reason(fields: dict[str, str], reason: str) -> None:
    """CONTRACT 7: unattributed sales are kept with one reason."""
    rows = [
        *_ladder_world(),
        b.lead("lead_p", "ck_p", click_id="clk_1", settled=False),
        b.track_sale("sale_1", "tx_1", 1_000, **fields),
    ]
    s = sale(run(rows), "sale_1")
    assert (s["partner_code"], s["unattributed_reason"], s["commission"]) == (None, reason, 0)


def test_processor_customer_needs_an_earlier_attributed_sale() -> None:
    """SEED 6.2 (3): matched if the same customer appeared in a *previous* attributed session;
    ties in time are broken by the sale id, never by arrival."""
    rows = [
        b.click("clk_1", "p1"),
        b.track_sale("sale_b", "tx_b", 100, processor_customer_id="cus_1", click_id="clk_1"),
        b.track_sale("sale_a", "tx_a", 100, processor_customer_id="cus_1"),
        b.track_sale("sale_c", "tx_c", 100, processor_customer_id="cus_1"),
    ]
    result = run(rows)
    assert sale(result, "sale_a")["partner_code"] is None
    assert sale(result, "sale_c")["attribution_rule"] == "processor_customer"


# --- double counting -------------------------------------------------------------------------


def test_connect_and_self_hosted_record_of_one_sale_count_once_processor_wins() -> None:
    """SEED 6.3: with the connect webhook active, do not also call trackSale: renewals would be
    counted twice. CONTRACT 7: counted once (the processor's record wins) and listed."""
    rows = [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        b.invoice("evt_1", "in_1", 10_000, customer_key="ck_1", subscription_id="sub_1"),
        b.track_sale("sale_1", "in_1", 10_000, customer_key="ck_1", is_recurring=True),
        b.track_sale("sale_2", "in_1", 10_000, customer_key="ck_1", outcome="duplicate"),
    ]
    result = run(rows)
    assert result.sales.select("sale_id", "source", "commission").rows() == [("in_1", "connect", 3_000)]
    assert result.double_counts.select(
        "kind", "transaction_id", "sale_id", "connect_record_ids", "duplicate_id", "matched_on"
    ).rows() == [
        ("connect_and_self_hosted", "in_1", "in_1", ["evt_1"], "sale_1", "invoice_id"),
        ("ingest_refused", "in_1", "in_1", None, "sale_2", "invoice_id"),
    ]


def test_a_sale_seen_twice_counts_its_money_once_and_names_both_records_partners() -> None:
    """Issue 13: amounts count each distinct sale once (a refused retry is a line, not more
    money); a column shows when the processor record and the self-hosted call named different
    partners."""
    rows = [
        b.click("clk_1", "p1"),
        b.click("clk_2", "p2"),
        b.lead("lead_3", "ck_3", click_id="clk_2"),
        # the processor's record names p1 (its metadata's click); the brand's call names p2
        b.invoice("evt_1", "in_1", 10_000, click_id="clk_1", occurred_at=at(1)),
        b.track_sale("sale_1", "in_1", 10_000, click_id="clk_2", occurred_at=at(2)),
        # ...and its retries were refused: the same sale, no more money
        b.track_sale("sale_2", "in_1", 10_000, click_id="clk_2", outcome="duplicate", occurred_at=at(3)),
        b.track_sale("sale_3", "in_1", 10_000, customer_key="ck_1", outcome="duplicate", occurred_at=at(4)),
        # a second sale: both records name p1
        b.invoice("evt_9", "in_9", 2_500, click_id="clk_1", occurred_at=at(5)),
        b.track_sale("sale_9", "in_9", 2_500, click_id="clk_1", occurred_at=at(6)),
        # a refused attempt whose sale is unknown (the first names p2 by its lead), twice: one sale
        b.track_sale("sale_x1", "tx_x", 700, customer_key="ck_3", outcome="duplicate", occurred_at=at(7)),
        b.track_sale("sale_x2", "tx_x", 700, outcome="duplicate", occurred_at=at(8)),
    ]
    result = run(rows)
    got = result.double_counts.sort("occurred_at").select(
        "kind",
        "sale_id",
        "duplicate_id",
        "amount",
        "partner_code",
        "duplicate_partner_code",
        "partner_mismatch",
        "distinct_amount",
    )
    assert got.rows() == [
        ("connect_and_self_hosted", "in_1", "sale_1", 10_000, "p1", "p2", True, 10_000),
        ("ingest_refused", "in_1", "sale_2", 10_000, "p1", "p2", True, 0),
        ("ingest_refused", "in_1", "sale_3", 10_000, "p1", None, False, 0),  # it named nobody
        ("connect_and_self_hosted", "in_9", "sale_9", 2_500, "p1", "p1", False, 2_500),
        ("ingest_refused", None, "sale_x1", 700, None, "p2", True, 700),
        ("ingest_refused", None, "sale_x2", 700, None, None, False, 0),
    ]
    assert result.double_counts.get_column("distinct_amount").sum() == 13_200  # 3 sales, each once


# --- backfill, period close, unroutable, explain ---------------------------------------------


def _renewal_without_metadata() -> list[dict[str, Any]]:
    return [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        b.invoice("evt_1", "in_1", 10_000, subscription_id="sub_1", occurred_at=at(5)),
    ]


def test_metadata_fix_takes_effect_only_when_a_later_backfill_covers_the_sale() -> None:
    """CONTRACT 7: a fix takes effect only when a backfill covering its sales is applied:
    reconcile runs before that ignore it."""
    fix = b.metadata_fix("fix_1", subscription_id="sub_1", customer_key="ck_1")
    covering = b.backfill("bf_1", "2026-01-01", "2026-01-31")
    elsewhere = b.backfill("bf_2", "2026-02-01", "2026-02-28")
    before = sale(run([*_renewal_without_metadata(), covering, fix]), "in_1")
    assert (before["partner_code"], before["unattributed_reason"]) == (
        None,
        "subscription_metadata_missing",
    )
    assert sale(run([*_renewal_without_metadata(), fix, elsewhere]), "in_1")["partner_code"] is None
    after = sale(run([*_renewal_without_metadata(), fix, covering]), "in_1")
    assert (after["partner_code"], after["attribution_rule"], after["warnings"]) == (
        "p1",
        "customer_key",
        ["metadata_fixed"],
    )
    assert after["commission"] == 3_000


def test_closed_period_is_frozen_and_later_changes_become_adjustments() -> None:
    """CONTRACT 7: closed periods never change; later corrections to it appear as adjustment
    lines in the first open month."""
    rows = [
        *attributed_sale("sale_1", 10_000, occurred_at=at(5)),
        b.period_close("close_jan", "2026-01"),
        b.track_refund("re_1", "tx_sale_1", 5_000, occurred_at=at(25)),
        b.track_sale("sale_late", "tx_late", 2_000, customer_key="ck_1", occurred_at=at(6)),
    ]
    result = run(rows)
    got = result.commissions.select("sale_id", "kind", "period", "amount", "reversed", "status")
    assert got.sort("sale_id", "kind").rows() == [
        ("sale_1", "adjustment", "2026-02", -1_500, 1_500, "approved"),
        ("sale_1", "commission", "2026-01", 3_000, 0, "approved"),
        ("sale_late", "adjustment", "2026-02", 600, 0, "approved"),
    ]
    assert sale(result, "sale_1")["commission"] == 1_500


def test_closes_cost_one_pass_over_the_log_whatever_their_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """The books as of every close come from one more pass of the ledger (reconcile/periods.py),
    not one per close: a year of monthly closes, each after that month's sale and a refund of
    the month before (so every close's books differ), costs as many passes as one close, with
    the results the reference gives."""
    from reconcile import pipeline

    passes: list[int] = []
    ledger = pipeline.ledger

    def counted(*args: Any, **kwargs: Any) -> pipeline.Ledger:
        passes.append(1)
        return ledger(*args, **kwargs)

    monkeypatch.setattr(pipeline, "ledger", counted)

    def year(closes: int) -> list[dict[str, Any]]:
        rows = [b.click("clk_1", "p1"), b.lead("lead_1", "ck_1", click_id="clk_1")]
        for m in range(1, 13):
            when = datetime(2025, m, 5, tzinfo=UTC)
            rows.append(b.track_sale(f"s{m}", f"tx_{m}", 10_000, customer_key="ck_1", occurred_at=when))
            if m > 1:
                rows.append(b.track_refund(f"re_{m}", f"tx_{m - 1}", 1_000, occurred_at=when))
            if m <= closes:
                rows.append(b.period_close(f"close_{m}", f"2025-{m:02d}"))
        return rows

    counts = []
    for closes in (1, 12):
        passes.clear()
        result = run(year(closes))
        counts.append(len(passes))
        adjusted = result.commissions.filter(pl.col("kind") != "commission").height
        assert adjusted >= closes - 1  # each closed month's refund moved forward
    assert counts[0] == counts[1] == 2  # the log's, and the closes' (whatever their number)


def _stray(event_id: str, account: str | None, meta: str | None = None, **kw: Any) -> dict[str, Any]:
    return b.invoice(
        event_id,
        f"in_{event_id}",
        500,
        program_id=None,
        outcome="unroutable",
        stripe_account=account,
        meta_program_id=meta,
        **kw,
    )


def test_unroutable_events_are_reported_once_with_why_as_the_programs_are_now() -> None:
    """CONTRACT 5: routing by `account`; when several programs share an account,
    `metadata.program_id` picks one. Unroutable events are stored and reported, never dropped."""
    programs = b.program_frame(
        [
            {"program_id": "prog_a", "stripe_account_id": "acct_solo"},
            {"program_id": "prog_b", "stripe_account_id": "acct_shared"},
            {"program_id": "prog_c", "stripe_account_id": "acct_shared"},
        ]
    )
    nobody = _stray("evt_u", "acct_nobody", received_at=at(0))
    rows = [
        nobody,
        {**nobody, "received_at": at(1)},  # a second record of one event: listed once
        _stray("evt_solo", "acct_solo"),
        _stray("evt_shared", "acct_shared"),
        _stray("evt_shared_named", "acct_shared", "prog_c"),
        _stray("evt_shared_other", "acct_shared", "prog_a"),
        _stray("evt_none", None),
        _stray("evt_none_named", None, "prog_b"),
    ]
    result = checked(b.frame(rows), programs, PARTNERS, NOW)
    got = result.unroutable.select("event_id", "reason", "routes_to", "amount", "received_at")
    assert sorted(got.rows()) == [
        ("evt_none", "no_account", None, 500, at(0)),
        ("evt_none_named", "awaiting_backfill", "prog_b", 500, at(0)),
        ("evt_shared", "account_shared", None, 500, at(0)),
        ("evt_shared_named", "awaiting_backfill", "prog_c", 500, at(0)),
        ("evt_shared_other", "account_shared", None, 500, at(0)),
        ("evt_solo", "awaiting_backfill", "prog_a", 500, at(0)),
        ("evt_u", "account_not_connected", None, 500, at(0)),
    ]
    assert result.sales.is_empty()


def test_an_unroutable_event_picked_up_by_a_backfill_is_the_programs_and_leaves_the_list() -> None:
    """CONTRACT 5: a program that later gets the stripe_account_id picks them up on its next
    backfill: the copy the backfill appends is a sale of the program like any delivery."""
    stray = _stray("evt_u", "acct_1", click_id="clk_1", occurred_at=at(3))
    rows = [
        b.click("clk_1", "p1"),
        stray,
        b.picked_up(stray, received_at=at(40)),
        b.backfill("bf_1", "2026-01-01", "2026-01-31", occurred_at=at(40)),
    ]
    result = run(rows)
    assert result.unroutable.is_empty()
    picked = sale(result, "in_evt_u")
    assert (picked["partner_code"], picked["commission"], picked["occurred_at"]) == ("p1", 150, at(3))
    assert run(rows[:2]).unroutable.get_column("reason").to_list() == ["awaiting_backfill"]


def test_explain_lists_every_step_and_the_answer() -> None:
    """CONTRACT 7: explain -> the ladder, step by step, for one sale."""
    rows = [
        *_ladder_world(),
        b.track_sale("sale_1", "tx_1", 1_000, click_id="clk_x", email="other@x.test", customer_key="ck_3"),
    ]
    steps = run(rows).explain.filter(pl.col("sale_id") == "sale_1")
    assert steps.select("rule", "looked_up", "found", "result").rows() == [
        ("click", "svc_click_id=clk_x", "no click with this id in the program", "not_found"),
        ("promo_code", None, None, "no_data"),
        ("email", "email=other@x.test", "no lead with this email", "not_found"),
        ("processor_customer", None, None, "no_data"),
        (
            "customer_key",
            "svc_customer_key=ck_3",
            "settled lead lead_k with click clk_3 of partner p3",
            "matched",
        ),
        ("result", None, "partner p3 by rule customer_key", "attributed"),
    ]


# --- the customer's window and the ledger (issue #13) ----------------------------------------


def test_two_subscriptions_of_one_customer_share_one_window() -> None:
    """CONTRACT 7: sales linked through any identity of the customer share one window, anchored
    at the customer's first attributed sale: sub_2, started a month after sub_1 by the same
    customer key, is out of a one-month window from its first payment on."""
    rows = [
        *attributed_sale("first", 1_000, occurred_at=at(0), subscription_id="sub_1"),
        b.track_sale(
            "second", "tx_second", 1_000, customer_key="ck_1", subscription_id="sub_1", occurred_at=at(20)
        ),
        b.track_sale(
            "other", "tx_other", 1_000, customer_key="ck_1", subscription_id="sub_2", occurred_at=at(31)
        ),
    ]
    result = run(rows, recurring_months=1)
    assert [sale(result, s)["commission"] for s in ("first", "second", "other")] == [300, 300, 0]


def test_a_customer_is_linked_through_email_and_processor_customer_too() -> None:
    """A one-time connect checkout (processor customer cus_9, email) and a later self-hosted
    subscription payment of the same email are one customer: recurring_months 0 pays only the
    first."""
    rows = [
        b.click("clk_1", "p1"),
        b.session(
            "evt_1",
            "cs_1",
            10_000,
            payment_intent_id="pi_1",
            click_id="clk_1",
            processor_customer_id="cus_9",
            email="Kim@X.test",
        ),
        b.track_sale(
            "renewal",
            "tx_r",
            5_000,
            customer_key="ck_9",
            email=" kim@x.test",
            subscription_id="sub_9",
            occurred_at=at(40),
        ),
        b.lead("lead_9", "ck_9", click_id="clk_1"),
    ]
    result = run(rows, recurring_months=0)
    assert (sale(result, "cs_1")["commission"], sale(result, "renewal")["commission"]) == (3_000, 0)
    assert sale(result, "renewal")["partner_code"] == "p1"


def test_a_refund_reported_after_a_payout_batch_is_a_clawback_whatever_its_date() -> None:
    """A refund dated before approval but logged after a payout batch could pay the line is
    booked when it was logged: the paid line keeps its 30.00; -15.00 lands in March."""
    rows = attributed_sale("sale_1", 10_000, occurred_at=at(0))
    rows += [
        *b.bookings(rows, at(34), PARTNERS),
        b.payout_batch("po_1", "2026-01-31", occurred_at=at(35)),
        b.payout_paid("paid_1", "po_1", occurred_at=at(36)),
        b.track_refund("re_1", "tx_sale_1", 5_000, occurred_at=at(5), received_at=at(50)),
    ]
    got = run(rows).commissions.select("kind", "period", "amount", "status", "payout_id", "cause")
    assert sorted(got.rows()) == [
        ("clawback", "2026-03", -1_500, "approved", None, "rfd_re_1"),
        ("commission", "2026-01", 3_000, "paid", "po_1", ""),
    ]


def test_a_refund_dated_before_approval_changes_an_unpaid_line_in_place() -> None:
    """Without a payout batch that could pay it, a refund counts from its occurred_at: dated
    before approval, it changes the (not yet approved) line in place, even when reported late."""
    rows = [
        *attributed_sale("sale_1", 10_000, occurred_at=at(0)),
        b.track_refund("re_1", "tx_sale_1", 5_000, occurred_at=at(5), received_at=at(50)),
    ]
    got = run(rows).commissions.select("kind", "period", "amount", "reversed", "status").rows()
    assert got == [("commission", "2026-01", 1_500, 1_500, "approved")]


def test_late_backfills_of_two_programs_each_freeze_their_own_lines() -> None:
    """The same late backfill in two programs, whose layers the reconciler values in one pass:
    each program's renewals (two in prog_a, one in prog_b, of other amounts) get their own
    partner, amounts and approval time, as the reference computes them one by one."""

    def renewal(program: str, n: int, amount: int, partner: str) -> list[dict[str, Any]]:
        return [
            b.click(f"clk_{program}_{n}", partner, program_id=program),
            b.lead(
                f"lead_{program}_{n}", f"ck_{program}_{n}", click_id=f"clk_{program}_{n}", program_id=program
            ),
            b.invoice(
                f"evt_{program}_{n}",
                f"in_{program}_{n}",
                amount,
                subscription_id=f"sub_{program}_{n}",
                occurred_at=at(5 + n),
                program_id=program,
            ),
            b.metadata_fix(
                f"fix_{program}_{n}",
                subscription_id=f"sub_{program}_{n}",
                customer_key=f"ck_{program}_{n}",
                occurred_at=at(49),
                program_id=program,
            ),
        ]

    rows = [
        *renewal("prog_a", 1, 10_000, "p1"),
        *renewal("prog_a", 2, 20_000, "p2"),
        *renewal("prog_b", 1, 40_000, "p1"),
        b.backfill("bf_b", "2026-01-01", "2026-01-31", occurred_at=at(50), program_id="prog_b"),
        b.backfill("bf_a", "2026-01-01", "2026-01-31", occurred_at=at(51), program_id="prog_a"),
    ]
    programs = b.program_frame(
        [
            {**b.programs().row(0, named=True), "program_id": "prog_a"},
            {**b.programs().row(0, named=True), "program_id": "prog_b", "stripe_account_id": "acct_2"},
        ]
    )
    partners = pl.concat([PARTNERS, b.partners(("p1", "p1@partner.test"), program="prog_b")])
    got = checked(b.frame(rows), programs, partners, NOW).commissions
    assert got.select("program_id", "sale_id", "partner_code", "kind", "amount", "available_at").rows() == [
        ("prog_a", "in_prog_a_1", "p1", "commission", 3_000, at(51)),
        ("prog_a", "in_prog_a_2", "p2", "commission", 6_000, at(51)),
        ("prog_b", "in_prog_b_1", "p1", "commission", 12_000, at(50)),
    ]


def test_a_line_approved_by_a_late_backfill_is_frozen_from_then_on() -> None:
    """A renewal without metadata is unattributed at its approval time; a fix applied by a
    backfill on Mar 1 attributes it (approved from then, 30.00); a later refund is a clawback."""
    backfill = b.backfill("bf_1", "2026-01-01", "2026-01-31", occurred_at=at(50))
    rows = [
        *_renewal_without_metadata(),
        b.metadata_fix("fix_1", subscription_id="sub_1", customer_key="ck_1", occurred_at=at(49)),
        backfill,
        b.charge_refunded("evt_r", "ch_1", 2_500, invoice_id="in_1", occurred_at=at(60)),
    ]
    got = run(rows).commissions.select("kind", "period", "amount", "available_at").sort("kind").rows()
    assert got == [("clawback", "2026-03", -750, at(60)), ("commission", "2026-01", 3_000, at(50))]
