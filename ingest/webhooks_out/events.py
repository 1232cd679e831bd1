"""The events tally sends (CONTRACT section 13): their types, stable ids and bodies.

An event's id is derived from what it says, never drawn at random: the type, the program, the
key of the object it is about (a sale, a commission line, a payout batch, a key's rotation
flag) and, where the same kind of change can happen to one object again, the change's
number or value (`version`). Deriving the same change twice (a full re-run, a backfill, a
second replica) gives the same id, and the outbox keeps one event per id.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import orjson

from ingest.domain.clock import rfc3339

SALE_CREATED = "sale.created"
SALE_ATTRIBUTED = "sale.attributed"
SALE_REFUNDED = "sale.refunded"
COMMISSION_CREATED = "commission.created"
COMMISSION_APPROVED = "commission.approved"
COMMISSION_ADJUSTED = "commission.adjusted"
COMMISSION_VOIDED = "commission.voided"
PAYOUT_CREATED = "payout.created"
PAYOUT_PAID = "payout.paid"
KEY_ROTATION_REQUIRED = "api_key.rotation_required"
PING = "ping"

EVENT_TYPES = (
    SALE_CREATED,
    SALE_ATTRIBUTED,
    SALE_REFUNDED,
    COMMISSION_CREATED,
    COMMISSION_APPROVED,
    COMMISSION_ADJUSTED,
    COMMISSION_VOIDED,
    PAYOUT_CREATED,
    PAYOUT_PAID,
    KEY_ROTATION_REQUIRED,
    PING,
)

# What each type says, for the API reference, the dashboard and the README.
DESCRIPTIONS = {
    SALE_CREATED: "a sale was reconciled for the first time (test-mode sales too, with `test_mode` true)",
    SALE_ATTRIBUTED: "a sale's partner changed after it was first sent (`previous_partner_code`: from whom)",
    SALE_REFUNDED: "a sale's refunded amount grew (`refunded` is the total refunded so far)",
    COMMISSION_CREATED: "a sale's commission line appeared (pending until its holding days pass)",
    COMMISSION_APPROVED: "a commission line (of any kind) became approved: booked, payable",
    COMMISSION_ADJUSTED: "an `adjustment` or `clawback` line was booked for a sale already booked",
    COMMISSION_VOIDED: "a line became void, or a pending line no longer stands (its sale changed "
    "partner before it was booked: `status` void, `amount` 0)",
    PAYOUT_CREATED: "a payout batch was made",
    PAYOUT_PAID: "a payout batch was marked paid",
    KEY_ROTATION_REQUIRED: "the program's API key was flagged for mandatory rotation (with its deadline)",
    PING: "a test event sent on demand (`POST .../ping`), to this endpoint only",
}


def event_id(event_type: str, program_id: str, key: str, version: object = "") -> str:
    """The stable id of an event (`evt_` + 32 hex characters of a SHA-256)."""
    text = "\x1f".join((event_type, program_id, key, str(version)))
    return "evt_" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def body(event_id: str, event_type: str, at: datetime, program_id: str, data: dict[str, Any]) -> bytes:
    """The JSON a delivery sends: `{"id", "type", "timestamp", "program_id", "data"}` (compact,
    times RFC 3339 in UTC). Made once, kept in the outbox: every attempt sends these bytes."""
    payload = {"id": event_id, "type": event_type, "timestamp": at, "program_id": program_id, "data": data}
    return orjson.dumps(payload, default=_default, option=orjson.OPT_PASSTHROUGH_DATETIME)
