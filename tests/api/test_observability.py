"""Logs and metrics through the real app (docs/observability.md): one access line per request on
both lanes, errors and reconcile runs logged with their ids, GET /metrics's values after real
traffic, its auth rule and content type."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from importlib import metadata
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from api import observability
from api.app import create_app
from api.settings import Settings
from ingest import writer as writer_module
from ingest.storage.duckdb.journal import Journal
from ingest.storage.duckdb.store import DuckStore
from ingest.stripe import sign
from reconcile.run import rowstore
from tests.conftest import OP, ROOT, WEBHOOK_SECRET, World, bearer
from tests.helpers import journal_record, sale_row


async def boom(request: Request) -> Response:
    raise RuntimeError("boom: a bug on a non-hot route")


class Logs:
    """Everything the app logs while a test runs, as tally serve writes it (one line a record)."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()

    def text(self) -> str:
        observability.stop_logging()  # flushes the listener thread
        return self.buffer.getvalue()

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text().splitlines()]


@pytest.fixture
def json_logs(settings: Settings) -> Iterator[Logs]:
    logs = Logs()
    observability.configure_logging(settings.model_copy(update={"log_format": "json"}), logs.buffer)
    yield logs
    observability.stop_logging()


def scrape(
    client: TestClient, headers: dict[str, str] | None = None
) -> dict[tuple[str, tuple[Any, ...]], float]:
    """GET /metrics, parsed with prometheus_client's own parser: {(sample, labels): value}."""
    r = client.get("/metrics", headers=OP if headers is None else headers)
    assert r.status_code == 200, r.text
    samples: dict[tuple[str, tuple[Any, ...]], float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[tuple[str, tuple[Any, ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def webhook(client: TestClient, event_id: str, secret: str = WEBHOOK_SECRET) -> int:
    body = orjson.dumps({"id": event_id, "object": "event", "type": "customer.created", "data": {}})
    headers = {"Content-Type": "application/json", "Stripe-Signature": sign(body, secret, int(time.time()))}
    return client.post("/webhooks/stripe", content=body, headers=headers).status_code


# -- access lines ----------------------------------------------------------------------------------
def test_both_lanes_write_one_access_line_per_request_with_the_route_template(
    world: World, json_logs: Logs
) -> None:
    client = world.client
    fast = world.sale(transaction_id="in_fast")
    saved, client.app.hot = client.app.hot, {}  # type: ignore[attr-defined]
    try:
        full = world.sale(transaction_id="in_full")
    finally:
        client.app.hot = saved  # type: ignore[attr-defined]
    read = client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner)
    missing = client.get("/no/such/path", headers={"X-Request-Id": "client-chosen-1"})
    assert (fast.status_code, full.status_code, read.status_code, missing.status_code) == (200, 200, 200, 404)

    access = [r for r in json_logs.records() if r["logger"] == "tally.access"]
    by_id = {r["request_id"]: r for r in access}
    assert len(by_id) == len(access)  # one line per request
    for response, route in (
        (fast, "/api/v1/track/sale"),
        (full, "/api/v1/track/sale"),
        (read, "/api/v1/programs/{program_id}"),
        (missing, "unmatched"),
    ):
        line = by_id[response.headers["x-request-id"]]
        assert line["route"] == route and line["status"] == response.status_code
        assert line["method"] in {"GET", "POST"} and line["duration_ms"] >= 0
        assert line["level"] == "INFO"
    assert by_id["client-chosen-1"]["status"] == 404
    fast_line, full_line = by_id[fast.headers["x-request-id"]], by_id[full.headers["x-request-id"]]
    assert fast_line.keys() == full_line.keys()  # the lanes log alike
    assert all(world.program_id not in json.dumps(line) for line in access)  # templates, not paths


def test_text_format_and_level(settings: Settings) -> None:
    buffer = io.StringIO()
    observability.configure_logging(settings, buffer)  # text, INFO: the defaults
    try:
        with TestClient(create_app(settings)) as client:
            r = client.get("/healthz")
        observability.stop_logging()
        line = next(x for x in buffer.getvalue().splitlines() if " tally.access " in x)
        assert line.split(" ", 3)[1:3] == ["INFO", "tally.access"]
        assert "GET /healthz 200 " in line and line.endswith(f"request_id={r.headers['x-request-id']}")

        quiet = io.StringIO()
        observability.configure_logging(settings.model_copy(update={"log_level": "WARNING"}), quiet)
        with TestClient(create_app(settings)) as client:
            client.get("/healthz")
        observability.stop_logging()
        assert "tally.access" not in quiet.getvalue()
    finally:
        observability.stop_logging()


def test_an_unexpected_error_is_logged_with_its_request_id(settings: Settings, json_logs: Logs) -> None:
    app = create_app(settings)
    app.router.routes.append(Route("/test/boom", boom, methods=["GET"]))
    with TestClient(app) as client:
        r = client.get("/test/boom")
    assert r.status_code == 500
    rid = r.headers["x-request-id"]
    records = json_logs.records()
    error = next(x for x in records if x["level"] == "ERROR")
    assert error["request_id"] == rid and "RuntimeError: boom" in error["exception"]
    access = next(x for x in records if x["logger"] == "tally.access")
    assert (access["request_id"], access["status"], access["route"]) == (rid, 500, "/test/boom")


def test_a_reconcile_run_is_logged_with_its_id_mode_and_rows(world: World, json_logs: Logs) -> None:
    assert world.sale().status_code == 200
    r = world.client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text
    run = next(x for x in json_logs.records() if x["logger"] == "tally.reconcile")
    assert run["run_id"] == r.json()["data"]["run_id"] and run["mode"] in {"full", "incremental"}
    assert run["events_read"] >= 1 and run["sales"] == 1 and run["duration_ms"] >= 0


# -- metrics ---------------------------------------------------------------------------------------
def test_metrics_move_with_real_traffic(world: World, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "COPY_EVERY_SECONDS", 3600.0)  # journaled rows wait for a flush
    client = world.client
    before = scrape(client)
    assert value(before, "tally_journal_backlog_rows") == 0
    for n in range(3):
        assert world.sale(transaction_id=f"in_m{n}").status_code == 200
    assert world.sale(transaction_id="in_m0").status_code == 409  # a duplicate, stored as such
    bad = client.post("/api/v1/track/sale", json={"transaction_id": "x", "amount": 1}, headers=bearer("nope"))
    assert bad.status_code == 401
    assert webhook(client, "evt_nobody_1") == 200  # no program: unroutable
    client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner)

    mid = scrape(client)
    sale = {"method": "POST", "route": "/api/v1/track/sale"}
    assert value(mid, "tally_http_requests_total", status="200", **sale) == 3
    assert value(mid, "tally_http_requests_total", status="409", **sale) == 1
    assert value(mid, "tally_http_requests_total", status="401", **sale) == 1
    assert value(mid, "tally_http_request_duration_seconds_count", **sale) == 5
    assert value(mid, "tally_http_request_duration_seconds_bucket", le="+Inf", **sale) == 5
    read = {"method": "GET", "route": "/api/v1/programs/{program_id}", "status": "200"}
    assert value(mid, "tally_http_requests_total", **read) == 1
    assert not any(world.program_id in str(labels) for _, labels in mid)
    assert value(mid, "tally_events_ingested_total", kind="sale", outcome="accepted") == 3
    assert value(mid, "tally_events_ingested_total", kind="sale", outcome="duplicate") == 1
    assert value(mid, "tally_events_ingested_total", kind="stripe", outcome="unroutable") == 1
    commits = value(mid, "tally_group_commit_operations_count") - value(
        before, "tally_group_commit_operations_count"
    )
    assert commits >= 5  # 4 sales and the webhook, each its own group here (one at a time)
    assert value(mid, "tally_group_commit_wait_seconds_count") == value(
        mid, "tally_group_commit_operations_count"
    )
    if backend == "duckdb":  # journaled, not yet copied into the database (PostgreSQL has no journal)
        assert (
            value(mid, "tally_journal_backlog_rows") > 0 and value(mid, "tally_journal_backlog_batches") >= 5
        )
        assert value(mid, "tally_journal_backlog_age_seconds") > 0

    r = client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text
    after = scrape(client)
    mode = r.json()["data"]["mode"]
    assert value(after, "tally_reconcile_duration_seconds_count", mode=mode) == 1
    assert value(after, "tally_reconcile_last_mode", mode=mode) == 1
    assert value(after, "tally_reconcile_last_success_timestamp_seconds") > value(
        before, "tally_reconcile_last_success_timestamp_seconds"
    )
    assert value(after, "tally_reconcile_last_rows", kind="sales") == 3
    assert value(after, "tally_unroutable_events") == 1
    assert (
        value(after, "tally_journal_backlog_rows") == 0 and value(after, "tally_journal_backlog_batches") == 0
    )
    assert value(after, "tally_reconcile_failures_total") == 0


@pytest.mark.embedded
def test_set_aside_batches_are_counted(settings: Settings) -> None:
    DuckStore(settings.database).close()
    journal = Journal(Path(f"{settings.database}.journal"))
    journal.append(journal_record(1, [sale_row(1)]))
    journal.append(journal_record(2, [sale_row(2, amount="not a number")]))  # what DuckDB refuses
    journal.close()
    with TestClient(create_app(settings)) as client:
        assert value(scrape(client), "tally_journal_set_aside_batches_total") == 1


def test_metrics_need_the_operator_token_unless_public(
    world: World, settings: Settings, tmp_path: Path
) -> None:
    client = world.client
    r = client.get("/metrics")
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_credentials"
    for headers in (world.owner, world.key, bearer("x" * 32)):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "operator_token_required", headers
    r = client.get("/metrics", headers=OP)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE tally_http_requests_total counter" in r.text

    public = {"metrics_public": True, "database": str(tmp_path / "public.duckdb")}  # one server per file
    with TestClient(create_app(settings.model_copy(update=public))) as open_client:
        r = open_client.get("/metrics")
        assert r.status_code == 200 and "tally_http_requests_total" in r.text


def test_each_app_has_its_own_registry(settings: Settings, tmp_path: Path) -> None:
    other = settings.model_copy(update={"database": str(tmp_path / "other.duckdb")})
    with TestClient(create_app(settings)) as a, TestClient(create_app(other)) as b:
        a.get("/healthz")
        a.get("/healthz")
        b.get("/healthz")
        health = {"method": "GET", "route": "/healthz", "status": "200"}
        assert value(scrape(a), "tally_http_requests_total", **health) == 2
        assert value(scrape(b), "tally_http_requests_total", **health) == 1


def test_process_metrics_and_build_info_and_no_created_series(client: TestClient, backend: str) -> None:
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200  # histograms move
    text = client.get("/metrics", headers=OP).text
    samples = scrape(client)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        assert value(samples, name) > 0, name
    assert value(samples, "process_start_time_seconds") > time.time() - 3600
    build = [dict(labels) for name, labels in samples if name == "tally_build_info"]
    assert len(build) == 1 and value(samples, "tally_build_info", **build[0]) == 1
    assert build[0]["backend"] == backend
    assert build[0]["version"] == metadata.version("tally")
    if backend == "duckdb":
        assert build[0]["engine_version"] == duckdb.__version__
    else:
        assert int(build[0]["engine_version"].split(".")[0]) >= 13  # the PostgreSQL server's
    assert "_created" not in text  # prometheus_client's per-series start times are off
    assert value(samples, "tally_reconcile_duration_seconds_count", mode="full") == 1


def test_every_metric_served_is_documented(client: TestClient) -> None:
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    docs = (ROOT / "docs" / "observability.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", docs, re.MULTILINE))
    served = set()
    for family in text_string_to_metric_families(client.get("/metrics", headers=OP).text):
        served.add(family.name + ("_total" if family.type == "counter" else ""))
    assert served <= documented, sorted(served - documented)


def test_a_row_store_altered_into_valid_rows_is_counted_and_changes_no_figure(
    world: World, settings: Settings, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48, item 3: the sale's amount changed in the row store beside the database (its
    checksum left as it was): reconcile answers 200, the sale keeps its amount, the file is
    counted in tally_derived_file_rejected_total."""
    monkeypatch.setattr(rowstore, "SHARE", 1)  # the store serves every closure of this small log
    assert world.sale(transaction_id="in_r1", amount=1000).status_code == 200
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    database = settings.database if backend == "duckdb" else f"{settings.engine_dir}/reconcile.duckdb"
    with closing(sqlite3.connect(f"{database}{rowstore.SUFFIX}")) as lite, lite:
        amount = rowstore.KEYS["amount"]
        for seq, data in lite.execute("SELECT seq, data FROM rows").fetchall():
            row = json.loads(data)
            if amount in row:
                lite.execute(
                    "UPDATE rows SET data = ? WHERE seq = ?", [json.dumps({**row, amount: 999_000}), seq]
                )
    before = value(scrape(world.client), "tally_derived_file_rejected_total", file="rows")
    assert world.sale(transaction_id="in_r2", amount=500).status_code == 200  # the same customer
    r = world.client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["mode"] == "incremental"
    rows = world.client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner).json()["data"]
    assert sorted((row["transaction_id"], row["amount"]) for row in rows) == [("in_r1", 1000), ("in_r2", 500)]
    assert value(scrape(world.client), "tally_derived_file_rejected_total", file="rows") == before + 1
