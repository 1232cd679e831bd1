"""The ledger's rules on random logs shaped for them (streams.ledger_streams): the real reconciler
agrees with the reference, arrival order changes nothing, approved money is never rewritten by
later refunds or backfills, and a sale's lines always add up to what the sale earns."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import duckdb
import polars as pl
from hypothesis import given
from hypothesis import strategies as st

from ingest.storage.duckdb.reader import DuckReader
from reconcile.pipeline import reconcile
from reports import payfiles, payouts, statements
from tests.reconcile import builders as b
from tests.reconcile.builders import PROGRAM
from tests.reconcile.compare import assert_results_equal, checked
from tests.reconcile.streams import ENGINEER, FIXED, Stream, between_fixed, ledger_streams, profile

PROFILE = profile(20, ci=80)
LINE = ("sale_id", "partner_code", "kind", "cause", "period")
MONEY = ("amount", "reversed", "platform_fee", "platform_fee_reversed", "refunded")


@PROFILE
@given(stream=ledger_streams())
def test_real_ledger_agrees_with_the_reference(stream: Stream) -> None:
    checked(stream.frame(), stream.programs, stream.partners, stream.now)


@PROFILE
@given(stream=ledger_streams(), data=st.data())
def test_ledger_is_the_same_whatever_the_arrival_order(stream: Stream, data: st.DataObject) -> None:
    """Data rows may arrive in any order; engineer actions (fixes, backfills, payout batches
    and payments) keep theirs."""
    order = data.draw(st.permutations(range(len(stream.rows))))
    first = reconcile(stream.frame(), stream.programs, stream.partners, stream.now)
    engineer = iter([r for r in stream.rows if r["kind"] in ENGINEER])
    rearrived = [next(engineer) if r["kind"] in ENGINEER else r for r in between_fixed(stream.rows, order)]
    second = reconcile(b.frame(rearrived), stream.programs, stream.partners, stream.now)
    assert_results_equal(first, second)


def _later_changes(stream: Stream, data: st.DataObject, at: Any) -> list[dict[str, Any]]:
    """Refunds of known sales and re-attributing fixes with their backfill, all at `at`."""
    sales = [r for r in stream.rows if r["kind"] == "sale"]
    rows: list[dict[str, Any]] = []
    for i, sale in enumerate(sales):
        if data.draw(st.booleans(), label=f"refund {i}"):
            amount = data.draw(st.integers(1, max(1, sale["amount"])), label=f"amount {i}")
            rows.append(b.track_refund(f"late_{i}", sale["transaction_id"], amount, occurred_at=at))
        if data.draw(st.booleans(), label=f"fix {i}"):
            key = data.draw(st.sampled_from(("ck_1", "ck_2", "ck_3", "ck_4")), label=f"key {i}")
            fix = b.metadata_fix(f"late_fix_{i}", transaction_id=sale["transaction_id"], customer_key=key)
            rows.append({**fix, "occurred_at": at, "received_at": at})
    rows.append(b.backfill("late_bf", "2026-01-01", "2026-12-31", occurred_at=at))
    return rows


def _new_terms(stream: Stream, data: st.DataObject, at: Any) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    """A change of the program's terms at `at` (a rate, fee, holding period or window of its
    own), and the programs as they are after it."""
    (current,) = stream.programs.to_dicts()
    changed = {
        **current,
        "commission_type": data.draw(st.sampled_from(("percent", "flat")), label="type"),
        "commission_bps": data.draw(st.sampled_from((0, 1000, 9000)), label="bps"),
        "commission_flat": data.draw(
            st.sampled_from((1, 5000, {"usd": 5000}, {"jpy": 1, "kwd": 7})), label="flat"
        ),
        "recurring_months": data.draw(st.sampled_from((None, 0, 2)), label="months"),
        "platform_fee_bps": data.draw(st.sampled_from((0, 2000)), label="fee"),
        "holding_days": data.draw(st.sampled_from((0, 60)), label="holding"),
    }
    change = b.program_terms("late_terms", current, changed, occurred_at=at, received_at=at)
    return [change], b.program_frame([changed])


@PROFILE
@given(stream=ledger_streams(), data=st.data())
def test_booked_closes_read_back_what_the_log_before_them_values(stream: Stream, data: st.DataObject) -> None:
    """A close is a booking (reconcile/periods.py): the books with every close booked, at some
    point after its close (rows logged after the booking included), are the books valued from
    the log's prefixes. (Booked after the last row whose log position the books show: a row
    slipped in before one would move it.)"""
    plain = [r for r in stream.rows if r["kind"] not in ("close_booking", "close_booked")]
    valued = reconcile(b.frame(plain), stream.programs, stream.partners, stream.now)
    fixed = [i for i, r in enumerate(plain) if r["kind"] in FIXED and r["kind"] != "period_close"]
    at = data.draw(st.integers(max(fixed, default=-1) + 1, len(plain)), label="booked after row")
    head, tail = plain[:at], plain[at:]
    booked = [*head, *b.close_bookings(head, stream.now, stream.partners, stream.programs)]
    whole = [*booked, *tail]
    whole += b.close_bookings(whole, stream.now, stream.partners, stream.programs)
    assert_results_equal(valued, reconcile(b.frame(whole), stream.programs, stream.partners, stream.now))


@PROFILE
@given(stream=ledger_streams(), data=st.data())
def test_approved_and_paid_lines_are_never_rewritten(stream: Stream, data: st.DataObject) -> None:
    """CONTRACT 7: approved and paid lines are never rewritten: later refunds, fixes, partner
    changes and changes of the program's terms add lines (or none). Every line approved or paid
    as of `now` is, after later refunds, re-attributions and a change of terms (effective after
    `now`), still there with the same money, partner, status kind and payout; what changed is
    booked on new lines dated after `now`."""
    now = max(stream.now, *(r["received_at"] for r in stream.rows))  # after everything logged
    (terms_now,) = stream.programs.to_dicts()
    settings = {k: v for k, v in terms_now.items() if k != "program_id"}
    booked = [*stream.rows, *b.bookings(stream.rows, now, stream.partners, **settings)]
    before = reconcile(b.frame(booked), stream.programs, stream.partners, now).commissions
    later = now + timedelta(days=data.draw(st.integers(0, 400), label="days later"))
    terms, programs = _new_terms(stream, data, later)
    rows = [*booked, *_later_changes(stream, data, later), *terms]
    after = reconcile(b.frame(rows), programs, stream.partners, later + timedelta(days=1)).commissions
    for batch in before.get_column("payout_id").drop_nulls().unique():
        was = before.filter(pl.col("payout_id") == batch).sort(LINE).select(*LINE, *MONEY)
        assert after.filter(pl.col("payout_id") == batch).sort(LINE).select(*LINE, *MONEY).equals(was), batch
    settled = before.filter(pl.col("status").is_in(["approved", "paid"]))
    kept = settled.join(after, on=list(LINE), how="left", suffix="_after")
    for row in kept.iter_rows(named=True):
        assert all(row[m] == row[f"{m}_after"] for m in MONEY), row
        assert row["payout_id"] == row["payout_id_after"], row
        assert row["status_after"] in ("approved", "paid"), row
    new = after.join(before, on=list(LINE), how="anti")
    assert new.filter(pl.col("dated_at") < now).filter(pl.col("kind") != "commission").is_empty()


@PROFILE
@given(stream=ledger_streams())
def test_a_sales_lines_add_up_to_what_the_sale_earns(stream: Stream) -> None:
    """Nothing is lost: over a sale's lines, commission and fee add up to the sale's own figures
    (net of every refund), whichever partners the lines went to on the way."""
    raw = stream.frame()
    result = reconcile(raw, stream.programs, stream.partners, stream.now)
    # not a sale's earning, so left out of the sums: a hold or void of a closed month's line books
    # a line of its own (cause: the action), a batch's rounding lines (cause: the batch), and
    # manual entries (a sale of their own)
    acted = raw.filter(pl.col("kind") == "commission_action").get_column("event_id")
    batches = result.payouts.get_column("payout_id")
    rounding = pl.concat([batches, batches + ":carried"])
    sums = (
        result.commissions.filter(
            ~pl.col("cause").is_in(acted.implode())
            & ~pl.col("cause").is_in(rounding.implode())
            & (pl.col("kind") != "manual")
        )
        .group_by("sale_id")
        .agg(pl.col("amount").sum(), pl.col("platform_fee").sum())
    )
    joined = sums.join(
        result.sales.select("sale_id", "commission", "platform_fee"), on="sale_id", suffix="_sale"
    )
    assert joined.height == sums.height
    assert (joined["amount"] == joined["commission"]).all()
    assert (joined["platform_fee"] == joined["platform_fee_sale"]).all()


def test_ledger_streams_exercise_every_rule() -> None:
    """The strategy above is worth its cost: across its first examples every kind of line,
    a paid batch and a clawback taken by a batch appear (a test that cannot silently go vacuous)."""
    seen: set[str] = set()

    @profile(90, ci=90)
    @given(stream=ledger_streams())
    def collect(stream: Stream) -> None:
        lines = reconcile(stream.frame(), stream.programs, stream.partners, stream.now).commissions
        seen.update(lines.get_column("kind").to_list())
        if lines.filter(pl.col("status") == "paid").height:
            seen.add("paid")
        if lines.filter((pl.col("kind") == "clawback") & pl.col("payout_id").is_not_null()).height:
            seen.add("clawback in a batch")
        seen.update(lines.filter(pl.col("status_reason").is_not_null()).get_column("status").to_list())
        if lines.filter((pl.col("kind") == "adjustment") & pl.col("cause").str.starts_with("evt_")).height:
            seen.add("a connect record adjusts a booked sale")
        closed = {
            r["body"] for r in stream.rows if r["kind"] == "period_close" and r["received_at"] <= stream.now
        }
        if closed and lines.filter(pl.col("booked_seq").is_not_null()).height:
            seen.add("bookings with a closed month")
        acted = [r["event_id"] for r in stream.rows if r["kind"] == "commission_action"]
        compensated = lines.filter(pl.col("cause").is_in(acted))
        if compensated.height:
            seen.add("an action on a closed month's line")
        if compensated.filter(pl.col("status_reason").str.starts_with("void")).height:
            seen.add("void")  # a void of a closed month's line: its minus line

    collect()
    assert seen >= {
        "commission",
        "clawback",
        "adjustment",
        "paid",
        "clawback in a batch",
        "held",
        "void",
        "a connect record adjusts a booked sale",
        "bookings with a closed month",
        "an action on a closed month's line",
    }, seen
    assert set(ENGINEER) >= {"payout_batch", "payout_paid", "program_terms"}


def _books(result: Any) -> tuple[duckdb.DuckDBPyConnection, DuckReader]:
    """The published tables statements and payouts read, in an in-memory DuckDB."""
    con = duckdb.connect()
    con.register("_lines", result.commissions.to_arrow())
    con.register("_payouts", result.payouts.to_arrow())
    con.execute("CREATE TABLE rc_commissions AS SELECT * FROM _lines")
    con.execute("CREATE TABLE rc_payouts AS SELECT * FROM _payouts")
    return con, DuckReader(con)


@PROFILE
@given(stream=ledger_streams())
def test_only_money_sent_is_paid_and_every_balance_is_its_lines(stream: Stream) -> None:
    """CONTRACT 15 on generated ledgers (batches as snapshots, cancels, failed rows, manual
    entries, holds, voids, late rows, refunds after payment): no line is `paid` unless a paid
    batch's row that did not fail holds it; a live row's lines add up to what it sends; and each
    partner's closing balance (their statement) is the sum of their approved unpaid lines."""
    result = reconcile(stream.frame(), stream.programs, stream.partners, stream.now)
    lines = result.commissions
    batches = {r["payout_id"]: r for r in result.payouts.iter_rows(named=True)}
    for line in lines.filter(pl.col("status") == "paid").iter_rows(named=True):
        batch = batches[line["payout_id"]]
        assert batch["status"] == "paid", line
        if batch["snapshot"] is not None:
            pairs = {(r["partner_code"], r["currency"]) for r in json.loads(batch["snapshot"])["rows"]}
            failed = {(f["partner_code"], f["currency"]) for f in json.loads(batch["failures"] or "[]")}
            assert (line["partner_code"], line["currency"]) in pairs - failed, line
    for batch in batches.values():
        if batch["snapshot"] is None or batch["status"] == "cancelled":
            continue
        failed = {(f["partner_code"], f["currency"]) for f in json.loads(batch["failures"] or "[]")}
        for row in json.loads(batch["snapshot"])["rows"]:
            pair = (row["partner_code"], row["currency"])
            if pair in failed:
                continue
            held = lines.filter(
                (pl.col("payout_id") == batch["payout_id"])
                & (pl.col("partner_code") == pair[0])
                & (pl.col("currency") == pair[1])
            )
            assert held.get_column("amount").sum() == row["amount"], (batch["payout_id"], row)
    con, db = _books(result)
    # lines a batch made before snapshots took: read as they always were (carried, not checked)
    legacy = {r["payout_id"] for r in batches.values() if r["snapshot"] is None}
    before_snapshots = {
        (r["partner_code"], r["currency"])
        for r in lines.filter(pl.col("payout_id").is_in(list(legacy))).iter_rows(named=True)
    }
    owed = (
        lines.filter((pl.col("status") == "approved") & pl.col("booked_seq").is_not_null())
        .group_by("partner_code", "currency")
        .agg(pl.col("amount").sum())
    )
    expected = {(r["partner_code"], r["currency"]): r["amount"] for r in owed.iter_rows(named=True)}
    accounts = lines.filter(pl.col("booked_seq").is_not_null()).select("partner_code", "currency").unique()
    for code, currency in accounts.iter_rows():
        if (code, currency) in before_snapshots:
            continue
        closing = statements.statement(db, PROGRAM, code, currency)["closing_balance"]
        assert closing == expected.get((code, currency), 0), (code, currency)
    con.close()


