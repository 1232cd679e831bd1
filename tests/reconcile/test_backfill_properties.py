"""Backfill: the dry run is the apply. Through the real app on a real DuckDB file (the endpoint's
own code: `POST .../metadata-fixes`, `POST .../backfill`, `Reconciler.backfill`, the writer, the
job), for random logs and random metadata fixes:

- fixes alone change nothing (even after an earlier backfill over all time), nor does a dry
  run;
- the diff a dry run returns is the diff the apply returns, and it is exactly what the apply
  changed in `rc_sales` (before/after of every sale whose partner, rule, reason, commission or
  fee moved, and only those);
- after the apply the tables are a full reconcile of the log, fixes in force, which is what the
  reference (tests/reconcile/reference.py) computes;
- applying again changes nothing: an empty diff, the same tables.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import polars as pl
import time_machine
from hypothesis import event, given
from hypothesis import strategies as st

from tests.conftest import OP
from tests.reconcile import builders as b
from tests.reconcile.apps import Tables, app_with, assert_reference, assert_same, tables
from tests.reconcile.streams import CLICKS, CUSTOMERS, EDGES, WEIGHTED_PROGRAMS, Stream, profile, streams

# What a backfill diff compares (CONTRACT section 7: a sale whose attribution or commission would
# change), written out here rather than read from reconcile/backfill.py.
COMPARED = ("partner_code", "attribution_rule", "unattributed_reason", "commission", "platform_fee")

SALE_IDS = ("subscription_id", "transaction_id", "invoice_id", "payment_intent_id", "checkout_session_id")


@st.composite
def corrections(draw: st.DrawFn, stream: Stream, program: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """1-3 metadata fixes as the endpoint takes them and a backfill range, aimed mostly at what
    the program's rows hold (their sales' ids, its clicks and customer keys; a range around the
    days of the sales the fixes name) so that they often change something, else at the ids
    streams use; the range may be open on either side, or start on the day of an edge."""
    rows = [row for row in stream.rows if row["program_id"] == program]
    sales = [r for r in rows if r["kind"] in ("sale", "stripe") and r["event_type"] != "charge.refunded"]
    bare = [r for r in sales if r["click_id"] is None and not r["test_mode"]]  # likely unattributed
    subscriptions = sorted({r["subscription_id"] for r in sales if r["subscription_id"]} | {"sub_1"})
    transactions = sorted({r[c] for r in sales for c in SALE_IDS[1:] if r[c]} | {"in_1"})
    transactions += sorted({r[c] for r in bare for c in SALE_IDS[1:] if r[c]}) * 2
    clicks = sorted({r["click_id"] for r in rows if r["kind"] == "click"} | {CLICKS[0]})
    keys = sorted({r["customer_key"] for r in rows if r["customer_key"]} | {f"ck_{CUSTOMERS[0]}"})
    fixes = []
    for _ in range(draw(st.integers(1, 3))):
        fix = (
            {"subscription_id": draw(st.sampled_from(subscriptions))}
            if draw(st.booleans())
            else {"transaction_id": draw(st.sampled_from(transactions))}
        )
        values = draw(st.sampled_from(("click", "both", "key")))
        if values in ("key", "both"):
            fix["svc_customer_key"] = draw(st.sampled_from(keys))
        if values in ("click", "both"):
            fix["svc_click_id"] = draw(st.sampled_from(clicks))
        fixes.append(fix)
    named = {value for fix in fixes for key, value in fix.items() if key in SALE_IDS}
    days = sorted({r["occurred_at"].date() for r in sales if named & {r[c] for c in SALE_IDS}})
    start: date = draw(
        st.sampled_from(days or [b.T0.date()]) | st.sampled_from(EDGES).map(lambda edge: edge.date())
        if draw(st.integers(0, 3)) == 3
        else st.sampled_from(days or [b.T0.date()])
    )
    start -= timedelta(days=draw(st.sampled_from((0, 0, 1, 40))))
    end = start + timedelta(days=draw(st.sampled_from((1, 30, 0, 120, 900))))
    span = {
        "from": draw(st.sampled_from((None, start.isoformat(), start.isoformat()))),
        "to": draw(st.sampled_from((None, end.isoformat(), end.isoformat()))),
    }
    return fixes, span


def changes(before: Tables, after: Tables, program_id: str) -> set[tuple[Any, ...]]:
    """(sale_id, before_*..., after_*...) of the program's sales whose compared columns moved."""
    keep = ["sale_id", *COMPARED]
    joined = (
        before["rc_sales"]
        .filter(pl.col("program_id") == program_id)
        .select(keep)
        .join(
            after["rc_sales"].filter(pl.col("program_id") == program_id).select(keep),
            on="sale_id",
            how="full",
            coalesce=True,
            suffix="_after",
        )
    )
    moved = joined.filter(pl.any_horizontal([pl.col(c).ne_missing(pl.col(f"{c}_after")) for c in COMPARED]))
    return set(moved.select("sale_id", *COMPARED, *(f"{c}_after" for c in COMPARED)).rows())


