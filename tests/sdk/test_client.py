"""sdk.client: request shapes, settings and client-side validation (no real server)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from sdk import AsyncTally, ConfigurationError, Tally, TrackResult, ValidationError
from tests.sdk.helpers import API_KEY, BASE_URL, Script, async_client, client, ok

SALE_DATA = {"sale_id": "sale_1", "transaction_id": "in_1", "test_mode": False, "attributed": True}


def test_track_sale_sends_documented_camelcase_shape() -> None:
    script = Script(ok(SALE_DATA))
    result = client(script).track_sale(
        customer_external_id="user_42",
        amount=4900,
        invoice_id="in_1",
        currency="EUR",
        is_recurring=True,
        sale_type="subscription",
        subscription_id="sub_1",
        email="a@example.com",
        click_id="clk_1",
        occurred_at=datetime(2026, 11, 21, 11, 0, tzinfo=timezone(timedelta(hours=1))),
    )
    (request,) = script.requests
    assert request.method == "POST"
    assert str(request.url) == f"{BASE_URL}/api/v1/track/sale"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"] == "tally-python/0.1.0"
    assert len(request.headers["x-request-id"]) == 32
    assert script.bodies[0] == {
        "customerExternalId": "user_42",
        "invoiceId": "in_1",
        "amount": 4900,
        "currency": "eur",
        "isRecurring": True,
        "saleType": "subscription",
        "subscriptionId": "sub_1",
        "email": "a@example.com",
        "click_id": "clk_1",
        "occurred_at": "2026-11-21T10:00:00Z",
    }
    assert result == TrackResult(data=SALE_DATA, request_id="req_1")


def test_minimal_sale_defaults_currency_and_omits_the_rest() -> None:
    script = Script(ok(SALE_DATA))
    client(script).track_sale(customer_external_id="user_42", amount=1, invoice_id="in_1")
    assert script.bodies == [
        {"customerExternalId": "user_42", "invoiceId": "in_1", "amount": 1, "currency": "usd"}
    ]


def test_track_sale_payload_accepts_the_seed_shape() -> None:
    script = Script(ok(SALE_DATA))
    payload = {
        "customerExternalId": "user_42",
        "amount": 2500,
        "invoiceId": "in_2",
        "currency": "usd",
        "isRecurring": False,
        "saleType": "one_time",
        "subscriptionId": None,
    }
    client(script).track_sale_payload(payload)
    assert script.bodies == [
        {
            "customerExternalId": "user_42",
            "invoiceId": "in_2",
            "amount": 2500,
            "currency": "usd",
            "isRecurring": False,
            "saleType": "one_time",
        }
    ]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"customerExternalId": "u", "amount": 1, "invoiceId": "i", "invoice_id": "x"}, "invoice_id"),
        ({"customerExternalId": "u", "amount": 1}, "invoiceId"),
        ({"amount": 1, "invoiceId": "i"}, "customerExternalId"),
        ({"customerExternalId": "u", "amount": 0, "invoiceId": "i"}, "amount"),
    ],
)
def test_track_sale_payload_refuses_bad_shapes_without_sending(payload: dict[str, Any], field: str) -> None:
    script = Script()
    with pytest.raises(ValidationError) as info:
        client(script).track_sale_payload(payload)
    assert info.value.fields[0]["field"] == field
    assert script.requests == []


@pytest.mark.parametrize("amount", [0, -1, -4900, 1.5, 10.0, True, "100", None])
def test_non_positive_or_non_integer_amounts_rejected_before_sending(amount: Any) -> None:
    script = Script()
    tally = client(script)
    with pytest.raises(ValidationError) as info:
        tally.track_sale(customer_external_id="user_42", amount=amount, invoice_id="in_1")
    with pytest.raises(ValidationError):
        tally.track_refund(transaction_id="in_1", refund_id="re_1", amount=amount)
    assert script.requests == []
    error = info.value
    assert (error.code, error.status, error.request_id) == ("validation_error", None, None)
    assert error.fields[0]["field"] == "amount"
    assert "nothing was sent" in error.message


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"customer_external_id": ""}, "customer_external_id"),
        ({"invoice_id": "  "}, "invoice_id"),
        ({"is_recurring": "yes"}, "is_recurring"),
        ({"occurred_at": datetime(2026, 1, 1)}, "occurred_at"),  # noqa: DTZ001 - naive on purpose
        ({"currency": 840}, "currency"),
    ],
)
def test_other_invalid_arguments_rejected_before_sending(kwargs: dict[str, Any], field: str) -> None:
    script = Script()
    args: dict[str, Any] = {"customer_external_id": "u", "amount": 100, "invoice_id": "in_1"}
    with pytest.raises(ValidationError) as info:
        client(script).track_sale(**(args | kwargs))
    assert info.value.fields == [{"field": field, "message": info.value.fields[0]["message"]}]
    assert script.requests == []


def test_test_sale_sends_additional_data_alone() -> None:
    script = Script(ok({"test_mode": True}))
    result = client(script).track_test_sale()
    assert script.bodies == [{"additional_data": {"test_mode": True}}]
    assert str(script.requests[0].url) == f"{BASE_URL}/api/v1/track/sale"
    assert result.data == {"test_mode": True}


def test_lead_and_refund_bodies_are_snake_case() -> None:
    script = Script(ok({"lead_id": "lead_1"}))
    tally = client(script)
    tally.track_lead(customer_external_id="user_42", email="a@example.com", click_id="clk_1")
    tally.track_lead(customer_external_id="user_43", name="Ada")
    tally.track_refund(transaction_id="in_1", refund_id="re_1", amount=500, reason="requested")
    assert [str(r.url) for r in script.requests] == [
        f"{BASE_URL}/api/v1/track/lead",
        f"{BASE_URL}/api/v1/track/lead",
        f"{BASE_URL}/api/v1/track/refund",
    ]
    assert script.bodies == [
        {"customer_external_id": "user_42", "email": "a@example.com", "click_id": "clk_1"},
        {"customer_external_id": "user_43", "name": "Ada"},
        {"transaction_id": "in_1", "refund_id": "re_1", "amount": 500, "reason": "requested"},
    ]
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in script.requests)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", "aff_from_env")
    monkeypatch.setenv("TALLY_BASE_URL", "http://brand-tally.test/prefix")
    script = Script(ok(SALE_DATA))
    tally = Tally(transport=httpx.MockTransport(script))
    tally.track_sale(customer_external_id="u", amount=1, invoice_id="in_1")
    assert str(script.requests[0].url) == "http://brand-tally.test/prefix/api/v1/track/sale"
    assert script.requests[0].headers["authorization"] == "Bearer aff_from_env"
    assert "aff_from_env" not in repr(tally)
    assert repr(tally) == "Tally(base_url='http://brand-tally.test/prefix')"


def test_defaults_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVICE_API_KEY", raising=False)
    monkeypatch.delenv("TALLY_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="SERVICE_API_KEY"):
        Tally()
    with pytest.raises(ConfigurationError):
        AsyncTally()
    assert Tally(api_key="aff_x").base_url == "http://127.0.0.1:8000"


def test_explicit_arguments_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", "aff_env")
    monkeypatch.setenv("TALLY_BASE_URL", "http://env.test")
    script = Script(ok({}))
    with client(script) as tally:
        tally.track_test_sale()
    assert str(script.requests[0].url).startswith(BASE_URL)
    assert script.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_async_client_sends_the_same_requests() -> None:
    sync_script, async_script = Script(ok(SALE_DATA)), Script(ok(SALE_DATA))
    kwargs: dict[str, Any] = {"customer_external_id": "u", "amount": 990, "invoice_id": "in_9"}

    async def run() -> TrackResult:
        async with async_client(async_script) as tally:
            await tally.track_lead(customer_external_id="u")
            await tally.track_refund(transaction_id="in_9", refund_id="re_9", amount=10)
            await tally.track_test_sale()
            await tally.track_sale_payload({"customerExternalId": "u", "amount": 990, "invoiceId": "in_9"})
            return await tally.track_sale(**kwargs)

    result = asyncio.run(run())
    tally = client(sync_script)
    tally.track_lead(customer_external_id="u")
    tally.track_refund(transaction_id="in_9", refund_id="re_9", amount=10)
    tally.track_test_sale()
    tally.track_sale_payload({"customerExternalId": "u", "amount": 990, "invoiceId": "in_9"})
    assert result == tally.track_sale(**kwargs)
    assert async_script.bodies == sync_script.bodies
    assert [r.url for r in async_script.requests] == [r.url for r in sync_script.requests]
    assert result.data == SALE_DATA


def test_occurred_at_accepts_utc_and_strings() -> None:
    script = Script(ok(SALE_DATA))
    tally = client(script)
    base: dict[str, Any] = {"customer_external_id": "u", "amount": 1, "invoice_id": "in_1"}
    tally.track_sale(**base, occurred_at=datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC))
    tally.track_sale(**base, occurred_at="2026-02-01T00:00:00Z")
    assert [b["occurred_at"] for b in script.bodies] == [
        "2026-01-31T23:59:59Z",
        "2026-02-01T00:00:00Z",
    ]
