"""Every timestamp tally writes is RFC 3339 in UTC (CONTRACT section 1), for the most extreme
inputs it takes: sales, refunds, processor events and a rotation deadline at the first and the
last second the bounds allow (1970-01-01T00:00:00Z, 9999-12-30T23:59:59Z), the longest holding
period (3650 days) and recurring window (1200 months), finance actions, a payout batch up to
9999-12-31, a closed month, a backfill over every year. Then every read answers, and every string
in it that reads as a time, and every `*_at` / deadline field, must be RFC 3339 `...Z` within
years 1970..9999.

A commission's `available_at` is `occurred_at` + the holding days, capped at the latest time the
bounds allow (9999-12-30T23:59:59Z): a sale near the end of year 9999 is never refused for it,
and no `available_at` reads `10000-01-28 23:59:59+00` (README, "Times")."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from starlette.testclient import TestClient

from ingest.domain.bounds import EARLIEST, LATEST
from tests.conftest import OP, World, bearer, make_world
from tests.helpers import ACCOUNT, deliver, payee, renewal_event

FIRST = "1970-01-01T00:00:00Z"
LAST = "9999-12-30T23:59:59Z"  # the latest time the bounds take (ingest/bounds.py LATEST)
RFC3339_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z")
LOOKS_LIKE_TIME = re.compile(r"[+-]?\d{4,}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")
TIME_KEYS = re.compile(r".*(_at|deadline|timestamp)$")


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf of a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from walk(item, f"{path}[{n}]")
    else:
        yield path, value


def bad_times(where: str, body: Any) -> list[str]:
    """The leaves of `body` that are times but not RFC 3339 UTC within the bounds' years."""
    bad = []
    for path, value in walk(body):
        key = path.rsplit(".", 1)[-1]
        timed = TIME_KEYS.fullmatch(key) is not None and value is not None
        if isinstance(value, str) and (
            timed or LOOKS_LIKE_TIME.match(value) or re.search(r"\d{5,}-\d\d-\d\d", value)
        ):
            if not RFC3339_UTC.fullmatch(value):
                bad.append(f"{where} {path} = {value!r}")
                continue
            moment = datetime.fromisoformat(value)
            if not EARLIEST <= moment <= datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC):
                bad.append(f"{where} {path} = {value!r} (outside the bounds' years)")
        elif timed:
            bad.append(f"{where} {path} = {value!r} (not a string)")
    return bad


def csv_cells(text: str) -> list[dict[str, str]]:
    return [dict(row) for row in csv.DictReader(io.StringIO(text.lstrip("\ufeff")))]


