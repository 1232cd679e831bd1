"""Bounds at the edge (CONTRACT sections 4, 6 and 7): every amount, time, string, setting and
period is held to `ingest/bounds.py` when it arrives; at the bound it is taken, one beyond it is a
422 `validation_error` naming the field, and nothing the log cannot hold is ever acknowledged."""

from __future__ import annotations

import logging
from datetime import UTC
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient

from ingest.domain.bounds import MAX_AMOUNT
from ingest.domain.records import ProgramSettings
from tests.conftest import OP, World, bearer, start_server
from tests.helpers import logged_in, program_path, settings_form, sql_rows

BIG = 2**63  # one past BIGINT: the value that wedged the journal copier


def rows(client: TestClient, sql: str) -> list[tuple[Any, ...]]:
    state = client.app.state.tally  # type: ignore[attr-defined]
    state.writer.sync_blocking()
    found: list[tuple[Any, ...]] = sql_rows(state.store, sql)
    return found


def raw_count(client: TestClient) -> int:
    return int(rows(client, "SELECT count(*) FROM raw_events")[0][0])


def refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "validation_error"
    assert field in [f["field"] for f in error["fields"]], error


# -- amounts ---------------------------------------------------------------------------------------
def test_sale_amount_at_the_bound_is_taken_and_one_beyond_is_refused(world: World) -> None:
    assert world.sale(transaction_id="in_max", amount=MAX_AMOUNT).status_code == 200
    assert world.sale(transaction_id="in_min", amount=1).status_code == 200
    before = raw_count(world.client)
    refused(world.sale(transaction_id="in_over", amount=MAX_AMOUNT + 1), "amount")
    refused(world.sale(transaction_id="in_zero", amount=0), "amount")
    assert raw_count(world.client) == before


@pytest.mark.parametrize("amount", [BIG, 2**64, 10**30, 10**300])
def test_huge_sale_amount_is_refused_and_nothing_appended(world: World, amount: int) -> None:
    before = raw_count(world.client)
    refused(world.sale(transaction_id="in_huge", amount=amount), "amount")
    test_mode = world.sale(transaction_id="in_huge_t", amount=amount, additional_data={"test_mode": True})
    refused(test_mode, "amount")
    assert raw_count(world.client) == before
    # the transaction id was not taken: the real sale goes through afterwards
    assert world.sale(transaction_id="in_huge", amount=1000).status_code == 200


def refund(world: World, **body: Any) -> httpx.Response:
    payload = {"transaction_id": "in_1", "refund_id": "re_1", "amount": 100, **body}
    return world.client.post("/api/v1/track/refund", json=payload, headers=world.key)


def test_refund_amount_bounds(world: World) -> None:
    before = raw_count(world.client)
    refused(refund(world, amount=BIG), "amount")
    refused(refund(world, amount=MAX_AMOUNT + 1), "amount")
    refused(refund(world, amount=0), "amount")
    assert raw_count(world.client) == before
    r = refund(world, transaction_id="in_unknown", amount=MAX_AMOUNT)
    assert r.status_code == 200, r.text
    assert r.json()["warnings"][0]["code"] == "sale_not_found"


# -- times -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("occurred_at", "stored"),
    [
        ("1970-01-01T00:00:00Z", "1970-01-01 00:00:00"),
        ("1970-01-01T01:00:00+01:00", "1970-01-01 00:00:00"),
        ("9999-12-30T23:59:59Z", "9999-12-30 23:59:59"),
        ("9999-12-31T09:59:59+10:00", "9999-12-30 23:59:59"),
        ("2026-03-01T12:30:00+05:30", "2026-03-01 07:00:00"),
    ],
)
def test_times_within_the_bounds_are_stored_in_utc(world: World, occurred_at: str, stored: str) -> None:
    assert world.sale(occurred_at=occurred_at).status_code == 200
    found = rows(world.client, "SELECT occurred_at FROM raw_events WHERE kind = 'sale'")
    assert [(at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),) for (at,) in found] == [(stored,)]


@pytest.mark.parametrize(
    "occurred_at",
    [
        "1969-12-31T23:59:59Z",
        "1970-01-01T00:59:59+01:00",
        "9999-12-31T00:00:00Z",
        "9999-12-30T23:59:59-00:01",
        "9999-12-31T23:59:59-01:00",  # year 10000 in UTC
        "0001-01-01T00:00:00+01:00",  # year 0 in UTC
        "0001-01-01T00:00:00Z",
        "2026-11-01T10:00:00",  # no offset
        1_700_000_000,  # unix seconds are not RFC 3339
    ],
)
def test_times_beyond_the_bounds_are_refused_and_nothing_stored(world: World, occurred_at: Any) -> None:
    before = raw_count(world.client)
    refused(world.sale(occurred_at=occurred_at), "occurred_at")
    refused(refund(world, occurred_at=occurred_at), "occurred_at")
    assert raw_count(world.client) == before


