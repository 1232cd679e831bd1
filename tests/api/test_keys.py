"""Program API key lifecycle: SEED 2.1 and 3.1, CONTRACT section 3 (checklist items 1-3)."""

from __future__ import annotations

from datetime import UTC, datetime

import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, OPERATOR_TOKEN, World, bearer


def test_create_program_never_returns_key_but_masks_it(client: TestClient, world: World) -> None:
    r = client.post(
        "/api/v1/programs", json={"workspace_id": world.workspace_id, "name": "Second"}, headers=world.owner
    )
    assert r.status_code == 201
    data = r.json()["data"]
    assert "api_key" not in data
    assert data["api_token_masked"].startswith("aff_••••••••")
    assert "aff_" not in r.text.replace("aff_••••••••", "")


def test_test_mode_sale_with_key_returns_test_mode_true(world: World) -> None:
    """SEED verification 1."""
    r = world.client.post(
        "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=world.key
    )
    assert r.status_code == 200
    assert r.json()["data"]["test_mode"] is True
    assert "warnings" not in r.json()
    steps = world.client.get(f"/api/v1/programs/{world.program_id}/checklist", headers=world.owner)
    assert steps.status_code == 200
    done = {s["key"]: s["done"] for s in steps.json()["data"]["steps"]}
    assert done["test_sale_received"] is True
    assert done["api_key_generated"] is True
    assert done["sale_received"] is False


def test_regenerate_stops_old_key_at_once(world: World) -> None:
    """SEED verification 2: old and new keys never overlap."""
    old = world.key
    r = world.client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=world.owner)
    assert r.status_code == 201
    new_key = r.json()["data"]["api_key"]
    assert new_key.startswith("aff_") and len(new_key) >= 36 and new_key != world.api_key
    test_sale = {"additional_data": {"test_mode": True}}
    r = world.client.post("/api/v1/track/sale", json=test_sale, headers=old)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    r = world.client.post("/api/v1/track/sale", json=test_sale, headers=bearer(new_key))
    assert r.status_code == 200


def test_masked_value_matches_key_in_use(world: World) -> None:
    """SEED verification 3."""
    r = world.client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=world.owner)
    key = r.json()["data"]["api_key"]
    assert r.json()["data"]["api_token_masked"] == f"aff_••••••••{key[-4:]}"
    shown = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner).json()["data"]
    assert shown["api_token_masked"] == f"aff_••••••••{key[-4:]}"
    assert key not in str(shown)
    listed = world.client.get("/api/v1/programs", headers=world.owner).json()["data"]
    assert [p["api_token_masked"] for p in listed] == [shown["api_token_masked"]]


def test_member_cannot_regenerate(world: World) -> None:
    member = world.member()
    r = world.client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=member)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "owner_required"
    # the key in use still works: the refusal changed nothing
    assert world.sale().status_code == 200


def test_second_owner_can_regenerate(world: World) -> None:
    """An owner added later regenerates the key as the first owner would: a new key that works
    at once, and the old one refused from that instant."""
    owner2 = world.member("owner")
    r = world.client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=owner2)
    assert r.status_code == 201, r.text
    new_key = r.json()["data"]["api_key"]
    assert new_key.startswith("aff_") and new_key != world.api_key
    assert r.json()["data"]["api_token_masked"] == f"aff_••••••••{new_key[-4:]}"
    test_sale = {"additional_data": {"test_mode": True}}
    r = world.client.post("/api/v1/track/sale", json=test_sale, headers=world.key)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "invalid_api_key"
    r = world.client.post("/api/v1/track/sale", json=test_sale, headers=bearer(new_key))
    assert r.status_code == 200, r.text


def test_legacy_key_without_prefix_keeps_working(world: World) -> None:
    legacy = "0123456789abcdefLEGACYkey42"
    r = world.client.post(
        f"/api/v1/operator/programs/{world.program_id}/legacy-key", json={"api_key": legacy}, headers=OP
    )
    assert r.status_code == 201
    assert "api_key" not in r.json()["data"]
    assert r.json()["data"]["api_token_masked"] == "••••••••ey42"
    assert (
        world.client.post(
            "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=bearer(legacy)
        ).status_code
        == 200
    )
    # exact match on the whole key: a prefix or a suffix of it is not the key
    for wrong in (legacy[:-1], legacy + "x", "aff_" + legacy):
        r = world.client.post(
            "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=bearer(wrong)
        )
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    # the key it replaced stopped working
    assert world.sale().status_code == 401
    # regeneration issues a prefixed key and retires the legacy one
    r = world.client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=world.owner)
    assert r.json()["data"]["api_key"].startswith("aff_")
    r = world.client.post(
        "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=bearer(legacy)
    )
    assert r.status_code == 401


FLAGGED_AT = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)
DEADLINE = "2026-12-01T00:00:00Z"


def _flag(world: World) -> None:
    with time_machine.travel(FLAGGED_AT, tick=False):
        r = world.client.post(
            f"/api/v1/operator/programs/{world.program_id}/api-key/rotation",
            json={"deadline": DEADLINE},
            headers=OP,
        )
    assert r.status_code == 200, r.text


def _assert_rotation_headers(headers: dict[str, str] | object) -> None:
    h = headers  # httpx.Headers
    assert h["Deprecation"] == f"@{int(FLAGGED_AT.timestamp())}"  # type: ignore[index]
    assert h["Sunset"] == "Tue, 01 Dec 2026 00:00:00 GMT"  # type: ignore[index]
    assert h["Link"] == (  # type: ignore[index]
        '<http://testserver/docs/errors#api_key_rotation_required>; rel="deprecation"; type="text/html"'
    )


