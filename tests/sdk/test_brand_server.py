"""sdk/examples/brand_server.py: checkout params, signup lead and renewal webhook; the example's
`AsyncTally` talks to the real app (`RealApp`)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import ROOT, World
from tests.sdk.helpers import LEGACY_SALE, RealApp, legacy_cycle, real_async_client, settled_lead
from tests.stripe_fixtures import load_event


def load_example() -> ModuleType:
    """The example is a script beside the SDK's distribution, not part of it: loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "brand_server", ROOT / "sdk" / "examples" / "brand_server.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


example = load_example()
checkout_session_params, create_app = example.checkout_session_params, example.create_app

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
def brand(world: World) -> tuple[TestClient, RealApp]:
    tally = RealApp(world)
    return TestClient(create_app(real_async_client(tally), program_id=world.program_id)), tally


@pytest.mark.parametrize("mode", ["payment", "subscription"])
def test_checkout_route_reads_the_cookie(brand: tuple[TestClient, RealApp], mode: str) -> None:
    http, tally = brand
    headers = {"X-User-Id": "user_42", "Cookie": "svc_click_id=clk_1"}
    with http:
        response = http.post(f"/checkout/{mode}", headers=headers)
    assert response.status_code == 200
    params: dict[str, Any] = response.json()["session_params"]
    assert params["mode"] == mode
    assert params["metadata"] == META | {"program_id": tally.world.program_id}
    assert ("subscription_data" in params) is (mode == "subscription")
    assert tally.requests == []  # checkout itself calls nobody; the processor is faked


def test_checkout_route_refusals(brand: tuple[TestClient, RealApp]) -> None:
    http, _ = brand
    with http:
        assert http.post("/checkout/payment").status_code == 401
        assert http.post("/checkout/setup", headers={"X-User-Id": "u"}).status_code == 404


def test_signup_reports_a_server_mode_lead(brand: tuple[TestClient, RealApp]) -> None:
    http, tally = brand
    r = tally.world.client.post(  # the visitor came through the partner's link: a real click
        "/api/v1/track/click", json={"program_id": tally.world.program_id, "partner_code": "alice"}
    )
    click_id = r.json()["data"]["click_id"]
    headers = {"X-User-Id": "user_42", "Cookie": f"svc_click_id={click_id}"}
    with http:
        response = http.post("/signup", headers=headers, json={"email": "a@example.com"})
    lead = response.json()["lead"]
    assert lead == {
        "lead_id": lead["lead_id"],
        "customer_external_id": "user_42",
        "status": "settled",
        "provisional": False,
    }
    assert tally.bodies == [
        {"customer_external_id": "user_42", "email": "a@example.com", "click_id": click_id}
    ]


def test_webhook_tracks_renewals_and_skips_the_rest(brand: tuple[TestClient, RealApp]) -> None:
    http, tally = brand
    settled_lead(tally.world, "user_42")
    first = legacy_cycle()
    first["data"]["object"]["billing_reason"] = "subscription_create"
    with http:
        tracked = http.post("/stripe/webhook", json=legacy_cycle()).json()
        skipped = http.post("/stripe/webhook", json=first).json()
        other = http.post(
            "/stripe/webhook", json=load_event("stripe-sync-engine__checkout_session_completed.json")
        ).json()
        again = http.post("/stripe/webhook", json=legacy_cycle()).json()  # the processor retries
    assert (tracked["action"], tracked["code"]) == ("tracked", "tracked")
    assert tracked["reason"] == f"renewal invoice {LEGACY_SALE['invoiceId']} tracked: 4900 usd"
    assert (skipped["action"], skipped["code"]) == ("skipped", "not_a_renewal")
    assert other == {"received": True, "action": "ignored"}
    assert (again["action"], again["code"]) == ("skipped", "already_tracked")  # the app's real 409
    assert tally.bodies == [LEGACY_SALE, LEGACY_SALE]
