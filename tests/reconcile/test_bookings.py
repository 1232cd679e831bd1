"""The ledger keeps its word (reconcile/bookings.py): what was booked never changes; later rows
are new lines dated when they were logged; finance holds, releases and voids. Every run is
checked against the reference (tests/reconcile/reference.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import polars as pl

from reconcile.pipeline import Result
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.compare import checked

NOW = at(days=120)
PARTNERS = b.partners(("p1", "p1@partner.test"), ("p2", "p2@partner.test"))
COLUMNS = ("kind", "partner_code", "period", "amount", "platform_fee", "status", "payout_id", "cause")


def run(rows: list[dict[str, Any]], now: datetime = NOW, **settings: Any) -> Result:
    settings.setdefault("platform_fee_bps", 500)
    return checked(b.frame(rows), b.programs(**settings), PARTNERS, now)


def book(rows: list[dict[str, Any]], when: datetime, **settings: Any) -> list[dict[str, Any]]:
    settings.setdefault("platform_fee_bps", 500)
    return b.bookings(rows, when, PARTNERS, **settings)


def lines(result: Result, *columns: str) -> list[tuple[Any, ...]]:
    return sorted(result.commissions.select(columns or COLUMNS).rows(), key=str)


def sale_of_p1(sale_id: str, amount: int, **kw: Any) -> list[dict[str, Any]]:
    return [
        b.click(f"clk_{sale_id}", "p1"),
        b.lead(f"lead_{sale_id}", f"ck_{sale_id}", click_id=f"clk_{sale_id}"),
        b.track_sale(sale_id, f"tx_{sale_id}", amount, customer_key=f"ck_{sale_id}", **kw),
    ]


def test_a_sale_reported_after_a_paid_batch_never_joins_it() -> None:
    """Defect 1: a batch up to Feb 28 is made and paid; then a self-hosted sale dated before the
    cut-off is reported. Its line is booked later and waits for the next batch."""
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += book(rows, at(40))
    rows += [
        b.payout_batch("po_1", "2026-02-28", occurred_at=at(41)),
        b.payout_paid("paid_1", "po_1", occurred_at=at(42)),
        *sale_of_p1("s2", 4_000, occurred_at=at(5), received_at=at(43)),
    ]
    rows += book(rows, at(44))
    result = run(rows)
    assert lines(result, "sale_id", "amount", "status", "payout_id") == [
        ("s1", 3_000, "paid", "po_1"),
        ("s2", 1_200, "approved", None),
    ]
    rows += [b.payout_batch("po_2", "2026-02-28", occurred_at=at(45))]
    assert lines(run(rows), "sale_id", "amount", "status", "payout_id") == [
        ("s1", 3_000, "paid", "po_1"),
        ("s2", 1_200, "approved", "po_2"),
    ]


def test_a_late_lead_moves_a_paid_line_by_new_lines_in_the_month_it_was_logged() -> None:
    """Defect 2: the sale is p1's by customer key when it is booked and paid; a lead logged in
    April binds the customer's email to p2 (email outranks the customer key). The paid line
    stays p1's; April holds -30.00 for p1 and +30.00 for p2, caused by that lead."""
    rows = [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        b.click("clk_2", "p2"),
        b.track_sale("s1", "tx_s1", 10_000, customer_key="ck_1", email="buyer@x.test", occurred_at=at(0)),
    ]
    rows += book(rows, at(40))
    rows += [
        b.payout_batch("po_1", "2026-02-28", occurred_at=at(41)),
        b.payout_paid("paid_1", "po_1", occurred_at=at(42)),
        b.lead(
            "lead_2",
            "ck_other",
            click_id="clk_2",
            email="buyer@x.test",
            occurred_at=at(-1),
            received_at=at(85),
        ),
    ]
    before = run(rows[:-1])
    result = run(rows)
    assert lines(result) == [
        ("adjustment", "p1", "2026-04", -3_000, -500, "approved", None, "lead_2"),
        ("adjustment", "p2", "2026-04", 3_000, 500, "approved", None, "lead_2"),
        ("commission", "p1", "2026-01", 3_000, 500, "paid", "po_1", ""),
    ]
    paid = result.commissions.filter(pl.col("payout_id") == "po_1").drop("status_reason")
    assert paid.equals(before.commissions.filter(pl.col("payout_id") == "po_1").drop("status_reason"))


def test_a_refund_logged_after_a_paid_batch_is_a_clawback_whatever_its_stamp() -> None:
    """Defect 3: the refund is logged after the batch (later in the log) but stamped a day
    before it (another replica's clock): the paid line keeps 30.00; -15.00 is a clawback."""
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += book(rows, at(40))
    rows += [
        b.payout_batch("po_1", "2026-02-28", occurred_at=at(41)),
        b.payout_paid("paid_1", "po_1", occurred_at=at(42)),
        b.track_refund("r1", "tx_s1", 5_000, occurred_at=at(3), received_at=at(40, hours=-1)),
    ]
    assert lines(run(rows)) == [
        ("clawback", "p1", "2026-02", -1_500, -250, "approved", None, "rfd_r1"),
        ("commission", "p1", "2026-01", 3_000, 500, "paid", "po_1", ""),
    ]


