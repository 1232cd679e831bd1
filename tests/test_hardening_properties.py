"""Acceptance property of the hardening issue (CONTRACT sections 1, 4-7 and 9).

Batches of requests over every write endpoint carry boundary and out-of-range integers (0, -1,
2^31, 2^53+1, 2^63-1, 2^63, 2^64, 10^30), floats, strings of 0/255/256/10000 characters and edge
timestamps (years 0, 1, 1969, 9999, 10000, offsets of +-14:00, a leap second), each request
otherwise valid so that the hostile value is what is exercised. Whatever a batch holds:

- every answer is below 500, every 4xx is the JSON error envelope (with `fields` for
  `validation_error`), every answer carries `X-Request-Id`;
- values the contract bounds are refused with 422 `validation_error` (a webhook's are stored and
  refused with `error.stored`), and in-range requests get the status the contract pins;
- after the batch the server reconciles, both tenants read, and a restart on the same DuckDB file
  brings back every acknowledged write: sales (listed after reconcile), refunds (a repost is
  409 `duplicate_refund`), clicks (a sale naming one is attributed), webhook events (a
  redelivery is a duplicate), and a fresh sale with the tenant's current key is 200.

Failures are raised as an AssertionError subclass named for the endpoint or phase, so Hypothesis
reports each broken endpoint as its own bug with its own minimal batch.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx2
import openpyxl
import pytest
from hypothesis import HealthCheck, given, settings

from tests.conftest import OP
from tests.helpers import parse_finance_csv
from tests.hostile import BATCHES, HANDLERS, Act, Server, describe, running_server, settle
from tests.hypothesis_profiles import examples

# About 2 s an example on 2 cores (each batch reconciles, restarts and rechecks); a failing run
# spends a few minutes shrinking one bug to its smallest batch.
PROFILE = settings(
    max_examples=examples(3, ci=30),
    derandomize=True,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@pytest.mark.timeout(900)
@PROFILE
@given(batches=BATCHES)
def test_hostile_values_never_break_the_server(batches: list[list[Act]]) -> None:
    with running_server() as server:
        for batch in batches:
            for step in batch:
                HANDLERS[step.kind](server, server.tenants[step.tenant], step.args)
            settle(server)


# -- the reads the issue names, one by one, over sales dated at both ends of the range -----------
EDGE_AMOUNT = 10**12
EDGE_COMMISSION = 3 * 10**11  # the tenants' programs pay 30 %
# (path, params, answer): "200" is checked by `_read_back`; a field name is a 422
# `validation_error` naming that field.
HOSTILE_READS = (
    ("reports/finance", {"period": "9999-12"}, "200"),
    ("reports/finance", {"period": "9999-12", "format": "xlsx"}, "200"),
    ("reports/finance", {"period": "1970-01", "format": "csv"}, "200"),
    ("reports/finance", {"period": "0000-01"}, "period"),
    ("reports/finance", {"period": "1969-12"}, "period"),
    ("reports/finance", {"period": "10000-01"}, "period"),
    ("reports/double-counting", {"period": "9999-12"}, "200"),
    ("commissions", {"period": "9999-12"}, "200"),
    ("commissions", {"period": "0000-01"}, "period"),
    ("sales", {"from": "0001-01-01", "to": "9999-12-31"}, "from"),
    ("sales", {"from": "0000-01-01"}, "from"),
    ("sales", {"to": "10000-01-01"}, "to"),
    ("sales", {"from": "9999-12-31T23:59:59-01:00"}, "from"),
    ("sales", {"to": "0001-01-01T00:00:00+14:00"}, "to"),
)


@pytest.fixture(scope="module")
def dated_server() -> Iterator[Server]:
    """Tenant 0 with an attributed sale at each end of the time range, reconciled."""
    with running_server() as server:
        t = server.tenants[0]
        click = server.client.post(
            "/api/v1/track/click", json={"program_id": t.program_id, "partner_code": t.partner_code}
        )
        assert click.status_code == 201, click.text
        for n, when in enumerate(("1970-01-01T00:00:00Z", "9999-12-29T23:59:59Z")):
            body = {"transaction_id": f"edge{n}", "customer_external_id": "c", "amount": EDGE_AMOUNT}
            body |= {"occurred_at": when, "click_id": click.json()["data"]["click_id"]}
            r = server.client.post("/api/v1/track/sale", json=body, headers=t.key)
            assert r.status_code == 200 and r.json()["data"]["attributed"] is True, r.text
        r = server.client.post("/api/v1/operator/reconcile", headers=OP)
        assert r.status_code == 200 and r.json()["data"]["sales"] == 2, r.text
        yield server


def _read_back(program_id: str, path: str, params: dict[str, str], r: httpx2.Response) -> None:
    """The month's one edge sale (edge1 in 9999-12, edge0 in 1970-01), in the format asked for."""
    period = params["period"]
    fmt = params.get("format", "json")
    if path == "reports/finance" and fmt == "json":
        data = r.json()["data"]
        assert (data["period"], data["currencies"]) == (period, ["usd"])
        [usd] = data["summary"]
        assert (usd["sales_count"], usd["gross_sales"], usd["commissions"]) == (
            1,
            EDGE_AMOUNT,
            EDGE_COMMISSION,
        )
    elif path == "reports/finance" and fmt == "csv":
        parsed = parse_finance_csv(r.text)
        assert parsed["report"][0]["period"] == period
        [usd] = parsed["summary"]
        assert (usd["currency"], usd["sales_count"], usd["gross_sales"]) == ("usd", "1", str(EDGE_AMOUNT))
    elif path == "reports/finance":
        summary = openpyxl.load_workbook(io.BytesIO(r.content))["Summary"]
        assert (summary["B3"].value, summary["B7"].value) == (period, "USD")
    elif path == "reports/double-counting":
        empty = {"summary": [], "totals": [], "double_counts": []}
        assert r.json()["data"] == {"program_id": program_id, "period": period, **empty}
    else:
        [line] = r.json()["data"]
        assert (line["transaction_id"], line["amount"], line["period"]) == ("edge1", EDGE_COMMISSION, period)
        assert (line["dated_at"], line["available_at"]) == ("9999-12-29T23:59:59Z", "9999-12-30T23:59:59Z")


@pytest.mark.parametrize(("path", "params", "answer"), HOSTILE_READS)
def test_hostile_report_ranges_never_5xx(
    dated_server: Server, path: str, params: dict[str, str], answer: str
) -> None:
    t = dated_server.tenants[0]
    base = f"/api/v1/programs/{t.program_id}"
    r = dated_server.send(f"read_{path}", "GET", f"{base}/{path}", None, t.owner, params)
    if answer == "200":
        assert r.status_code == 200, describe(r)
        _read_back(t.program_id, path, params, r)
    else:
        assert r.status_code == 422, describe(r)
        error = r.json()["error"]
        assert error["code"] == "validation_error" and [f["field"] for f in error["fields"]] == [answer]
