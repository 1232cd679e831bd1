"""Credentials are stored hashed and secrets never written: after traffic, a reconcile and a
backfill, no issued credential, the operator token or a webhook signing secret appears anywhere
tally writes: the database's tables and file, the journal folder (while it still holds rows, and
after) and the reconciler's mirror."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from reconcile.run import mirror as mirror_module
from tests.conftest import OP, OPERATOR_TOKEN, WEBHOOK_SECRET, bearer, make_world
from tests.pg import pg_dump
from tests.stripe_fixtures import load_event, signed_delivery, with_metadata


def _files_under(*folders: Path) -> dict[Path, bytes]:
    return {
        p: p.read_bytes() for folder in folders if folder.exists() for p in folder.rglob("*") if p.is_file()
    }


def _assert_absent(values: list[str], blobs: dict[Path, bytes]) -> None:
    for path, blob in blobs.items():
        for value in values:
            assert value.encode() not in blob, f"{path} holds a secret"


def test_nothing_tally_writes_holds_a_plaintext_secret(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_module, "MIN_ROWS", 2)  # segments of a few rows: the mirror has files
    monkeypatch.setattr(mirror_module, "SEGMENT_ROWS", 3)
    issued = [OPERATOR_TOKEN, *settings.webhook_secrets()]
    assert WEBHOOK_SECRET in issued
    journal, mirror = Path(f"{settings.database}.journal"), Path(f"{settings.database}.mirror")
    with TestClient(create_app(settings)) as client:
        world = make_world(client, stripe_account_id="acct_secret_test")
        issued += [world.api_key, world.account_token]
        r = client.post(
            f"/api/v1/workspaces/{world.workspace_id}/members",
            json={"email": "m@x.test", "role": "member"},
            headers=world.owner,
        )
        issued.append(r.json()["data"]["token"])
        r = client.post(
            "/api/v1/operator/agent-keys",
            json={"name": "t", "scopes": ["programs:read"], "workspace_ids": [world.workspace_id]},
            headers=OP,
        )
        issued.append(r.json()["data"]["agent_key"])
        legacy = "legacyKEYvalue0123456789"
        client.post(
            f"/api/v1/operator/programs/{world.program_id}/legacy-key", json={"api_key": legacy}, headers=OP
        )
        issued.append(legacy)
        r = client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=world.owner)
        issued.append(r.json()["data"]["api_key"])
        client.post(
            "/api/v1/track/sale",
            json={"transaction_id": "t", "customer_external_id": "c", "amount": 1},
            headers=bearer(issued[-1]),
        )
        client.post(
            "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=bearer(world.api_key)
        )  # a refused, replaced key
        event = with_metadata(
            load_event("stripe-ruby-mock__invoice.payment_succeeded.json", account="acct_secret_test"),
            {"svc_customer_key": "c", "program_id": world.program_id},
            where="legacy",
        )
        for secret in settings.webhook_secrets():
            body, header = signed_delivery({**event, "id": f"evt_{len(secret)}"}, secret, int(time.time()))
            r = client.post("/webhooks/stripe", content=body, headers={"Stripe-Signature": header})
            assert r.status_code == 200, r.text
        in_journal = _files_under(journal)  # the copier has not moved these rows yet
        assert in_journal or settings.database.startswith("postgresql://")  # no journal there
        assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        fix = {"fixes": [{"transaction_id": "t", "svc_customer_key": "c"}]}
        r = client.post(f"/api/v1/programs/{world.program_id}/metadata-fixes", json=fix, headers=world.owner)
        assert r.status_code in (200, 201), r.text
        span = {"from": "2020-01-01", "to": "2099-12-31", "dry_run": False}
        r = client.post(f"/api/v1/programs/{world.program_id}/backfill", json=span, headers=world.owner)
        assert r.status_code == 200, r.text
        in_journal.update(_files_under(journal))
    if settings.database.startswith("postgresql://"):
        _assert_absent(issued, in_journal)
        _assert_absent(issued, _files_under(Path(settings.engine_dir)))  # the reconciler's working copy
        _assert_absent(issued, {Path("pg_dump"): pg_dump(settings.database)})
        return
    _assert_absent(issued, in_journal)
    assert _files_under(mirror)
    _assert_absent(issued, _files_under(journal, mirror))
    # every table, every column, as text
    con = duckdb.connect(settings.database, read_only=True)
    tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
    assert {"raw_events", "credentials", "tracking_log"} <= set(tables)
    for table in tables:
        text = str(con.execute(f"SELECT * FROM {table}").fetchall())
        for value in issued:
            assert value not in text, f"{table} holds a credential"
    con.close()
    # and the raw bytes of the file (WAL checkpointed on close)
    blob = Path(settings.database).read_bytes()
    for value in issued:
        assert value.encode() not in blob