@PROFILE
@given(stream=ledger_streams(), data=st.data())
def test_no_paid_batch_changes_a_byte_whatever_comes_later(stream: Stream, data: st.DataObject) -> None:
    """Every output of a paid batch (JSON view, CSV, xlsx, PayPal and Wise files) after later
    refunds, re-attributions, a change of terms, cancels and failed rows of other batches, and
    bookings of what is due then, is the same bytes as before them."""
    now = max(stream.now, *(r["received_at"] for r in stream.rows))
    (terms_now,) = stream.programs.to_dicts()
    settings = {k: v for k, v in terms_now.items() if k != "program_id"}
    booked = [*stream.rows, *b.bookings(stream.rows, now, stream.partners, **settings)]
    before = reconcile(b.frame(booked), stream.programs, stream.partners, now)
    later = now + timedelta(days=data.draw(st.integers(0, 400), label="days later"))
    terms, programs = _new_terms(stream, data, later)
    others = [
        b.payout_cancel(f"late_cancel_{p}", p, occurred_at=later)
        for p in before.payouts.filter(pl.col("status") == "open").get_column("payout_id")
    ]
    rows = [*booked, *_later_changes(stream, data, later), *terms, *others]
    rows += b.bookings(rows, later + timedelta(days=1), stream.partners, **settings)
    after = reconcile(b.frame(rows), programs, stream.partners, later + timedelta(days=1))
    was_con, was = _books(before)
    now_con, now_db = _books(after)
    for payout_id in before.payouts.filter(pl.col("status") == "paid").get_column("payout_id"):
        old = payouts.batch(was, PROGRAM, payout_id, {})
        new = payouts.batch(now_db, PROGRAM, payout_id, {})
        assert old is not None and new is not None
        if not old["snapshot"]:
            continue  # made before snapshots: read with today's details, as it always was
        assert new == old
        for render in (payouts.to_csv, payouts.to_xlsx, payfiles.wise_csv):
            assert render(new) == render(old)
        for currency in sorted({r["currency"] for r in old["rows"]}):
            assert payfiles.paypal_csv(new, "Program A", currency) == payfiles.paypal_csv(
                old, "Program A", currency
            )
    was_con.close()
    now_con.close()