def flag(client: TestClient, program_id: str, deadline: str) -> httpx.Response:
    return client.post(
        f"/api/v1/operator/programs/{program_id}/api-key/rotation", json={"deadline": deadline}, headers=OP
    )


def test_rotation_deadline_in_year_10000_is_refused_and_not_saved(world: World) -> None:
    r = flag(world.client, world.program_id, "9999-12-31T23:59:59-01:00")
    refused(r, "deadline")
    program = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert program["api_key_rotation_deadline"] is None
    sale = world.sale()  # the key is not flagged
    assert "Sunset" not in sale.headers
    assert "api_key_rotation_required" not in [w["code"] for w in sale.json()["warnings"]]
    refused(flag(world.client, world.program_id, "1969-12-31T23:59:59Z"), "deadline")


def test_rotation_deadline_is_returned_in_utc_with_z(world: World) -> None:
    r = flag(world.client, world.program_id, "9999-12-31T09:59:59+10:00")
    assert r.status_code == 200, r.text
    assert r.json()["data"]["deadline"] == "9999-12-30T23:59:59Z"
    sale = world.sale().json()
    assert sale["warnings"][0]["deadline"] == "9999-12-30T23:59:59Z"


# -- strings ---------------------------------------------------------------------------------------
def test_ids_and_strings_are_at_most_255_characters(world: World) -> None:
    assert world.sale(transaction_id="t" * 255, customer_external_id="c" * 255).status_code == 200
    refused(world.sale(transaction_id="t" * 256), "transaction_id")
    refused(world.sale(customer_external_id="c" * 256), "customer_external_id")
    email = "e" * 243 + "@example.com"  # 255
    assert world.sale(transaction_id="in_e", email=email).status_code == 200
    refused(world.sale(transaction_id="in_e2", email="e" + email), "email")
    refused(refund(world, reason="r" * 256), "reason")
    lead = {"customer_external_id": "c1", "name": "n" * 256}
    refused(world.client.post("/api/v1/track/lead", json=lead, headers=world.key), "name")


BLANK = ["   ", "\t", "\n", "\u00a0"]  # whitespace only: never an id


@pytest.mark.parametrize("blank", BLANK)
def test_whitespace_only_ids_are_refused_and_nothing_stored(world: World, blank: str) -> None:
    before = raw_count(world.client)
    refused(world.sale(transaction_id=blank), "transaction_id")
    refused(world.sale(customer_external_id=blank), "customer_external_id")
    refused(world.sale(transaction_id="in_b", click_id=blank), "click_id")
    refused(world.sale(transaction_id="in_b", subscription_id=blank), "subscription_id")
    refused(refund(world, refund_id=blank), "refund_id")
    refused(refund(world, transaction_id=blank), "transaction_id")
    lead = {"customer_external_id": blank}
    refused(world.client.post("/api/v1/track/lead", json=lead, headers=world.key), "customer_external_id")
    click = {"program_id": world.program_id, "partner_code": blank}
    refused(world.client.post("/api/v1/track/click", json=click), "partner_code")
    click = {"program_id": blank, "partner_code": "alice"}
    refused(world.client.post("/api/v1/track/click", json=click), "program_id")
    fixes = f"/api/v1/programs/{world.program_id}/metadata-fixes"
    fix = {"fixes": [{"subscription_id": "sub_1", "svc_customer_key": blank}]}
    refused(world.client.post(fixes, json=fix, headers=world.owner), "fixes.0.svc_customer_key")
    assert raw_count(world.client) == before
    # an id with a space inside it is still an id
    assert world.sale(transaction_id="in 1", customer_external_id=" c 1").status_code == 200


def test_click_urls_keep_2048_characters(world: World) -> None:
    """Landing and referrer URLs with tracking parameters pass 255; refusing them would lose clicks."""
    body = {"program_id": world.program_id, "partner_code": "alice"}
    url = "https://brand.test/?utm=" + "x" * (2048 - 24)
    r = world.client.post("/api/v1/track/click", json={**body, "url": url, "referrer": url})
    assert r.status_code == 201, r.text
    refused(world.client.post("/api/v1/track/click", json={**body, "url": url + "x"}), "url")


# -- program settings ------------------------------------------------------------------------------
SETTING_BOUNDS = [
    ("commission_bps", 0, 10_000),
    ("platform_fee_bps", 0, 10_000),
    ("commission_flat", 0, MAX_AMOUNT),
    ("recurring_months", 0, 1200),
    ("holding_days", 0, 3650),
]


