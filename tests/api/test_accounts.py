"""Accounts, workspaces and programs (CONTRACT section 6)."""

from __future__ import annotations

from starlette.testclient import TestClient

from tests.conftest import World, make_world


def test_program_settings_defaults_and_patch(world: World) -> None:
    data = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert {
        k: data[k]
        for k in (
            "commission_type",
            "commission_bps",
            "recurring_months",
            "holding_days",
            "requires_server_side_leads",
            "stripe_account_id",
        )
    } == {
        "commission_type": "percent",
        "commission_bps": 3000,
        "recurring_months": None,
        "holding_days": 30,
        "requires_server_side_leads": False,
        "stripe_account_id": None,
    }
    r = world.client.patch(
        f"/api/v1/programs/{world.program_id}",
        json={
            "commission_type": "flat",
            "commission_flat": 500,
            "recurring_months": 12,
            "stripe_account_id": "acct_1",
            "name": "Renamed",
        },
        headers=world.owner,
    )
    assert r.status_code == 200
    data = r.json()["data"]
    assert (data["commission_type"], data["commission_flat"], data["recurring_months"], data["name"]) == (
        "flat",
        500,
        12,
        "Renamed",
    )
    assert data["commission_bps"] == 3000  # untouched
    r = world.client.patch(
        f"/api/v1/programs/{world.program_id}", json={"commission_bps": 10001}, headers=world.owner
    )
    assert r.status_code == 422
    r = world.client.patch(
        f"/api/v1/programs/{world.program_id}", json={"commission_bps": None}, headers=world.owner
    )
    assert r.status_code == 422
    r = world.client.patch(f"/api/v1/programs/{world.program_id}", json={"color": "red"}, headers=world.owner)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == "color"


def test_member_reads_but_cannot_change(world: World) -> None:
    member = world.member()
    c = world.client
    assert c.get(f"/api/v1/programs/{world.program_id}", headers=member).status_code == 200
    assert c.get("/api/v1/programs", headers=member).json()["data"][0]["program_id"] == world.program_id
    assert c.get(f"/api/v1/programs/{world.program_id}/partners", headers=member).status_code == 200
    for method, path, body in (
        ("PATCH", f"/api/v1/programs/{world.program_id}", {"holding_days": 1}),
        ("POST", f"/api/v1/programs/{world.program_id}/partners", {"code": "m", "name": "M"}),
        ("POST", "/api/v1/programs", {"workspace_id": world.workspace_id, "name": "x"}),
        ("POST", f"/api/v1/workspaces/{world.workspace_id}/members", {"email": "x@y.z", "role": "owner"}),
    ):
        r = c.request(method, path, json=body, headers=member)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required"), path


def test_other_workspace_program_is_not_found(client: TestClient, world: World) -> None:
    other = make_world(client)
    for method, path in (
        ("GET", f"/api/v1/programs/{other.program_id}"),
        ("PATCH", f"/api/v1/programs/{other.program_id}"),
        ("POST", f"/api/v1/programs/{other.program_id}/api-key"),
        ("GET", f"/api/v1/programs/{other.program_id}/partners"),
    ):
        r = client.request(method, path, json={}, headers=world.owner)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found"), path
    assert [p["program_id"] for p in client.get("/api/v1/programs", headers=world.owner).json()["data"]] == [
        world.program_id
    ]


def test_partners(world: World) -> None:
    c = world.client
    r = c.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "alice", "name": "Again"},
        headers=world.owner,
    )
    assert r.status_code == 409
    r = c.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "bad code!", "name": "x"},
        headers=world.owner,
    )
    assert r.status_code == 422
    listed = c.get(f"/api/v1/programs/{world.program_id}/partners", headers=world.owner).json()["data"]
    assert [(p["code"], p["email"]) for p in listed] == [("alice", "alice@partner.test")]


def test_operator_account_creation_validates(client: TestClient) -> None:
    from tests.conftest import OP

    r = client.post("/api/v1/operator/accounts", json={"email": "nope"}, headers=OP)
    assert r.status_code == 422
    fields = {f["field"] for f in r.json()["error"]["fields"]}
    assert fields == {"email", "workspace_name"}
