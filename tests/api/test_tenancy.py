"""Tenancy of processor accounts (CONTRACT section 6): a `stripe_account_id` used by a program of
another workspace is refused with 409 `stripe_account_in_use`; programs of one workspace may share
one; of two concurrent claims from different workspaces exactly one wins."""

from __future__ import annotations

import asyncio

import httpx
from starlette.testclient import TestClient

from tests.conftest import OP, World, bearer, make_world

ACCOUNT = "acct_1TenancyShared"


def in_use(r: httpx.Response) -> None:
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "stripe_account_in_use"


def patch(world: World, **settings: object) -> httpx.Response:
    return world.client.patch(f"/api/v1/programs/{world.program_id}", json=settings, headers=world.owner)


def account_of(world: World) -> object:
    r = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner)
    return r.json()["data"]["stripe_account_id"]


def test_another_workspace_cannot_take_a_connected_account(client: TestClient) -> None:
    a = make_world(client, stripe_account_id=ACCOUNT)
    b = make_world(client)
    refused = patch(b, stripe_account_id=ACCOUNT)
    in_use(refused)
    assert a.program_id not in refused.json()["error"]["message"]  # nothing of the other workspace
    assert account_of(b) is None
    body = {"workspace_id": b.workspace_id, "name": "B2", "stripe_account_id": ACCOUNT}
    in_use(client.post("/api/v1/programs", json=body, headers=b.owner))
    assert len(client.get("/api/v1/programs", headers=b.owner).json()["data"]) == 1
    assert account_of(a) == ACCOUNT


def test_programs_of_one_workspace_may_share_an_account(client: TestClient) -> None:
    a = make_world(client, stripe_account_id=ACCOUNT)
    body = {"workspace_id": a.workspace_id, "name": "A2", "stripe_account_id": ACCOUNT}
    r = client.post("/api/v1/programs", json=body, headers=a.owner)
    assert r.status_code == 201, r.text
    # and a program keeps its own account when other settings change
    assert patch(a, holding_days=10, stripe_account_id=ACCOUNT).status_code == 200
    assert patch(a, holding_days=11).status_code == 200


def test_an_account_released_by_its_workspace_may_be_taken(client: TestClient) -> None:
    a = make_world(client, stripe_account_id=ACCOUNT)
    b = make_world(client)
    in_use(patch(b, stripe_account_id=ACCOUNT))
    assert patch(a, stripe_account_id="acct_other").status_code == 200
    assert patch(b, stripe_account_id=ACCOUNT).status_code == 200


def test_the_agent_endpoint_refuses_it_too(client: TestClient) -> None:
    make_world(client, stripe_account_id=ACCOUNT)
    b = make_world(client)
    r = client.post(
        "/api/v1/operator/agent-keys",
        json={"name": "tool", "scopes": ["programs:write"], "workspace_ids": [b.workspace_id]},
        headers=OP,
    )
    agent = bearer(r.json()["data"]["agent_key"])
    r = client.patch(
        f"/api/agent/v1/programs/{b.program_id}", json={"stripe_account_id": ACCOUNT}, headers=agent
    )
    in_use(r)
    assert account_of(b) is None


def test_concurrent_claims_from_two_workspaces_let_exactly_one_win(client: TestClient) -> None:
    worlds = [make_world(client) for _ in range(6)]

    async def race(account: str) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await asyncio.gather(
                *(
                    http.patch(
                        f"/api/v1/programs/{w.program_id}",
                        json={"stripe_account_id": account},
                        headers=w.owner,
                    )
                    for w in worlds
                )
            )

    for round_ in range(5):
        account = f"acct_race_{round_}"
        responses = asyncio.run(race(account))
        assert sorted(r.status_code for r in responses) == [200] + [409] * 5
        owners = [w for w in worlds if account_of(w) == account]
        assert len(owners) == 1
        # the account is free again for the next round
        assert patch(owners[0], stripe_account_id=None).status_code == 200