@pytest.mark.parametrize(("name", "low", "high"), SETTING_BOUNDS)
def test_setting_bounds_on_patch(world: World, name: str, low: int, high: int) -> None:
    path = f"/api/v1/programs/{world.program_id}"
    for value in (low, high):
        r = world.client.patch(path, json={name: value}, headers=world.owner)
        assert r.status_code == 200, r.text
        assert r.json()["data"][name] == value
    for value in (low - 1, high + 1, BIG, 2**63 - 1):
        refused(world.client.patch(path, json={name: value}, headers=world.owner), name)
    assert world.client.get(path, headers=world.owner).json()["data"][name] == high


@pytest.mark.parametrize(("name", "low", "high"), SETTING_BOUNDS)
def test_setting_bounds_on_create(world: World, name: str, low: int, high: int) -> None:
    body = {"workspace_id": world.workspace_id, "name": "Second"}
    r = world.client.post("/api/v1/programs", json={**body, name: high}, headers=world.owner)
    assert r.status_code == 201, r.text
    before = len(world.client.get("/api/v1/programs", headers=world.owner).json()["data"])
    refused(world.client.post("/api/v1/programs", json={**body, name: high + 1}, headers=world.owner), name)
    after = len(world.client.get("/api/v1/programs", headers=world.owner).json()["data"])
    assert after == before


def test_recurring_months_may_be_null_again(world: World) -> None:
    path = f"/api/v1/programs/{world.program_id}"
    assert world.client.patch(path, json={"recurring_months": 1200}, headers=world.owner).status_code == 200
    r = world.client.patch(path, json={"recurring_months": None}, headers=world.owner)
    assert r.status_code == 200 and r.json()["data"]["recurring_months"] is None


def test_poisoned_settings_are_refused_on_the_agent_endpoint(world: World) -> None:
    r = world.client.post(
        "/api/v1/operator/agent-keys",
        json={"name": "tool", "scopes": ["programs:write"], "workspace_ids": [world.workspace_id]},
        headers=OP,
    )
    agent = bearer(r.json()["data"]["agent_key"])
    path = f"/api/agent/v1/programs/{world.program_id}"
    refused(world.client.patch(path, json={"commission_flat": BIG}, headers=agent), "commission_flat")
    refused(world.client.patch(path, json={"recurring_months": 2**63 - 1}, headers=agent), "recurring_months")
    assert world.client.patch(path, json={"holding_days": 3650}, headers=agent).status_code == 200