def listed(diff: dict[str, Any]) -> set[tuple[Any, ...]]:
    return {
        (
            s["sale_id"],
            *(s[f"before_{c}"] for c in COMPARED),
            *(s[f"after_{c}"] for c in COMPARED),
        )
        for s in diff["changed_sales"]
    }


def unnamed(line: dict[str, Any], backfill_id: str) -> dict[str, Any]:
    return {**line, "cause": None if line["cause"] == backfill_id else line["cause"]}


def diff_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()["data"]
    return {k: data[k] for k in ("changed_sales", "partner_totals", "adjustments", "changes")}


@profile(2, ci=15)
@given(stream=streams(max_events=30), target=st.sampled_from(WEIGHTED_PROGRAMS), data=st.data())
def test_the_dry_run_is_the_apply(stream: Stream, target: str, data: st.DataObject) -> None:
    fixed, span = data.draw(corrections(stream, target), label="fixes and range")
    with time_machine.travel(stream.now, tick=False), app_with(stream) as (client, state, ids):
        program = ids[target]
        path = f"/api/v1/programs/{program}/backfill"
        # an earlier backfill over all time (it reconciles): it must not apply later fixes
        diff_of(client.post(path, json={"dry_run": False}, headers=OP))
        before = tables(state)

        r = client.post(f"/api/v1/programs/{program}/metadata-fixes", json={"fixes": fixed}, headers=OP)
        assert r.status_code == 201, r.text
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        assert_same(tables(state), before)  # a fix alone changes nothing

        dry = diff_of(client.post(path, json={**span, "dry_run": True}, headers=OP))
        assert_same(tables(state), before)  # nor does a dry run

        response = client.post(path, json={**span, "dry_run": False}, headers=OP)
        applied = diff_of(response)
        backfill_id = response.json()["data"]["backfill_id"]
        # the same lines (in any order), except that the dry run's name no backfill (none had
        # an id yet)
        named = [unnamed(line, backfill_id) for line in applied["adjustments"]]
        assert sorted(map(repr, named)) == sorted(map(repr, dry["adjustments"]))
        assert {**applied, "adjustments": []} == {**dry, "adjustments": []}
        after = tables(state)
        assert_reference(state, stream)
        assert listed(applied) == changes(before, after, program)
        assert applied["changes"] == len(applied["changed_sales"])
        event("the backfill changes sales" if applied["changes"] else "the backfill changes no sale")

        again = diff_of(client.post(path, json={**span, "dry_run": False}, headers=OP))
        assert again == {"changed_sales": [], "partner_totals": [], "adjustments": [], "changes": 0}
        assert_same(tables(state), after)


def test_a_fixed_renewal_moves_in_the_diff_and_in_the_tables() -> None:
    """One example the property must see as a change (so its harness cannot pass by seeing
    none): a renewal without metadata, fixed and backfilled, moves to the click's partner."""
    renewal = b.invoice("evt_2", "in_2", 10_000, subscription_id="sub_1", occurred_at=b.at(days=31))
    stream = Stream(
        rows=[b.click("clk_1", "p1"), renewal],
        programs=b.programs(holding_days=0),
        partners=b.partners(("p1", None)),
        now=b.at(days=40),
    )
    with time_machine.travel(stream.now, tick=False), app_with(stream) as (client, state, ids):
        program = ids["prog_a"]
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        before = tables(state)
        fix = {"subscription_id": "sub_1", "svc_click_id": "clk_1"}
        r = client.post(f"/api/v1/programs/{program}/metadata-fixes", json={"fixes": [fix]}, headers=OP)
        assert r.status_code == 201, r.text
        path = f"/api/v1/programs/{program}/backfill"
        dry = diff_of(client.post(path, json={"from": "2026-02-01", "dry_run": True}, headers=OP))
        applied = diff_of(client.post(path, json={"from": "2026-02-01", "dry_run": False}, headers=OP))
        assert applied == dry and dry["changes"] == 1
        assert listed(dry) == changes(before, tables(state), program)
        sale = dry["changed_sales"][0]
        assert (sale["before_partner_code"], sale["after_partner_code"]) == (None, "p1")
        assert (sale["before_commission"], sale["after_commission"]) == (0, 3_000)
        assert_reference(state, stream)
