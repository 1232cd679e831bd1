"""Credentials are stored hashed: after a run, no issued value appears anywhere in the database."""

from __future__ import annotations

from pathlib import Path

import duckdb
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.conftest import OP, OPERATOR_TOKEN, bearer, make_world


def test_database_holds_no_plaintext_credential(settings: Settings) -> None:
    issued = [OPERATOR_TOKEN]
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
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