class Outputs:
    """Every JSON answer (and CSV download) the test collects, to be walked at the end."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.seen: list[tuple[str, Any]] = []

    def json(self, method: str, url: str, headers: dict[str, str], **kw: Any) -> Any:
        r = self.client.request(method, url, headers=headers, **kw)
        assert r.status_code in (200, 201), f"{method} {url}: {r.status_code} {r.text}"
        self.seen.append((f"{method} {url}", r.json()))
        return r.json()["data"]

    def csv(self, url: str, headers: dict[str, str]) -> None:
        r = self.client.get(url, headers=headers)
        assert r.status_code == 200, f"GET {url}: {r.status_code} {r.text}"
        self.seen.append((f"GET {url}", csv_cells(r.text)))


def extreme_world(client: TestClient) -> World:
    world = make_world(
        client, holding_days=3650, recurring_months=1200, platform_fee_bps=250, stripe_account_id=ACCOUNT
    )
    for customer, email in (("cust_last", "last@buyer.test"), ("cust_first", "first@buyer.test")):
        click = client.post(
            "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"}
        )
        assert click.status_code == 201, click.text
        lead = {
            "customer_external_id": customer,
            "email": email,
            "click_id": click.json()["data"]["click_id"],
        }
        assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    payee(world, "alice")  # a batch pays only partners with payout details
    return world


def test_every_timestamp_in_the_api_outputs_is_rfc3339_for_extreme_inputs(client: TestClient) -> None:
    world = extreme_world(client)
    out = Outputs(client)
    program = f"/api/v1/programs/{world.program_id}"
    last_unix = int(LATEST.timestamp())
    # -- inputs at the bounds -------------------------------------------------------------------
    sales = {
        "in_last": ("cust_last", LAST),
        "in_issue": ("cust_last", "9999-12-29T00:00:00Z"),  # the issue's: + 30 days was year 10000
        "in_offset": ("cust_last", "9999-12-31T09:59:59+10:00"),  # LAST once in UTC
        "in_first": ("cust_first", FIRST),
        "in_nobody": ("nobody", LAST),
    }
    for transaction_id, (customer, at) in sales.items():
        body = {
            "transaction_id": transaction_id,
            "customer_external_id": customer,
            "amount": 10**12,
            "occurred_at": at,
        }
        out.json("POST", "/api/v1/track/sale", world.key, json=body)
    for refund_id, (transaction_id, amount, at) in {
        "re_first": ("in_first", 10**11, LAST),
        "re_last": ("in_last", 1, LAST),
        "re_unknown": ("in_unknown", 5, FIRST),
    }.items():
        body = {"transaction_id": transaction_id, "refund_id": refund_id, "amount": amount, "occurred_at": at}
        out.json("POST", "/api/v1/track/refund", world.key, json=body)
    paid: dict[str, Any] = {
        "status_transitions": {"paid_at": last_unix},
        "subscription_details": {"metadata": {"svc_customer_key": "cust_last"}},
    }
    connect = renewal_event("evt_last", "in_connect_last", **paid)
    connect["created"] = last_unix
    assert deliver(client, connect).status_code == 200
    stray = renewal_event("evt_stray", "in_stray", account="acct_nobody")
    stray["created"] = last_unix
    assert deliver(client, stray).status_code == 200
    out.json(
        "POST", f"/api/v1/operator/programs/{world.program_id}/api-key/rotation", OP, json={"deadline": LAST}
    )
    out.json("POST", "/api/v1/operator/reconcile", OP)
    # -- finance's acts, a batch up to the last day, a closed month, a backfill over every year --
    out.json("POST", f"{program}/commissions/in_issue/hold", world.owner, json={"reason": "check"})
    out.json("POST", f"{program}/commissions/in_issue/release", world.owner, json={"reason": "fine"})
    out.json("POST", f"{program}/commissions/in_offset/void", world.owner, json={"reason": "fraud"})
    out.json("POST", f"{program}/periods/1970-01/close", world.owner)
    batch = out.json("POST", f"{program}/payouts", world.owner, json={"up_to": "9999-12-31"})
    assert batch["status"] == "open" and batch["payout_id"], batch  # in_first's line is paid
    out.json("POST", f"{program}/payouts/{batch['payout_id']}/paid", world.owner)
    fixes = {"fixes": [{"transaction_id": "in_nobody", "svc_customer_key": "cust_last"}]}
    out.json("POST", f"{program}/metadata-fixes", world.owner, json=fixes)
    window = {"from": "1970-01-01", "to": "9999-12-31"}
    out.json("POST", f"{program}/backfill", world.owner, json={**window, "dry_run": True})
    out.json("POST", f"{program}/backfill", world.owner, json={**window, "dry_run": False})
    out.json("POST", "/api/v1/operator/reconcile", OP)
    # -- every read -------------------------------------------------------------------------------
    owner = world.owner
    out.json("GET", "/api/v1/programs", owner)
    out.json("GET", program, owner)
    out.json("GET", f"{program}/partners", owner)
    out.json("GET", f"{program}/checklist", owner)
    out.json("GET", f"{program}/tracking-log", owner)
    out.json("GET", "/api/v1/operator/unroutable", OP)
    sold = out.json("GET", f"{program}/sales", owner)
    assert {s["transaction_id"] for s in sold} >= set(sales) | {"in_connect_last"}
    out.json("GET", f"{program}/sales?from=1970-01-01&to=9999-12-31", owner)
    for sale in sold:
        out.json("GET", f"{program}/sales/{sale['transaction_id']}/explain", owner)
    lines = out.json("GET", f"{program}/commissions", owner)
    for period in ("9999-12", "1970-01"):
        out.json("GET", f"{program}/commissions?period={period}", owner)
        out.json("GET", f"{program}/reports/finance?period={period}&format=json", owner)
        out.csv(f"{program}/reports/finance?period={period}&format=csv", owner)
    out.json("GET", f"{program}/reports/double-counting?format=json", owner)
    out.csv(f"{program}/sales?format=csv", owner)
    out.csv(f"{program}/commissions?format=csv", owner)
    for listed in out.json("GET", f"{program}/payouts", owner):
        out.json("GET", f"{program}/payouts/{listed['payout_id']}", owner)
        out.csv(f"{program}/payouts/{listed['payout_id']}?format=csv", owner)
    out.json("GET", f"{program}/partners/alice", owner)
    out.json("GET", f"{program}/partners/alice/statement?currency=usd", owner)
    out.csv(f"{program}/partners/alice/statement?currency=usd&format=csv", owner)
    out.json("GET", "/api/agent/v1/programs", bearer(agent_key(client, world)))
    # -- the walk ---------------------------------------------------------------------------------
    bad = [problem for where, body in out.seen for problem in bad_times(where, body)]
    assert bad == [], "\n".join(bad)
    # the capped holding period: the last sales' lines become available at the last time there is
    far = {line["transaction_id"]: line["available_at"] for line in lines if line["kind"] == "commission"}
    assert far["in_last"] == far["in_issue"] == LAST
    assert far["in_first"] == "1979-12-30T00:00:00Z"  # 1970-01-01 + 3650 days: not capped


def agent_key(client: TestClient, world: World) -> str:
    body = {"name": "timestamps", "scopes": ["programs:read"], "workspace_ids": [world.workspace_id]}
    r = client.post("/api/v1/operator/agent-keys", json=body, headers=OP)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["agent_key"])


def test_the_walk_finds_what_is_not_rfc3339() -> None:
    found = bad_times(
        "x",
        {
            "available_at": "10000-01-28 23:59:59+00",
            "rows": [{"dated_at": "2026-01-02T00:00:00+00:00"}, {"at": "2026-01-02 10:00:00"}],
            "note": "10000-01-28",
            "deadline": 12,
            "fine": ["2026-01-02T00:00:00Z", "2026-01-02", "9999-12"],
            "done_at": None,
        },
    )
    assert [line.split(" = ")[0] for line in found] == [
        "x .available_at",
        "x .rows[0].dated_at",
        "x .rows[1].at",
        "x .note",
        "x .deadline",
    ]
