"""Promo-code attribution (CONTRACT 14), scenario by scenario, with exact cents: a checkout whose
`discounts[].promotion_code` names a partner's promotion code id, or a track sale whose
`promo_code` is a partner's code, is that partner's by rule `promo_code`, after the click id and
before email; renewals follow the customer. Every scenario runs the reference too (`checked`)
and, where it says so, every arrival order of its rows (the assignment included: it is a fact
about the code, not a moment)."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime
from typing import Any

import polars as pl

from ingest.stripe import extract
from reconcile.pipeline import Result, reconcile
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.compare import assert_results_equal, checked
from tests.stripe_fixtures import load_event

NOW = at(days=100)
PARTNERS = b.partners(("p1", "p1@partner.test"), ("p2", "p2@partner.test"))
Rows = list[dict[str, Any]]


def run(rows: Rows, *, now: datetime = NOW, **settings: Any) -> Result:
    return checked(b.frame(rows), b.programs(**settings), PARTNERS, now)


def sale(result: Result, sale_id: str) -> dict[str, Any]:
    rows = result.sales.filter(pl.col("sale_id") == sale_id)
    assert rows.height == 1, f"{sale_id}: {rows.height} sales"
    return rows.row(0, named=True)


def steps(result: Result, sale_id: str) -> list[tuple[Any, ...]]:
    return (
        result.explain.filter(pl.col("sale_id") == sale_id)
        .sort("step")
        .select("step", "rule", "looked_up", "found", "result")
        .rows()
    )


def in_every_order(rows: Rows, **settings: Any) -> Result:
    """The result of `rows`, after checking that every arrival order of them gives it (each
    order also against the reference)."""
    first = run(rows, **settings)
    for order in itertools.permutations(rows):
        assert_results_equal(run(list(order), **settings), first)
    return first


def checkout(event_id: str, session_id: str, amount: int, **kw: Any) -> dict[str, Any]:
    """A checkout session of the 2025-03-31 layout (stripe-sync-engine's live payload) with a
    promotion code applied, typed by ingest's own extraction."""
    event = copy.deepcopy(load_event("stripe-sync-engine__checkout_session_completed.json"))
    obj = event["data"]["object"]
    event["id"] = event_id
    obj.update(id=session_id, amount_total=amount, invoice=None, payment_intent=f"pi_{session_id}", **kw)
    obj["total_details"]["amount_tax"] = 0
    fields = extract(event)
    fields.update(stripe_account="acct_1", occurred_at=at(days=1))
    return b.row(source="stripe", kind="stripe", program_id=b.PROGRAM, **fields)


def legacy_checkout(event_id: str, session_id: str, amount: int, promotion_code_id: str) -> dict[str, Any]:
    """A checkout session of the legacy layout (stripe-ruby-mock, 2020-08-27): no `discounts`,
    the code in the expanded `total_details.breakdown`."""
    event = copy.deepcopy(load_event("stripe-ruby-mock__checkout.session.completed.json"))
    obj = event["data"]["object"]
    event["id"] = event_id
    event["livemode"] = obj["livemode"] = True
    obj.update(id=session_id, amount_total=amount, payment_intent=f"pi_{session_id}")
    obj["total_details"] = {
        "amount_discount": 100,
        "amount_tax": 0,
        "breakdown": {"discounts": [{"amount": 100, "discount": {"promotion_code": promotion_code_id}}]},
    }
    fields = extract(event)
    fields.update(stripe_account="acct_1", occurred_at=at(days=2))
    return b.row(source="stripe", kind="stripe", program_id=b.PROGRAM, **fields)


def test_a_checkout_naming_a_partners_promotion_code_is_that_partners_in_any_order() -> None:
    """The connect webhook: `discounts[].promotion_code` = the assignment's `promotion_code_id`."""
    rows = [
        b.promo_code("pa_1", "SAVE10", "p1", "promo_1Abc"),
        checkout("evt_1", "cs_1", 10_000, discounts=[{"coupon": "co_1", "promotion_code": "promo_1Abc"}]),
        b.click("clk_2", "p2"),
    ]
    result = in_every_order(rows)
    s = sale(result, "cs_1")
    assert (s["partner_code"], s["attribution_rule"], s["commission"]) == ("p1", "promo_code", 3_000)
    assert steps(result, "cs_1")[:3] == [
        (1, "click", None, None, "no_data"),
        (2, "promo_code", "promo_code=promo_1Abc", "promo code promo_1Abc of partner p1", "matched"),
        (3, "email", None, None, "not_tried"),
    ]
    assert steps(result, "cs_1")[-1] == (6, "result", None, "partner p1 by rule promo_code", "attributed")


def test_a_legacy_checkout_with_its_code_in_the_breakdown_is_attributed_too() -> None:
    rows = [
        b.promo_code("pa_1", "SAVE10", "p2", "promo_9"),
        legacy_checkout("evt_1", "cs_9", 2_000, "promo_9"),
    ]
    result = in_every_order(rows)
    assert (sale(result, "cs_9")["partner_code"], sale(result, "cs_9")["attribution_rule"]) == (
        "p2",
        "promo_code",
    )


def test_a_track_sale_with_a_partners_code_is_that_partners_whatever_its_case_in_any_order() -> None:
    """track/sale `promo_code` = the assignment's `code`, compared without case."""
    rows = [
        b.track_sale("sale_1", "tx_1", 5_000, customer_key="ck_1", promo_code="save10"),
        b.promo_code("pa_1", "SAVE10", "p1", "promo_1Abc"),
        b.track_sale("sale_2", "tx_2", 5_000, customer_key="ck_2", promo_code="promo_1Abc"),
    ]
    result = in_every_order(rows)
    assert (sale(result, "sale_1")["partner_code"], sale(result, "sale_1")["attribution_rule"]) == (
        "p1",
        "promo_code",
    )
    assert sale(result, "sale_1")["commission"] == 1_500
    # a track sale names the code customers type, never the processor's id: nothing found
    unknown = sale(result, "sale_2")
    assert (unknown["partner_code"], unknown["unattributed_reason"]) == (None, "customer_not_found")
    assert steps(result, "sale_2")[1] == (
        2,
        "promo_code",
        "promo_code=promo_1Abc",
        "no partner has this promo code",
        "not_found",
    )


def test_the_click_id_comes_first_and_the_promo_code_before_email() -> None:
    """CONTRACT 14: `promo_code` is placed after `svc_click_id` and before email."""
    rows = [
        b.click("clk_2", "p2"),
        b.lead("lead_e", "ck_e", click_id="clk_2", email="buyer@x.test"),
        b.promo_code("pa_1", "SAVE10", "p1", "promo_1"),
        b.track_sale("by_click", "tx_1", 1_000, click_id="clk_2", promo_code="SAVE10"),
        b.track_sale("by_promo", "tx_2", 1_000, email="buyer@x.test", promo_code="SAVE10"),
        b.track_sale("by_email", "tx_3", 1_000, email="buyer@x.test", promo_code="OTHER"),
    ]
    result = run(rows)
    found = {
        s: (sale(result, s)["partner_code"], sale(result, s)["attribution_rule"])
        for s in ("by_click", "by_promo", "by_email")
    }
    assert found == {
        "by_click": ("p2", "click"),
        "by_promo": ("p1", "promo_code"),
        "by_email": ("p2", "email"),
    }
    assert steps(result, "by_click")[1][-1] == "not_tried"


def test_renewals_follow_the_customer_a_promo_code_brought() -> None:
    """A subscription checkout attributed by its promo code; its renewals (invoices, which name
    no promotion code) follow the processor customer, as any customer's do (rule
    processor_customer), inside the program's recurring window."""
    rows = [
        b.promo_code("pa_1", "CREATOR", "p1", "promo_7"),
        b.session(
            "evt_cs",
            "cs_1",
            10_000,
            mode="subscription",
            invoice_id="in_0",
            subscription_id="sub_1",
            processor_customer_id="cus_1",
            promo_code="promo_7",
            occurred_at=datetime(2026, 1, 15, tzinfo=UTC),
        ),
        *(
            b.invoice(
                f"evt_in_{i}",
                f"in_{i}",
                10_000,
                subscription_id="sub_1",
                processor_customer_id="cus_1",
                occurred_at=datetime(2026, 1 + i, 15, tzinfo=UTC),
            )
            for i in (1, 2)
        ),
    ]
    result = run(rows, recurring_months=2)
    assert (sale(result, "in_0")["partner_code"], sale(result, "in_0")["attribution_rule"]) == (
        "p1",
        "promo_code",
    )
    for renewal, commission in (("in_1", 3_000), ("in_2", 0)):
        s = sale(result, renewal)
        assert (s["partner_code"], s["attribution_rule"]) == ("p1", "processor_customer")
        assert s["commission"] == commission  # Jan 15 + 2 months: Feb 15 earns, Mar 15 not


def test_the_first_assignment_of_a_code_names_its_partner() -> None:
    """Ingest refuses a second assignment of a code; a log holding one anyway keeps the first."""
    rows = [
        b.promo_code("pa_1", "SAVE10", "p1"),
        b.promo_code("pa_2", "save10", "p2", "promo_2"),
        b.track_sale("sale_1", "tx_1", 1_000, promo_code="Save10"),
        b.session("evt_1", "cs_1", 1_000, payment_intent_id="pi_1", promo_code="promo_2"),
    ]
    result = run(rows)
    assert sale(result, "sale_1")["partner_code"] == "p1"
    assert sale(result, "cs_1")["partner_code"] == "p2"  # the processor id was p2's alone


def test_an_assignment_logged_after_a_booking_moves_the_sale_by_new_lines() -> None:
    """The ledger keeps its word: a sale booked to p2 (by its customer key) that names p1's code
    goes to p1 once the assignment is logged, as a negative adjustment for p2 and a positive one
    for p1, caused by (and dated at) the assignment."""
    rows = [
        b.click("clk_2", "p2"),
        b.lead("lead_1", "ck_1", click_id=None),
        b.lead("lead_2", "ck_1", click_id="clk_2", occurred_at=at(hours=1)),
        b.track_sale(
            "sale_1", "tx_1", 10_000, customer_key="ck_1", promo_code="SAVE10", occurred_at=at(days=1)
        ),
    ]
    rows = [r for r in rows if r["event_id"] != "lead_1"]
    booked_at = at(days=40)
    rows += b.bookings(rows, booked_at, people=PARTNERS)
    assert rows[-1]["kind"] == "booking"
    assigned = at(days=50)
    rows.append(b.promo_code("pa_1", "SAVE10", "p1", received_at=assigned, occurred_at=assigned))
    result = run(rows)
    s = sale(result, "sale_1")
    assert (s["partner_code"], s["attribution_rule"]) == ("p1", "promo_code")
    lines = {
        (line["partner_code"], line["kind"]): (line["amount"], line["cause"], line["dated_at"])
        for line in result.commissions.filter(pl.col("sale_id") == "sale_1").to_dicts()
    }
    assert lines == {
        ("p2", "commission"): (3_000, "", at(days=1)),
        ("p2", "adjustment"): (-3_000, "pa_1", assigned),
        ("p1", "adjustment"): (3_000, "pa_1", assigned),
    }


def test_a_sale_without_a_code_or_with_an_unknown_one_says_so() -> None:
    rows = [b.promo_code("pa_1", "SAVE10", "p1"), b.track_sale("sale_1", "tx_1", 1_000, promo_code="WHO")]
    result = run(rows)
    s = sale(result, "sale_1")
    assert (s["partner_code"], s["unattributed_reason"]) == (None, "customer_not_found")
    lone = run([b.track_sale("sale_2", "tx_2", 1_000)])
    assert sale(lone, "sale_2")["unattributed_reason"] == "no_attribution_data"
    assert steps(lone, "sale_2")[1] == (2, "promo_code", None, None, "no_data")


def test_a_lazy_and_an_eager_log_agree_with_promo_codes() -> None:
    rows = [
        b.promo_code("pa_1", "SAVE10", "p1", "promo_1"),
        checkout("evt_1", "cs_1", 4_000, discounts=[{"promotion_code": "promo_1"}]),
    ]
    frame = b.frame(rows)
    eager = reconcile(frame, b.programs(), PARTNERS, NOW)
    lazy = reconcile(frame.lazy(), b.programs(), PARTNERS, NOW)
    assert_results_equal(eager, lazy)
