"""sdk/examples/brand_server.py: checkout params, signup lead and renewal webhook."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from sdk.examples.brand_server import checkout_session_params, create_app
from tests.sdk.helpers import LEGACY_SALE, Script, async_client, legacy_cycle, ok
from tests.stripe_fixtures import load_event

URLS = {"success_url": "https://brand.test/ok", "cancel_url": "https://brand.test/no"}
META = {"svc_customer_key": "user_42", "program_id": "prog_1", "svc_click_id": "clk_1"}


def params_for(mode: Any, click_id: str | None, price_id: str = "price_1") -> dict[str, Any]:
    return checkout_session_params(
        mode,
        price_id=price_id,
        customer_key="user_42",
        program_id="prog_1",
        click_id=click_id,
        success_url=URLS["success_url"],
        cancel_url=URLS["cancel_url"],
    )


def test_payment_mode_params_carry_metadata_on_the_session() -> None:
    params = params_for("payment", "clk_1")
    assert params == {
        "mode": "payment",
        "line_items": [{"price": "price_1", "quantity": 1}],
        "client_reference_id": "user_42",
        "metadata": META,
        **URLS,
    }


def test_subscription_mode_params_carry_metadata_twice() -> None:
    params = params_for("subscription", "clk_1", price_id="price_m")
    assert params["line_items"] == [{"price": "price_m", "quantity": 1}]
    assert params["metadata"] == META
    assert params["subscription_data"] == {"metadata": META}
    assert params["metadata"] is not params["subscription_data"]["metadata"]


def test_missing_click_cookie_omits_the_click_id() -> None:
    params = params_for("subscription", None)
    expected = {"svc_customer_key": "user_42", "program_id": "prog_1"}
    assert params["metadata"] == expected
    assert params["subscription_data"]["metadata"] == expected


@pytest.fixture
def brand() -> tuple[TestClient, Script]:
    script = Script(ok({"lead_id": "lead_1", "status": "settled"}))
    app = create_app(async_client(script), program_id="prog_1")
    return TestClient(app), script


@pytest.mark.parametrize("mode", ["payment", "subscription"])
def test_checkout_route_reads_the_cookie(brand: tuple[TestClient, Script], mode: str) -> None:
    http, script = brand
    headers = {"X-User-Id": "user_42", "Cookie": "svc_click_id=clk_1"}
    with http:
        response = http.post(f"/checkout/{mode}", headers=headers)
    assert response.status_code == 200
    params: dict[str, Any] = response.json()["session_params"]
    assert params["mode"] == mode
    assert params["metadata"] == META
    assert ("subscription_data" in params) is (mode == "subscription")
    assert script.requests == []  # checkout itself calls nobody; the processor is faked


def test_checkout_route_refusals(brand: tuple[TestClient, Script]) -> None:
    http, _ = brand
    with http:
        assert http.post("/checkout/payment").status_code == 401
        assert http.post("/checkout/setup", headers={"X-User-Id": "u"}).status_code == 404


def test_signup_reports_a_server_mode_lead(brand: tuple[TestClient, Script]) -> None:
    http, script = brand
    headers = {"X-User-Id": "user_42", "Cookie": "svc_click_id=clk_1"}
    with http:
        response = http.post("/signup", headers=headers, json={"email": "a@example.com"})
    assert response.json() == {"lead": {"lead_id": "lead_1", "status": "settled"}}
    assert script.bodies == [
        {"customer_external_id": "user_42", "email": "a@example.com", "click_id": "clk_1"}
    ]


def test_webhook_tracks_renewals_and_skips_the_rest(brand: tuple[TestClient, Script]) -> None:
    http, script = brand
    first = legacy_cycle()
    first["data"]["object"]["billing_reason"] = "subscription_create"
    with http:
        tracked = http.post("/stripe/webhook", json=legacy_cycle()).json()
        skipped = http.post("/stripe/webhook", json=first).json()
        other = http.post(
            "/stripe/webhook", json=load_event("stripe-sync-engine__checkout_session_completed.json")
        ).json()
    assert (tracked["action"], tracked["code"]) == ("tracked", "tracked")
    assert (skipped["action"], skipped["code"]) == ("skipped", "not_a_renewal")
    assert other == {"received": True, "action": "ignored"}
    assert script.bodies == [LEGACY_SALE]