def test_poisoned_settings_are_refused_on_the_dashboard_form(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    for name, value in (
        ("commission_flat", str(BIG)),
        ("recurring_months", "1201"),
        ("holding_days", "3651"),
    ):
        r = world.client.post(program_path(world, "/settings"), data=settings_form(token, **{name: value}))
        assert r.status_code == 422 and name in r.text
    api = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert (api["commission_flat"], api["recurring_months"], api["holding_days"]) == (0, None, 30)


def test_program_settings_model_holds_the_bounds_itself() -> None:
    assert ProgramSettings(commission_flat=MAX_AMOUNT, recurring_months=1200).commission_flat == MAX_AMOUNT
    for name, _, high in SETTING_BOUNDS:
        with pytest.raises(ValidationError):
            ProgramSettings.model_validate({name: high + 1})


def test_stored_settings_out_of_bounds_are_clamped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    stored = (
        '{"commission_type": "flat", "commission_flat": 9223372036854775808, "recurring_months": '
        '9223372036854775807, "holding_days": -4, "commission_bps": 3000, "platform_fee_bps": "x", '
        '"retired_setting": 1, "stripe_account_id": "acct_1"}'
    )
    with caplog.at_level(logging.WARNING, logger="tally.ingest"):
        settings = ProgramSettings.from_stored(stored, "prog_old")
    assert settings == ProgramSettings(
        commission_type="flat",
        commission_flat=MAX_AMOUNT,
        recurring_months=1200,
        holding_days=0,
        commission_bps=3000,
        stripe_account_id="acct_1",
    )
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for name in (
        "commission_flat",
        "recurring_months",
        "holding_days",
        "platform_fee_bps",
        "retired_setting",
    ):
        assert name in logged and "prog_old" in logged
    assert ProgramSettings.from_stored("not json", "prog_x") == ProgramSettings()
    assert ProgramSettings.from_stored(ProgramSettings(holding_days=7).model_dump_json()).holding_days == 7


# -- report parameters -----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["json", "csv", "html", "xlsx"])
@pytest.mark.parametrize("period", ["9999-12", "1970-01"])
def test_finance_report_at_the_edge_periods_is_an_empty_report(world: World, period: str, fmt: str) -> None:
    path = f"/api/v1/programs/{world.program_id}/reports/finance?period={period}&format={fmt}"
    r = world.client.get(path, headers=world.owner)
    assert r.status_code == 200, r.text
    if fmt == "json":
        assert r.json()["data"]["period"] == period and r.json()["data"]["currencies"] == []


@pytest.mark.parametrize("period", ["1969-12", "0000-01", "10000-01", "9999-13", "2026-1"])
def test_periods_beyond_the_years_are_refused_everywhere(world: World, period: str) -> None:
    base = f"/api/v1/programs/{world.program_id}"
    for path in (
        f"{base}/reports/finance?period={period}",
        f"{base}/reports/double-counting?period={period}",
        f"{base}/commissions?period={period}",
    ):
        refused(world.client.get(path, headers=world.owner), "period")
    refused(world.client.post(f"{base}/periods/{period}/close", headers=world.owner), "period")


def test_edge_periods_are_taken_by_commissions_and_double_counting(world: World) -> None:
    base = f"/api/v1/programs/{world.program_id}"
    for path in (f"{base}/commissions?period=9999-12", f"{base}/reports/double-counting?period=9999-12"):
        assert world.client.get(path, headers=world.owner).status_code == 200


def test_a_sale_at_the_last_day_reads_back_with_every_time_within_the_bounds(world: World) -> None:
    """A sale at the end of the time range, held 30 days (the default): its commission would be
    approved in year 10000, which no read can show (nor PostgreSQL's client load); the line is
    available at the last moment of the range instead, and every read of the month answers."""
    click = world.client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
    )
    r = world.sale(
        transaction_id="in_edge",
        occurred_at="9999-12-29T23:59:59Z",
        click_id=click.json()["data"]["click_id"],
    )
    assert r.status_code == 200 and r.json()["data"]["attributed"] is True, r.text
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    base = f"/api/v1/programs/{world.program_id}"
    r = world.client.get(f"{base}/commissions?period=9999-12", headers=world.owner)
    assert r.status_code == 200, r.text
    [line] = r.json()["data"]
    assert (line["transaction_id"], line["status"]) == ("in_edge", "pending")
    assert (line["dated_at"], line["available_at"]) == ("9999-12-29T23:59:59Z", "9999-12-30T23:59:59Z")
    for path in (
        f"{base}/commissions?period=9999-12&format=csv",
        f"{base}/reports/finance?period=9999-12",
        f"{base}/sales",
    ):
        r = world.client.get(path, headers=world.owner)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("from=0001-01-01&to=9999-12-31", "from"),
        ("from=1969-12-31", "from"),
        ("to=10000-01-01", "to"),
        ("from=0001-01-01T00:00:00%2B01:00", "from"),
        ("to=9999-12-31T23:59:59-01:00", "to"),
    ],
)
def test_sales_ranges_beyond_the_years_are_refused(world: World, query: str, field: str) -> None:
    r = world.client.get(f"/api/v1/programs/{world.program_id}/sales?{query}", headers=world.owner)
    refused(r, field)


def test_sales_range_over_every_year_is_taken(world: World) -> None:
    assert world.sale().status_code == 200
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    path = f"/api/v1/programs/{world.program_id}/sales?from=1970-01-01&to=9999-12-31"
    r = world.client.get(path, headers=world.owner)
    assert r.status_code == 200, r.text
    assert [s["transaction_id"] for s in r.json()["data"]] == ["in_1"]
    assert r.json()["data"][0]["occurred_at"].endswith("Z")


def test_backfill_ranges_are_bounded_to_the_same_years(world: World) -> None:
    path = f"/api/v1/programs/{world.program_id}/backfill"
    r = world.client.post(path, json={"from": "1970-01-01", "to": "9999-12-31"}, headers=world.owner)
    assert r.status_code == 200, r.text
    refused(world.client.post(path, json={"from": "0001-01-01"}, headers=world.owner), "from")
    refused(world.client.post(path, json={"to": "1969-12-31"}, headers=world.owner), "to")


# -- dates: a string YYYY-MM-DD, nothing else ------------------------------------------------------
NOT_DATES = [
    1767139200,  # unix seconds (was 2025-12-31)
    0,  # (was 1970-01-01)
    "1767139200",
    "2025-12-31T00:00:00",
    "2025-12-31T00:00:00Z",
    "2025-W01-1",  # an ISO week date
    "20251231",
    "2025-12-31\n",
    True,
]


