"""Nothing in the raw log is ever updated or deleted."""

from __future__ import annotations

import hashlib
import re
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import httpx
import psycopg
import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from ingest.domain.clock import utcnow
from tests.conftest import OP, ROOT, make_world, start_server
from tests.helpers import deliver, renewal_event, sql_rows

ACCOUNT = "acct_append_only"

PACKAGES = ("api", "ingest", "reconcile", "reports", "sdk")
FORBIDDEN = re.compile(
    r"(UPDATE\s+raw_events|DELETE\s+FROM\s+raw_events|TRUNCATE\s+(TABLE\s+)?raw_events"
    r'|DROP\s+TABLE[^;"\n]*raw_events|CREATE\s+OR\s+REPLACE\s+TABLE\s+raw_events'
    # a column added, NULL on every row there is (no default), changes no row; any other ALTER may
    r"""|ALTER\s+TABLE\s+raw_events(?!\s+ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS\s+\w+\s+VARCHAR["'])"""
    r'|INSERT\s+OR\s+REPLACE\s+INTO\s+raw_events|INTO\s+raw_events[^;"\n]*ON\s+CONFLICT)',
    re.IGNORECASE,
)


def test_no_code_path_updates_or_deletes_raw_rows() -> None:
    offenders = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in FORBIDDEN.finditer(text)]
    assert offenders == []
    # and the only code naming raw_events in an INSERT or a COPY is the stores' bulk append
    # (embedded, PostgreSQL) and the reconciler's working copy of a shared log, which is a
    # derived copy, not the log (dynamic table names elsewhere, e.g. the reconciler's rc_*
    # tables, are covered by the next test)
    inserts = sorted(
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if re.search(r"(INSERT\s+INTO|COPY)\s+raw_events|\"raw_events\",\s*\"raw\"", p.read_text())
    )
    assert inserts == [
        "ingest/storage/duckdb/copier.py",
        "ingest/storage/postgres/copy.py",
        "ingest/storage/postgres/tx.py",
    ]


def test_the_pattern_catches_what_it_must() -> None:
    for sql in (
        "update raw_events set amount = 1",
        "DELETE FROM raw_events WHERE seq = 1",
        "create or replace table raw_events as select 1",
        "TRUNCATE raw_events",
        'con.execute("ALTER TABLE raw_events DROP COLUMN amount")',
        '"ALTER TABLE raw_events ALTER COLUMN amount TYPE VARCHAR"',
        "\"ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS x VARCHAR DEFAULT 'a'\"",
    ):
        assert FORBIDDEN.search(sql), sql
    # a column added empty (migration 8's promo_code) changes no row
    assert not FORBIDDEN.search(
        'con.execute("ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS promo_code VARCHAR")'
    )


def _canonical(value: object) -> object:
    # a connection's time zone changes only how an instant is shown, never the stored value
    return value.astimezone(UTC).isoformat() if isinstance(value, datetime) else value


def _snapshot(rows: list[tuple[object, ...]]) -> list[tuple[object, str]]:
    """(seq, hash of the whole row) for every raw row, in sequence order."""
    return [(row[0], hashlib.sha256(repr([_canonical(v) for v in row]).encode()).hexdigest()) for row in rows]


class Watch:
    """Snapshots the raw log after each step; every earlier row must stay byte-identical."""

    def __init__(self) -> None:
        self.snapshots: list[tuple[str, list[tuple[object, str]]]] = []

    def take(self, step: str, rows: list[tuple[object, ...]]) -> None:
        snapshot = _snapshot(rows)
        if self.snapshots:
            before_step, before = self.snapshots[-1]
            assert snapshot[: len(before)] == before, f"{step} changed rows written before it ({before_step})"
        self.snapshots.append((step, snapshot))

    def of_app(self, step: str, client: TestClient) -> None:
        state = client.app.state.tally  # type: ignore[attr-defined]
        state.writer.sync_blocking()
        self.take(step, sql_rows(state.store, "SELECT * FROM raw_events ORDER BY seq"))

    def of_file(self, step: str, database: str) -> None:
        """The raw log read straight from the database, no tally open on it."""
        if database.startswith("postgresql://"):
            with psycopg.connect(database, options="-c TimeZone=UTC") as pg:
                self.take(step, pg.execute(b"SELECT * FROM raw_events ORDER BY seq").fetchall())
            return
        with duckdb.connect(database, read_only=True) as con:
            self.take(step, con.execute("SELECT * FROM raw_events ORDER BY seq").fetchall())


