"""The error envelope, pinned once for every code (CONTRACT sections 1 and 9)."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from ingest.domain.errors import ALL_ERRORS
from tests.conftest import OP, World, bearer

CONTRACT_CODES = {
    "invalid_json",
    "invalid_signature",
    "missing_credentials",
    "malformed_authorization",
    "invalid_api_key",
    "api_key_rotation_required",
    "program_key_required",
    "agent_key_required",
    "account_token_required",
    "operator_token_required",
    "owner_required",
    "insufficient_scope",
    "program_not_found",
    "partner_not_found",
    "sale_not_found",
    "not_found",
    "duplicate_transaction",
    "duplicate_refund",
    "payload_too_large",
    "validation_error",
    "program_mismatch",
    "refund_exceeds_sale",
    "rate_limited",
}


def test_every_contract_code_has_an_error_class() -> None:
    assert {cls.code for cls in ALL_ERRORS} >= CONTRACT_CODES


def test_error_envelope_shape(world: World) -> None:
    r = world.client.post("/api/v1/track/sale", json={}, headers=bearer("aff_unknown"))
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "doc_url"}
    assert body["error"]["doc_url"] == "http://testserver/docs/errors#invalid_api_key"
    assert re.fullmatch(r"[a-z_]+", body["error"]["code"])
    assert r.headers["content-type"] == "application/json"


def test_success_envelope_shape(world: World) -> None:
    body = world.client.post(
        "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=world.key
    ).json()
    assert set(body) == {"data"}


def test_request_id_echoed_or_generated(client: TestClient) -> None:
    r = client.get("/healthz", headers={"X-Request-Id": "abc-123.x"})
    assert r.headers["X-Request-Id"] == "abc-123.x"
    r = client.get("/healthz", headers={"X-Request-Id": "bad id with spaces"})
    assert r.headers["X-Request-Id"].startswith("req_")
    r = client.get("/nowhere")
    assert r.headers["X-Request-Id"].startswith("req_")
    assert r.json()["error"]["code"] == "not_found"
    r = client.delete("/api/v1/track/sale")
    assert r.status_code == 405 and r.headers["X-Request-Id"]


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"data": {"status": "ok"}})


def test_docs_errors_page_documents_every_code(client: TestClient) -> None:
    r = client.get("/docs/errors")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for code in CONTRACT_CODES | {cls.code for cls in ALL_ERRORS if cls.code != "internal_error"}:
        assert f'id="{code}"' in r.text, code


@pytest.mark.parametrize("value", ["²", "٣", "１", "-1", "1e3"])
def test_integer_query_parameters_take_ascii_digits_only(world: World, value: str) -> None:
    """`str.isdigit` is true for superscripts and other scripts' digits, which `int` refuses
    (or reads): each integer parameter answers 422 naming itself, never a 500."""
    base = f"/api/v1/programs/{world.program_id}"
    for path, name in [
        (f"{base}/tracking-log", "limit"),
        (f"{base}/tracking-log", "before"),
        (f"{base}/sales", "limit"),
        (f"{base}/sales", "offset"),
        ("/api/v1/operator/unroutable", "limit"),
    ]:
        headers = OP if "operator" in path else world.owner
        r = world.client.get(path, params={name: value}, headers=headers)
        assert r.status_code == 422, (path, name, r.text)
        assert r.json()["error"]["code"] == "validation_error"