def test_hold_keeps_a_line_out_of_batches_until_released() -> None:
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += [b.commission_action("act_1", "s1", "hold", "dispute open", occurred_at=at(10))]
    rows += book(rows, at(40))
    rows += [b.payout_batch("po_1", "2026-02-28", occurred_at=at(41))]
    result = run(rows)
    assert lines(result, "status", "payout_id", "status_reason") == [("held", None, "dispute open")]
    rows += [b.commission_action("act_2", "s1", "release", "dispute won", occurred_at=at(50))]
    rows += book(rows, at(51))
    rows += [b.payout_batch("po_2", "2026-02-28", occurred_at=at(52))]
    assert lines(run(rows), "amount", "status", "payout_id") == [(3_000, "approved", "po_2")]


def test_a_hold_after_booking_keeps_the_booked_line_out_of_the_batch() -> None:
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += book(rows, at(40))
    rows += [
        b.commission_action("act_1", "s1", "hold", "chargeback", occurred_at=at(41)),
        b.payout_batch("po_1", "2026-02-28", occurred_at=at(42)),
    ]
    assert lines(run(rows), "amount", "status", "payout_id") == [(3_000, "held", None)]


def test_void_makes_lines_never_payable_and_their_fee_follows() -> None:
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += book(rows, at(40))
    rows += [
        b.commission_action("act_1", "s1", "void", "fraud", occurred_at=at(41)),
        b.commission_action("act_2", "s1", "release", "oops", occurred_at=at(42)),
        b.payout_batch("po_1", "2026-02-28", occurred_at=at(43)),
    ]
    assert lines(run(rows), "amount", "platform_fee", "status", "payout_id", "status_reason") == [
        (3_000, 500, "void", None, "fraud")
    ]


def test_a_released_self_referral_is_approved_and_paid() -> None:
    people = b.partners(("p1", "me@p1.test"), ("p2", None))
    rows = [
        b.click("clk_1", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        b.track_sale("s1", "tx_s1", 10_000, customer_key="ck_1", email="me@p1.test", occurred_at=at(0)),
    ]
    programs = b.programs(platform_fee_bps=500)
    held = checked(b.frame(rows), programs, people, NOW)
    assert held.commissions.select("status").rows() == [("held",)]
    rows += [b.commission_action("act_1", "s1", "release", "known customer", occurred_at=at(40))]
    rows += b.bookings(rows, at(41), people, platform_fee_bps=500)
    rows += [b.payout_batch("po_1", "2026-02-28", occurred_at=at(42))]
    got = checked(b.frame(rows), programs, people, NOW)
    assert got.commissions.select("amount", "status", "payout_id").rows() == [(3_000, "approved", "po_1")]


def test_a_booked_line_is_read_back_from_its_booking_whatever_the_terms_say_later() -> None:
    """A terms change that revalues the sale after booking is a new line, never an edit."""
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += book(rows, at(40))
    rows += [
        b.metadata_fix("fix_1", transaction_id="tx_s1", customer_key="ck_none", occurred_at=at(60)),
        b.backfill("bf_1", "2026-01-01", "2026-01-31", occurred_at=at(61)),
    ]
    got = lines(run(rows), "kind", "partner_code", "period", "amount", "cause")
    assert got == [
        ("adjustment", "p1", "2026-03", -3_000, "bf_1"),
        ("commission", "p1", "2026-01", 3_000, ""),
    ]


def test_a_refund_dated_into_a_closed_month_counts_in_the_month_it_was_logged() -> None:
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += [
        b.period_close("close_1", "2026-01", occurred_at=at(25)),
        b.track_refund("r1", "tx_s1", 4_000, occurred_at=at(5), received_at=at(60)),
        b.track_refund("r2", "tx_s1", 1_000, occurred_at=at(6), received_at=at(6)),
    ]
    rows.insert(3, rows.pop())  # r2 logged before the close
    got = run(rows).refunds.select("refund_id", "period", "booked_period").sort("refund_id").rows()
    assert got == [("r1", "2026-01", "2026-03"), ("r2", "2026-01", "2026-01")]


def test_a_clawback_stamped_into_a_month_closed_before_it_was_logged_lands_in_the_first_open_one() -> None:
    """A refund logged after January was closed, on a replica whose clock still says January:
    the booked sale's clawback goes to February (dated at its start), January stays as closed."""
    rows = sale_of_p1("s1", 10_000, occurred_at=at(0))
    rows += book(rows, at(1), holding_days=0)
    rows += [
        b.period_close("close_1", "2026-01", occurred_at=at(22)),
        b.track_refund("r1", "tx_s1", 5_000, occurred_at=at(10), received_at=at(20)),
    ]
    assert lines(run(rows, holding_days=0), "kind", "period", "amount", "dated_at", "cause") == [
        ("clawback", "2026-02", -1_500, datetime(2026, 2, 1, tzinfo=UTC), "rfd_r1"),
        ("commission", "2026-01", 3_000, at(0), ""),
    ]


def test_a_late_sale_in_a_closed_month_is_a_line_dated_when_it_was_logged() -> None:
    """January is closed; a sale dated in January is reported in March. January keeps its books;
    the sale's commission is a line in March, dated when it was logged and naming it."""
    rows = [b.period_close("close_1", "2026-01", occurred_at=at(22))]
    rows += sale_of_p1("s1", 10_000, occurred_at=at(5), received_at=at(55))
    assert lines(run(rows), "kind", "period", "amount", "dated_at", "cause") == [
        ("adjustment", "2026-03", 3_000, at(55), "s1"),
    ]