def _webhook(client: TestClient, event_id: str, invoice: str) -> None:
    metadata = {"metadata": {"svc_customer_key": "cust_1"}}
    r = deliver(client, renewal_event(event_id, invoice, ACCOUNT, subscription_details=metadata))
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_earlier_rows_stay_identical_through_every_operation(settings: Settings) -> None:
    """Track calls, webhooks, reconcile (full and incremental), metadata fix, backfill dry run
    and apply, period close, restart and journal recovery after a SIGKILL: none of them
    touches a row written before it."""
    watch = Watch()
    last_month = (utcnow().replace(day=1) - timedelta(days=1)).strftime("%Y-%m")
    with TestClient(create_app(settings)) as client:
        world = make_world(client, stripe_account_id=ACCOUNT)
        pid, c = world.program_id, client

        def post(path: str, body: dict[str, Any] | None = None, headers: dict[str, str] = OP) -> Any:
            return lambda: c.post(path, json=body, headers=headers)

        prog = f"/api/v1/programs/{pid}"
        refund = {"transaction_id": "in_1", "refund_id": "r1", "amount": 10}
        fixes = {"fixes": [{"transaction_id": "in_2", "svc_customer_key": "cust_1"}]}
        span = {"from": "2020-01-01", "to": "2099-12-31"}
        steps: list[tuple[str, Callable[[], object]]] = [
            ("click", post("/api/v1/track/click", {"program_id": pid, "partner_code": "alice"}, {})),
            ("lead", post("/api/v1/track/lead", {"customer_external_id": "cust_1"}, world.key)),
            ("sale", world.sale),
            ("duplicate sale", world.sale),
            ("test sale", lambda: world.sale(additional_data={"test_mode": True})),
            ("refund", post("/api/v1/track/refund", refund, world.key)),
            ("duplicate refund", post("/api/v1/track/refund", refund, world.key)),
            ("webhook", lambda: _webhook(c, "evt_1", "in_hook_1")),
            ("repeated webhook", lambda: _webhook(c, "evt_1", "in_hook_1")),
            ("full reconcile", post("/api/v1/operator/reconcile")),
            ("sale 2", lambda: world.sale(transaction_id="in_2")),
            ("incremental reconcile", post("/api/v1/operator/reconcile")),
            ("metadata fix", post(f"{prog}/metadata-fixes", fixes, world.owner)),
            ("backfill dry run", post(f"{prog}/backfill", {**span, "dry_run": True}, world.owner)),
            ("backfill apply", post(f"{prog}/backfill", {**span, "dry_run": False}, world.owner)),
            ("period close", post(f"{prog}/periods/{last_month}/close", None, world.owner)),
            ("settings change", lambda: c.patch(prog, json={"commission_bps": 2500}, headers=world.owner)),
            ("full reconcile again", post("/api/v1/operator/reconcile")),
        ]
        for name, step in steps:
            response = step()
            if isinstance(response, httpx.Response):
                assert response.status_code < 500, (name, response.text)
            watch.of_app(name, client)
        modes = {r[0] for r in sql_rows(client.app.state.tally.store, "SELECT mode FROM rc_runs")}  # type: ignore[attr-defined]
        assert modes == {"full", "incremental"}
    watch.of_file("restart (closed)", settings.database)
    with TestClient(create_app(settings)) as client:
        watch.of_app("restart (opened)", client)

    # journal recovery: a real server, killed while rows are still only in its journal
    server = start_server(settings.database)
    with httpx.Client(base_url=server.url, timeout=10, headers=world.key) as hc:
        for n in range(50):
            body = {"transaction_id": f"in_k{n}", "customer_external_id": "c", "amount": 100}
            assert hc.post("/api/v1/track/sale", json=body).status_code == 200
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    server.stop()
    with TestClient(create_app(settings)) as client:
        watch.of_app("journal recovery", client)
    assert len(watch.snapshots[-1][1]) > len(watch.snapshots[-3][1])
    assert [seq for seq, _ in watch.snapshots[-1][1]] == list(range(1, len(watch.snapshots[-1][1]) + 1))
