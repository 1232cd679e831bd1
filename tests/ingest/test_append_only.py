"""Nothing in the raw log is ever updated or deleted."""

from __future__ import annotations

import itertools
import re

from tests.conftest import ROOT, World

PACKAGES = ("api", "ingest", "reconcile", "reports", "sdk")
FORBIDDEN = re.compile(
    r"(UPDATE\s+raw_events|DELETE\s+FROM\s+raw_events|TRUNCATE\s+(TABLE\s+)?raw_events"
    r'|DROP\s+TABLE[^;"\n]*raw_events|(CREATE\s+OR\s+REPLACE|ALTER)\s+TABLE\s+raw_events'
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
    # and the only code naming raw_events in an INSERT is the store's bulk append (dynamic
    # table names elsewhere, e.g. the reconciler's rc_* tables, are covered by the next test)
    inserts = [
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if re.search(r"INSERT\s+INTO\s+raw_events|\"raw_events\",\s*\"raw\"", p.read_text())
    ]
    assert inserts == ["ingest/duckdb_store.py"]


def test_the_pattern_catches_what_it_must() -> None:
    for sql in (
        "update raw_events set amount = 1",
        "DELETE FROM raw_events WHERE seq = 1",
        "create or replace table raw_events as select 1",
        "TRUNCATE raw_events",
    ):
        assert FORBIDDEN.search(sql), sql


def test_earlier_rows_never_change_as_traffic_flows(world: World) -> None:
    store = world.client.app.state.tally.store  # type: ignore[attr-defined]
    snapshots = []
    steps = [
        world.sale,
        world.sale,  # duplicate
        lambda: world.client.post(
            "/api/v1/track/refund",
            json={"transaction_id": "in_1", "refund_id": "r", "amount": 10},
            headers=world.key,
        ),
        lambda: world.client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=world.owner),
        lambda: world.client.post(
            "/api/v1/track/lead", json={"customer_external_id": "c"}, headers=world.key
        ),
    ]
    writer = world.client.app.state.tally.writer  # type: ignore[attr-defined]
    for step in steps:
        step()
        writer.sync_blocking()
        snapshots.append(store.query("SELECT * FROM raw_events ORDER BY seq"))
    for before, after in itertools.pairwise(snapshots):
        assert after[: len(before)] == before
    assert [r[0] for r in snapshots[-1]] == list(range(1, len(snapshots[-1]) + 1))