def test_rotation_before_deadline_warns_on_every_response(world: World) -> None:
    _flag(world)
    with time_machine.travel(datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC), tick=False):
        r = world.sale()
        assert r.status_code == 200
        _assert_rotation_headers(r.headers)
        warnings = r.json()["warnings"]
        assert warnings[0]["code"] == "api_key_rotation_required"
        assert warnings[0]["deadline"] == DEADLINE
        # an error response to the flagged key carries the headers and the warning too
        r = world.sale()
        assert r.status_code == 409
        _assert_rotation_headers(r.headers)
        assert r.json()["error"]["code"] == "duplicate_transaction"
        assert [w["code"] for w in r.json()["warnings"]] == ["api_key_rotation_required"]
        r = world.client.post("/api/v1/track/sale", json={"amount": 5}, headers=world.key)
        assert r.status_code == 422
        assert r.json()["warnings"][0]["deadline"] == DEADLINE
        # test-mode sales and server-mode leads as well
        r = world.client.post("/api/v1/track/lead", json={"customer_external_id": "u"}, headers=world.key)
        assert r.status_code == 200 and r.json()["warnings"][0]["code"] == "api_key_rotation_required"


def test_rotation_at_deadline_refuses_with_headers_and_no_warnings(world: World) -> None:
    _flag(world)
    with time_machine.travel(datetime(2026, 12, 1, 0, 0, 0, tzinfo=UTC), tick=False):
        r = world.sale()
        assert r.status_code == 401
        body = r.json()
        assert body["error"]["code"] == "api_key_rotation_required"
        assert body["error"]["deadline"] == DEADLINE
        assert "warnings" not in body
        _assert_rotation_headers(r.headers)
        # the refusal leaves a tracking-log line for the program
        log = world.client.get(f"/api/v1/programs/{world.program_id}/tracking-log", headers=world.owner)
        assert log.json()["data"]["entries"][0]["outcome"] == "api_key_rotation_required"


def test_regeneration_clears_the_flag(world: World) -> None:
    _flag(world)
    with time_machine.travel(datetime(2026, 12, 5, tzinfo=UTC), tick=False):
        assert world.sale().status_code == 401
        r = world.client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=world.owner)
        r = world.client.post(
            "/api/v1/track/sale",
            json={"transaction_id": "in_9", "customer_external_id": "c", "amount": 5},
            headers=bearer(r.json()["data"]["api_key"]),
        )
        assert r.status_code == 200
        assert "warnings" not in r.json() or all(
            w["code"] != "api_key_rotation_required" for w in r.json()["warnings"]
        )
        assert "Deprecation" not in r.headers and "Sunset" not in r.headers


def test_unflagged_key_has_no_rotation_headers(world: World) -> None:
    r = world.sale()
    assert r.status_code == 200
    assert "Deprecation" not in r.headers and "Sunset" not in r.headers and "Link" not in r.headers


def test_every_error_answered_to_a_flagged_key_carries_the_warning(world: World) -> None:
    """CONTRACT 3: while flagged and before the deadline, every response to a request
    authenticated with that key (success or error) carries the headers and the warning: refusals
    of the body, of the domain, and of the key's kind on endpoints for other credentials."""
    _flag(world)
    refund = {"transaction_id": "in_1", "refund_id": "re_1", "amount": 400}
    with time_machine.travel(datetime(2026, 11, 20, tzinfo=UTC), tick=False):
        assert world.sale().status_code == 200
        assert world.client.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
        post = world.client.post
        refusals = [
            (post("/api/v1/track/sale", content=b"[1, 2]", headers=world.key), 400, "invalid_json"),
            (
                post("/api/v1/track/sale", content=b"{" + b" " * 1_100_000 + b"}", headers=world.key),
                413,
                "payload_too_large",
            ),
            (post("/api/v1/track/refund", json=refund, headers=world.key), 409, "duplicate_refund"),
            (
                post(
                    "/api/v1/track/refund",
                    json={**refund, "refund_id": "re_2", "amount": 700},
                    headers=world.key,
                ),
                422,
                "refund_exceeds_sale",
            ),
            (
                post(
                    "/api/v1/track/lead",
                    json={"customer_external_id": "u", "program_id": "prog_other"},
                    headers=world.key,
                ),
                422,
                "program_mismatch",
            ),
            (world.client.get("/api/v1/programs", headers=world.key), 401, "account_token_required"),
            (
                world.client.get("/api/v1/operator/unroutable", headers=world.key),
                401,
                "operator_token_required",
            ),
            (world.client.get("/api/agent/v1/programs", headers=world.key), 401, "agent_key_required"),
        ]
        for r, status, code in refusals:
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
            assert "Deprecation" in r.headers, code
            _assert_rotation_headers(r.headers)
            [warning] = r.json()["warnings"]
            assert (warning["code"], warning["deadline"]) == ("api_key_rotation_required", DEADLINE), code
    # another program's key, unflagged, refused the same way: no warning
    r = world.client.get("/api/v1/programs", headers=world.owner)
    assert "warnings" not in r.json() and "Deprecation" not in r.headers


def test_legacy_key_is_never_the_operator_token(world: World) -> None:
    """The operator token as a program key would let anyone holding a brand's key act as the
    operator: refused (422 naming `api_key`), and the program's key stays as it was."""
    path = f"/api/v1/operator/programs/{world.program_id}/legacy-key"
    r = world.client.post(path, json={"api_key": OPERATOR_TOKEN}, headers=OP)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "validation_error"
    assert [f["field"] for f in error["fields"]] == ["api_key"]
    assert OPERATOR_TOKEN not in r.text
    assert world.sale().status_code == 200  # the key in use was not replaced
    r = world.client.post(
        "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=bearer(OPERATOR_TOKEN)
    )
    assert r.status_code == 401
