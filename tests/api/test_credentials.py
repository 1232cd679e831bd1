"""Credential kinds (CONTRACT sections 2, 8, 9; SEED section 5): each endpoint family refuses the
wrong kind with a code naming the cause."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from tests.conftest import OP, OPERATOR_TOKEN, World, bearer


def _agent(client: TestClient, world: World, scopes: list[str], workspaces: list[str] | None = None) -> str:
    r = client.post(
        "/api/v1/operator/agent-keys",
        json={"name": "tool", "scopes": scopes, "workspace_ids": workspaces or [world.workspace_id]},
        headers=OP,
    )
    assert r.status_code == 201, r.text
    key = str(r.json()["data"]["agent_key"])
    assert key.startswith("agt_")
    return key


SALE = {"additional_data": {"test_mode": True}}


def _code(r: object) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]  # type: ignore[attr-defined]


def test_missing_and_malformed_authorization(world: World) -> None:
    c = world.client
    assert _code(c.post("/api/v1/track/sale", json=SALE)) == (401, "missing_credentials")
    for header in ("Basic abc", "Bearer", "Bearer ", "bearer a b", world.api_key, "Token " + world.api_key):
        r = c.post("/api/v1/track/sale", json=SALE, headers={"Authorization": header})
        assert _code(r) == (401, "malformed_authorization"), header
    assert _code(c.get("/api/v1/programs")) == (401, "missing_credentials")
    assert _code(c.get("/api/agent/v1/programs")) == (401, "missing_credentials")
    assert _code(c.post("/api/v1/operator/accounts", json={})) == (401, "missing_credentials")


def test_unknown_key_on_track_is_invalid_api_key(world: World) -> None:
    """An unknown key is answered as unknown, never as the program's key: even while that key is
    flagged and past its rotation deadline, and even when it differs from it by one character,
    the refusal carries no rotation code, deadline or headers."""
    r = world.client.post(
        f"/api/v1/operator/programs/{world.program_id}/api-key/rotation",
        json={"deadline": "2020-01-01T00:00:00Z"},
        headers=OP,
    )
    assert r.status_code == 200, r.text
    flagged = world.client.post("/api/v1/track/sale", json=SALE, headers=world.key)
    assert _code(flagged) == (401, "api_key_rotation_required")  # the program's own key is refused so
    assert {"deprecation", "sunset"} <= set(flagged.headers)
    near = world.api_key[:-1] + ("y" if world.api_key.endswith("x") else "x")
    for token in ("aff_" + "x" * 40, "not-a-key-at-all", near):
        r = world.client.post("/api/v1/track/sale", json=SALE, headers=bearer(token))
        assert _code(r) == (401, "invalid_api_key"), token
        assert "deadline" not in r.json()["error"] and "warnings" not in r.json()
        assert not {"deprecation", "sunset"} & set(r.headers), token


def test_wrong_kinds_on_track_endpoints(client: TestClient, world: World) -> None:
    agent = _agent(client, world, ["programs:read"])
    for token in (agent, world.account_token, OPERATOR_TOKEN):
        for path in ("/api/v1/track/sale", "/api/v1/track/refund", "/api/v1/track/lead"):
            r = client.post(path, json=SALE, headers=bearer(token))
            assert _code(r) == (401, "program_key_required"), (token[:5], path)


def test_wrong_kinds_on_account_endpoints(client: TestClient, world: World) -> None:
    agent = _agent(client, world, ["programs:read"])
    for token in (world.api_key, agent, OPERATOR_TOKEN, "acct_unknown"):
        r = client.get("/api/v1/programs", headers=bearer(token))
        assert _code(r) == (401, "account_token_required"), token[:5]
        r = client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=bearer(token))
        assert _code(r) == (401, "account_token_required")


def test_wrong_kinds_on_operator_endpoints(client: TestClient, world: World) -> None:
    agent = _agent(client, world, ["programs:read"])
    for token in (world.api_key, agent, world.account_token, OPERATOR_TOKEN + "x"):
        r = client.post(
            "/api/v1/operator/accounts", json={"email": "a@b.c", "workspace_name": "x"}, headers=bearer(token)
        )
        assert _code(r) == (401, "operator_token_required")


def test_agent_endpoints_need_agent_key_with_scope(client: TestClient, world: World) -> None:
    for token in (world.api_key, world.account_token, OPERATOR_TOKEN, "agt_unknown"):
        r = client.get("/api/agent/v1/programs", headers=bearer(token))
        assert _code(r) == (401, "agent_key_required"), token[:5]
    reader = _agent(client, world, ["programs:read"])
    r = client.get("/api/agent/v1/programs", headers=bearer(reader))
    assert r.status_code == 200
    assert [p["program_id"] for p in r.json()["data"]] == [world.program_id]
    assert world.api_key not in r.text
    r = client.get(f"/api/agent/v1/programs/{world.program_id}", headers=bearer(reader))
    assert r.json()["data"]["api_token_masked"].startswith("aff_")
    r = client.patch(
        f"/api/agent/v1/programs/{world.program_id}", json={"holding_days": 7}, headers=bearer(reader)
    )
    assert _code(r) == (403, "insufficient_scope")
    assert "programs:write" in r.json()["error"]["message"]
    writer = _agent(client, world, ["programs:read", "programs:write"])
    r = client.patch(
        f"/api/agent/v1/programs/{world.program_id}", json={"holding_days": 7}, headers=bearer(writer)
    )
    assert r.status_code == 200 and r.json()["data"]["holding_days"] == 7
    only_write = _agent(client, world, ["programs:write"])
    r = client.get("/api/agent/v1/programs", headers=bearer(only_write))
    assert _code(r) == (403, "insufficient_scope")


def test_agent_key_limited_to_granted_workspaces(client: TestClient, world: World) -> None:
    from tests.conftest import make_world

    other = make_world(client)
    agent = _agent(client, world, ["programs:read", "programs:write"])
    r = client.get(f"/api/agent/v1/programs/{other.program_id}", headers=bearer(agent))
    assert _code(r) == (404, "program_not_found")
    r = client.patch(
        f"/api/agent/v1/programs/{other.program_id}", json={"holding_days": 1}, headers=bearer(agent)
    )
    assert _code(r) == (404, "program_not_found")
    r = client.post(
        "/api/v1/operator/agent-keys",
        json={"name": "x", "scopes": ["programs:read"], "workspace_ids": ["ws_nope"]},
        headers=OP,
    )
    assert r.status_code == 422


@pytest.mark.parametrize("token_kind", ["api_key", "account_token"])
def test_credentials_are_never_echoed(world: World, token_kind: str) -> None:
    token = getattr(world, token_kind)
    for path in (
        "/api/v1/programs",
        f"/api/v1/programs/{world.program_id}",
        f"/api/v1/programs/{world.program_id}/partners",
    ):
        assert token not in world.client.get(path, headers=world.owner).text