@pytest.mark.parametrize("value", NOT_DATES)
def test_payout_and_backfill_dates_are_strings_yyyy_mm_dd_only(world: World, value: Any) -> None:
    payouts = f"/api/v1/programs/{world.program_id}/payouts"
    backfill = f"/api/v1/programs/{world.program_id}/backfill"
    before = raw_count(world.client)
    refused(world.client.post(payouts, json={"up_to": value}, headers=world.owner), "up_to")
    refused(world.client.post(backfill, json={"from": value}, headers=world.owner), "from")
    refused(world.client.post(backfill, json={"to": value, "dry_run": False}, headers=world.owner), "to")
    assert raw_count(world.client) == before
    assert world.client.post(payouts, json={"up_to": "2025-12-31"}, headers=world.owner).status_code == 200
    r = world.client.post(backfill, json={"from": "2025-12-01", "to": "2025-12-31"}, headers=world.owner)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("value", ["1767139200", "2025-W01-1", "2025-12-31T10Z", "0"])
def test_sales_range_is_a_date_or_a_full_rfc_3339_time(world: World, value: str) -> None:
    path = f"/api/v1/programs/{world.program_id}/sales"
    refused(world.client.get(path, params={"from": value}, headers=world.owner), "from")
    refused(world.client.get(path, params={"to": value}, headers=world.owner), "to")


@pytest.mark.parametrize("value", ["1767139200", "1767139200.5", "2025-12-31"])
def test_times_are_never_seconds_or_dates_in_a_string(world: World, value: str) -> None:
    refused(world.sale(occurred_at=value), "occurred_at")
    refused(flag(world.client, world.program_id, value), "deadline")


# -- through a real server process -----------------------------------------------------------------
@pytest.mark.slow
def test_a_live_server_refuses_poison_and_keeps_working(tmp_path: Path) -> None:
    database = tmp_path / "bounds.duckdb"
    server = start_server(database)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            world = live_world(http)
            key, owner = bearer(world["api_key"]), bearer(world["token"])
            poison = {"transaction_id": "in_big", "customer_external_id": "c", "amount": BIG}
            assert http.post("/api/v1/track/sale", json=poison, headers=key).status_code == 422
            refund_body = {"transaction_id": "in_big", "refund_id": "re_big", "amount": BIG}
            assert http.post("/api/v1/track/refund", json=refund_body, headers=key).status_code == 422
            program = f"/api/v1/programs/{world['program_id']}"
            assert http.patch(program, json={"commission_flat": BIG}, headers=owner).status_code == 422
            assert http.patch(program, json={"recurring_months": 2**63 - 1}, headers=owner).status_code == 422
            rotation = f"/api/v1/operator/programs/{world['program_id']}/api-key/rotation"
            late = {"deadline": "9999-12-31T23:59:59-01:00"}
            assert http.post(rotation, json=late, headers=OP).status_code == 422

            sale = {"transaction_id": "in_ok", "customer_external_id": "c", "amount": 1000}
            assert http.post("/api/v1/track/sale", json=sale, headers=key).status_code == 200
            r = http.post("/api/v1/operator/reconcile", headers=OP)
            assert r.status_code == 200, r.text
            assert r.json()["data"]["sales"] == 1
            assert http.get(f"{program}/reports/finance?period=9999-12", headers=owner).status_code == 200
    finally:
        server.stop()
        if server.process.stderr:
            server.process.stderr.close()

    server = start_server(database)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            r = http.post("/api/v1/track/sale", json=sale, headers=key)
            assert (r.status_code, r.json()["error"]["code"]) == (409, "duplicate_transaction")
            sales = http.get(f"{program}/sales", headers=owner).json()["data"]
            assert [s["transaction_id"] for s in sales] == ["in_ok"]
            assert http.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    finally:
        server.stop()
        if server.process.stderr:
            server.process.stderr.close()


def live_world(http: httpx.Client) -> dict[str, str]:
    r = http.post(
        "/api/v1/operator/accounts", json={"email": "o@brand.test", "workspace_name": "B"}, headers=OP
    )
    assert r.status_code == 201, r.text
    account = r.json()["data"]
    owner = bearer(account["token"])
    r = http.post(
        "/api/v1/programs", json={"workspace_id": account["workspace_id"], "name": "P"}, headers=owner
    )
    assert r.status_code == 201, r.text
    program_id = r.json()["data"]["program_id"]
    r = http.post(f"/api/v1/programs/{program_id}/api-key", headers=owner)
    assert r.status_code == 201, r.text
    return {"token": account["token"], "program_id": program_id, "api_key": r.json()["data"]["api_key"]}
