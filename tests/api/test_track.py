"""Track endpoints (CONTRACT section 4, SEED sections 2.4, 3.2, 4, 7)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.conftest import World, bearer, make_world
from tests.helpers import sql_rows


def _raw(client: TestClient, sql: str) -> list[tuple[Any, ...]]:
    state = client.app.state.tally  # type: ignore[attr-defined]
    state.writer.sync_blocking()
    rows: list[tuple[Any, ...]] = sql_rows(state.store, sql)
    return rows


def _click(world: World, code: str = "alice") -> str:
    r = world.client.post(
        "/api/v1/track/click",
        json={"program_id": world.program_id, "partner_code": code, "url": "https://brand.test/?aff=alice"},
    )
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    assert data["click_id"].startswith("clk_")
    assert data == {"click_id": data["click_id"], "program_id": world.program_id, "partner_code": code}
    return str(data["click_id"])


def test_click_is_public_and_checks_program_and_partner(world: World) -> None:
    _click(world)
    r = world.client.post("/api/v1/track/click", json={"program_id": "prog_nope", "partner_code": "alice"})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found")
    r = world.client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "bob"})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "partner_not_found")


def test_public_endpoints_answer_cors_preflight(world: World) -> None:
    for path in ("/api/v1/track/click", "/api/v1/track/lead"):
        r = world.client.options(
            path,
            headers={"Origin": "https://brand.test", "Access-Control-Request-Method": "POST"},
        )
        assert r.status_code == 204
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert "Access-Control-Allow-Credentials" not in r.headers
        assert "authorization" not in r.headers["Access-Control-Allow-Headers"].lower()


def test_server_lead_settles_and_binds_customer_to_click_partner(world: World) -> None:
    click = _click(world)
    r = world.client.post(
        "/api/v1/track/lead", json={"customerExternalId": "u1", "click_id": click}, headers=world.key
    )
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["status"] == "settled" and data["provisional"] is False
    assert data["customer_external_id"] == "u1" and data["lead_id"].startswith("lead_")
    r = world.sale(transaction_id="in_100", customer_external_id="u1")
    assert r.json()["data"]["attributed"] is True
    assert r.json()["data"]["partner_code"] == "alice"
    assert "warnings" not in r.json()


def test_browser_lead_needs_program_id(world: World) -> None:
    r = world.client.post("/api/v1/track/lead", json={"customer_external_id": "u1"})
    assert r.status_code == 422
    assert r.json()["error"]["fields"][0]["field"] == "program_id"
    r = world.client.post("/api/v1/track/lead", json={"customer_external_id": "u1", "program_id": "prog_x"})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found")


def test_browser_lead_is_provisional_when_program_requires_server_leads(client: TestClient) -> None:
    world = make_world(client, requires_server_side_leads=True)
    click = _click(world)
    r = client.post(
        "/api/v1/track/lead",
        json={"customer_external_id": "u1", "click_id": click, "program_id": world.program_id},
    )
    assert r.status_code == 200
    assert r.json()["data"]["provisional"] is True and r.json()["data"]["status"] == "provisional"
    # a provisional lead never attributes
    r = world.sale(transaction_id="in_1", customer_external_id="u1")
    assert r.json()["data"]["attributed"] is False
    assert r.json()["warnings"][0]["code"] == "customer_not_attributed"
    # a server-mode lead for the same customer settles it, keeping the browser lead's click
    r = client.post("/api/v1/track/lead", json={"customer_external_id": "u1"}, headers=world.key)
    assert r.json()["data"]["status"] == "settled" and r.json()["data"]["provisional"] is False
    rows = _raw(client, "SELECT lead_status, click_id FROM raw_events WHERE kind = 'lead' ORDER BY seq")
    assert rows == [("provisional", click), ("settled", click)]
    r = world.sale(transaction_id="in_2", customer_external_id="u1")
    assert r.json()["data"]["attributed"] is True


def test_browser_lead_settled_without_server_requirement(world: World) -> None:
    r = world.client.post(
        "/api/v1/track/lead", json={"customer_external_id": "u1", "program_id": world.program_id}
    )
    assert r.json()["data"] == {
        "lead_id": r.json()["data"]["lead_id"],
        "customer_external_id": "u1",
        "status": "settled",
        "provisional": False,
    }


def test_first_settled_lead_binds_later_leads_do_not_rebind(world: World) -> None:
    r = world.client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "bob", "name": "Bob"},
        headers=world.owner,
    )
    assert r.status_code == 201
    first, second = _click(world, "alice"), _click(world, "bob")
    for click in (first, second):
        world.client.post(
            "/api/v1/track/lead", json={"customer_external_id": "u1", "click_id": click}, headers=world.key
        )
    assert world.sale(customer_external_id="u1").json()["data"]["partner_code"] == "alice"


def test_server_lead_with_other_program_id_is_a_mismatch(world: World) -> None:
    r = world.client.post(
        "/api/v1/track/lead",
        json={"customer_external_id": "u1", "program_id": "prog_other"},
        headers=world.key,
    )
    assert (r.status_code, r.json()["error"]["code"]) == (422, "program_mismatch")


def test_real_sale_recorded_unattributed_with_warning(world: World) -> None:
    r = world.sale(
        invoiceId="in_77", transaction_id=None, customerExternalId="ghost", customer_external_id=None
    )
    assert r.status_code == 422  # alias and name both sent: unknown/duplicate field refused
    r = world.client.post(
        "/api/v1/track/sale",
        json={
            "invoiceId": "in_77",
            "customerExternalId": "ghost",
            "amount": 1999,
            "currency": "EUR",
            "isRecurring": True,
            "saleType": "subscription",
            "subscriptionId": "sub_1",
        },
        headers=world.key,
    )
    assert r.status_code == 200
    body = r.json()
    assert body["data"]["transaction_id"] == "in_77"
    assert body["data"]["test_mode"] is False and body["data"]["attributed"] is False
    assert body["data"]["currency"] == "eur"
    assert [w["code"] for w in body["warnings"]] == ["customer_not_attributed"]
    rows = _raw(
        world.client,
        "SELECT amount, currency, is_recurring, sale_type, subscription_id, outcome "
        "FROM raw_events WHERE kind = 'sale'",
    )
    assert rows == [(1999, "eur", True, "subscription", "sub_1", "accepted")]


def test_duplicate_sale_is_409_and_kept_marked_duplicate(world: World) -> None:
    assert world.sale().status_code == 200
    r = world.sale(amount=5)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "duplicate_transaction")
    rows = _raw(world.client, "SELECT outcome, amount FROM raw_events WHERE kind = 'sale' ORDER BY seq")
    assert rows == [("accepted", 1000), ("duplicate", 5)]
    # another program may use the same transaction id
    other = make_world(world.client)
    assert other.sale().status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"transaction_id": "t", "customer_external_id": "c", "amount": 0}, "amount"),
        ({"transaction_id": "t", "customer_external_id": "c", "amount": -5}, "amount"),
        ({"transaction_id": "t", "customer_external_id": "c", "amount": 10.5}, "amount"),
        ({"transaction_id": "t", "customer_external_id": "c", "amount": "10"}, "amount"),
        ({"transaction_id": "t", "customer_external_id": "c", "amount": True}, "amount"),
        ({"transaction_id": "t", "customer_external_id": "c"}, "amount"),
        ({"customer_external_id": "c", "amount": 5}, "transaction_id"),
        ({"transaction_id": "t", "amount": 5}, "customer_external_id"),
        (
            {"transaction_id": "t", "customer_external_id": "c", "amount": 5, "currency": "dollars"},
            "currency",
        ),
        ({"transaction_id": "t", "customer_external_id": "c", "amount": 5, "surprise": 1}, "surprise"),
        (
            {
                "transaction_id": "t",
                "customer_external_id": "c",
                "amount": 5,
                "occurred_at": "2026-11-01T10:00:00",
            },
            "occurred_at",
        ),
    ],
)
def test_sale_validation_errors(world: World, body: dict[str, Any], field: str) -> None:
    r = world.client.post("/api/v1/track/sale", json=body, headers=world.key)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "validation_error"
    assert field in [f["field"] for f in err["fields"]]
    assert _raw(world.client, "SELECT count(*) FROM raw_events WHERE kind = 'sale'") == [(0,)]


def test_invalid_json_and_non_objects(world: World) -> None:
    for raw in (b"{", b"[]", b'"x"', b"42", b"null", b"", b"\xff\xfe"):
        r = world.client.post("/api/v1/track/sale", content=raw, headers=world.key)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json"), raw


def test_payload_too_large(world: World) -> None:
    big = b'{"transaction_id": "' + b"x" * (1024 * 1024) + b'"}'
    r = world.client.post("/api/v1/track/sale", content=big, headers=world.key)
    assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")
    r = world.client.post("/api/v1/track/click", content=big)
    assert r.status_code == 413


def test_refunds(world: World) -> None:
    assert world.sale(amount=1000).status_code == 200
    refund = {"transaction_id": "in_1", "refund_id": "re_1", "amount": 400}
    r = world.client.post("/api/v1/track/refund", json=refund, headers=world.key)
    assert r.status_code == 200 and "warnings" not in r.json()
    r = world.client.post("/api/v1/track/refund", json=refund, headers=world.key)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "duplicate_refund")
    r = world.client.post(
        "/api/v1/track/refund", json={**refund, "refund_id": "re_2", "amount": 601}, headers=world.key
    )
    assert (r.status_code, r.json()["error"]["code"]) == (422, "refund_exceeds_sale")
    r = world.client.post(
        "/api/v1/track/refund", json={**refund, "refund_id": "re_2", "amount": 600}, headers=world.key
    )
    assert r.status_code == 200
    r = world.client.post(
        "/api/v1/track/refund",
        json={"transaction_id": "in_unknown", "refund_id": "re_3", "amount": 5},
        headers=world.key,
    )
    assert r.status_code == 200
    assert r.json()["warnings"][0]["code"] == "sale_not_found"
    r = world.client.post(
        "/api/v1/track/refund",
        json={"transaction_id": "in_1", "refund_id": "re_4", "amount": 0},
        headers=world.key,
    )
    assert r.status_code == 422


def test_every_track_call_leaves_a_log_line(world: World) -> None:
    world.sale()
    world.sale()  # 409
    world.client.post("/api/v1/track/sale", json={"amount": -1}, headers=world.key)  # 422
    _click(world)
    r = world.client.get(f"/api/v1/programs/{world.program_id}/tracking-log?limit=3", headers=world.owner)
    entries = r.json()["data"]["entries"]
    assert [(e["endpoint"], e["status"], e["outcome"]) for e in entries] == [
        ("track/click", 201, "accepted"),
        ("track/sale", 422, "validation_error"),
        ("track/sale", 409, "duplicate_transaction"),
    ]
    nxt = r.json()["data"]["next_before"]
    older = world.client.get(
        f"/api/v1/programs/{world.program_id}/tracking-log?before={nxt}", headers=world.owner
    ).json()["data"]
    assert [e["status"] for e in older["entries"]] == [200]
    assert older["next_before"] is None


def test_unauthenticated_request_bodies_are_not_stored(world: World) -> None:
    secret_body = {"transaction_id": "in_secret", "customer_external_id": "c", "amount": 5}
    world.client.post("/api/v1/track/sale", json=secret_body, headers=bearer("aff_wrong"))
    world.client.post("/api/v1/track/sale", json=secret_body)
    rows = _raw(world.client, "SELECT count(*) FROM raw_events WHERE body LIKE '%in_secret%'")
    assert rows == [(0,)]
    logs = _raw(world.client, "SELECT count(*) FROM tracking_log WHERE detail LIKE '%in_secret%'")
    assert logs == [(0,)]


def test_public_endpoints_are_rate_limited_per_client(settings: Settings) -> None:
    limited = settings.model_copy(update={"public_rate_per_second": 1.0, "public_rate_burst": 3})
    with TestClient(create_app(limited)) as client:
        world = make_world(client)
        body = {"program_id": world.program_id, "partner_code": "alice"}
        codes = [client.post("/api/v1/track/click", json=body).status_code for _ in range(4)]
        assert codes == [201, 201, 201, 429]
        r = client.post(
            "/api/v1/track/lead", json={"customer_external_id": "u", "program_id": world.program_id}
        )
        assert (r.status_code, r.json()["error"]["code"]) == (429, "rate_limited")
        assert r.headers["Retry-After"] == "1"
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        # keyed calls are not limited by the public bucket
        assert world.sale().status_code == 200
