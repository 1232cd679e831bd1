"""Request bodies of the track endpoints, checked before anything is sent.

Sale bodies use the camelCase keys of the SDK's documented `trackSale` shape (the API accepts
them as aliases); lead and refund bodies use the API's snake_case names.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tally_sdk._core import Call
from tally_sdk.errors import ValidationError

SALE_PATH = "/api/v1/track/sale"
LEAD_PATH = "/api/v1/track/lead"
REFUND_PATH = "/api/v1/track/refund"

# The documented camelCase `trackSale` shape -> `track_sale` keyword arguments.
SALE_PAYLOAD_KEYS: Mapping[str, str] = {
    "customerExternalId": "customer_external_id",
    "amount": "amount",
    "invoiceId": "invoice_id",
    "currency": "currency",
    "isRecurring": "is_recurring",
    "saleType": "sale_type",
    "subscriptionId": "subscription_id",
    "email": "email",
    "clickId": "click_id",
    "occurredAt": "occurred_at",
}
_REQUIRED_SALE_KEYS = ("customerExternalId", "amount", "invoiceId")


def sale_call(
    *,
    customer_external_id: str,
    amount: int,
    invoice_id: str,
    currency: str = "usd",
    is_recurring: bool | None = None,
    sale_type: str | None = None,
    subscription_id: str | None = None,
    email: str | None = None,
    click_id: str | None = None,
    occurred_at: datetime | str | None = None,
) -> Call:
    """A real sale; `invoice_id` is the idempotency key, so the call is safe to retry."""
    body: dict[str, Any] = {
        "customerExternalId": _text("customer_external_id", customer_external_id),
        "invoiceId": _text("invoice_id", invoice_id),
        "amount": _positive("amount", amount),
        "currency": _text("currency", currency).lower(),
    }
    if is_recurring is not None:
        if not isinstance(is_recurring, bool):
            raise _invalid("is_recurring", "must be a boolean")
        body["isRecurring"] = is_recurring
    optional = {
        "saleType": ("sale_type", sale_type),
        "subscriptionId": ("subscription_id", subscription_id),
        "email": ("email", email),
        "click_id": ("click_id", click_id),
    }
    body.update({key: _text(name, v) for key, (name, v) in optional.items() if v is not None})
    if occurred_at is not None:
        body["occurred_at"] = _timestamp("occurred_at", occurred_at)
    return Call(SALE_PATH, body, idempotent=True)


def sale_call_from_payload(payload: Mapping[str, Any]) -> Call:
    """A real sale from the documented camelCase shape (`customerExternalId`, `invoiceId`...)."""
    if not isinstance(payload, Mapping):
        raise _invalid("payload", "must be a mapping in the trackSale shape")
    unknown = sorted(set(payload) - set(SALE_PAYLOAD_KEYS))
    if unknown:
        raise _invalid(unknown[0], f"unknown trackSale field(s): {', '.join(unknown)}")
    for key in _REQUIRED_SALE_KEYS:
        if payload.get(key) is None:
            raise _invalid(key, "is required")
    kwargs = {SALE_PAYLOAD_KEYS[k]: v for k, v in payload.items() if v is not None}
    return sale_call(**kwargs)


def make_test_sale_call() -> Call:
    """The test-mode sale: `additional_data.test_mode` alone. Retried only if surely not sent."""
    return Call(SALE_PATH, {"additional_data": {"test_mode": True}}, idempotent=False)


def lead_call(
    *,
    customer_external_id: str,
    email: str | None = None,
    click_id: str | None = None,
    name: str | None = None,
) -> Call:
    """A server-mode lead; repeating it cannot rebind the customer, so it is safe to retry."""
    body: dict[str, Any] = {"customer_external_id": _text("customer_external_id", customer_external_id)}
    optional = {"email": email, "click_id": click_id, "name": name}
    body.update({key: _text(key, v) for key, v in optional.items() if v is not None})
    return Call(LEAD_PATH, body, idempotent=True)


def refund_call(*, transaction_id: str, refund_id: str, amount: int, reason: str | None = None) -> Call:
    """A refund of a recorded sale; `refund_id` is the idempotency key (409 on repeat)."""
    body: dict[str, Any] = {
        "transaction_id": _text("transaction_id", transaction_id),
        "refund_id": _text("refund_id", refund_id),
        "amount": _positive("amount", amount),
    }
    if reason is not None:
        body["reason"] = _text("reason", reason)
    return Call(REFUND_PATH, body, idempotent=True)


def _invalid(name: str, message: str) -> ValidationError:
    return ValidationError(
        "validation_error",
        f"{name} {message} (refused by the SDK, nothing was sent)",
        details={"fields": [{"field": name, "message": message}]},
    )


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _invalid(name, "must be a non-empty string")
    return value


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(name, f"must be an integer amount in minor units, got {value!r}")
    if value <= 0:
        raise _invalid(name, f"must be positive, got {value}")
    return value


def _timestamp(name: str, value: datetime | str) -> str:
    if isinstance(value, str):
        return _text(name, value)
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise _invalid(name, "must be an aware datetime or an RFC 3339 string")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
