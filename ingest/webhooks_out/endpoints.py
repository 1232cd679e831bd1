"""A program's webhook endpoints (CONTRACT section 13), as the API, the dashboard and the CLI
see them: create (the signing secret shown once), list (secrets masked), update, delete, rotate
the secret, ping, the delivery log and resending. Blocking calls on the store's outbox
connection: the routes run them off the event loop.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ingest.domain.errors import NotFound, ValidationFailed
from ingest.domain.tokens import new_id
from ingest.storage.contract import Store
from ingest.webhooks_out import events, marks, outbox, signing
from ingest.webhooks_out.addresses import url_problem
from ingest.webhooks_out.inputs import EndpointIn, EndpointPatch

DELIVERY_STATUSES = ("pending", "succeeded", "failed")
DELIVERIES_SHOWN = 100  # the delivery log's default page
DELIVERIES_MAX = 1000


def _check_url(url: str, allow_private: bool) -> None:
    problem = url_problem(url, allow_private)
    if problem is not None:
        raise ValidationFailed(f"url {problem}", fields=[{"field": "url", "message": problem}])


def view(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    """An endpoint as reads show it: its secret masked, and until when the previous secret
    still signs beside it (null when none does)."""
    until = row["previous_until"]
    return {
        "endpoint_id": row["endpoint_id"],
        "program_id": row["program_id"],
        "url": row["url"],
        "description": row["description"],
        "events": row["events"],
        "enabled": row["enabled"],
        "secret_masked": signing.mask(row["secret"]),
        "previous_secret_expires_at": until if until is not None and until > now else None,
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "failing_since": row["failing_since"],
        "disabled_at": row["disabled_at"],
        "disabled_reason": row["disabled_reason"],
    }


def _found(store: Store, program_id: str, endpoint_id: str) -> dict[str, Any]:
    with store.outbox() as db:
        row = outbox.endpoint(db, program_id, endpoint_id)
    if row is None:
        raise NotFound(f"no webhook endpoint {endpoint_id} in program {program_id}")
    return row


def create(
    store: Store, program_id: str, inp: EndpointIn, allow_private: bool, now: datetime
) -> dict[str, Any]:
    """A new endpoint, enabled, with a new signing secret: the one answer that shows it."""
    _check_url(inp.url, allow_private)
    secret = signing.new_secret()
    row = {
        "endpoint_id": new_id("we"),
        "program_id": program_id,
        "url": inp.url,
        "description": inp.description,
        "events": list(inp.events),
        "enabled": True,
        "secret": secret,
        "previous_secret": None,
        "previous_until": None,
        "created_at": now,
        "updated_at": now,
        "failing_since": None,
        "disabled_at": None,
        "disabled_reason": None,
    }
    with store.outbox() as db, outbox.transaction(db):
        outbox.add_endpoint(db, row)
        marks.baseline(db, program_id)  # its first endpoint: changes from now on are events
    return {**view(row, now), "secret": secret}


def listing(store: Store, program_id: str, now: datetime) -> list[dict[str, Any]]:
    with store.outbox() as db:
        return [view(row, now) for row in outbox.endpoints(db, program_id)]


def get(store: Store, program_id: str, endpoint_id: str, now: datetime) -> dict[str, Any]:
    return view(_found(store, program_id, endpoint_id), now)


def update(
    store: Store, program_id: str, endpoint_id: str, patch: EndpointPatch, allow_private: bool, now: datetime
) -> dict[str, Any]:
    """Change what the patch gives. Enabling an endpoint again ends its failing streak and clears
    why it was disabled; disabling one keeps its deliveries, which wait until it is enabled."""
    _found(store, program_id, endpoint_id)
    changes: dict[str, Any] = {}
    if patch.url is not None:
        _check_url(patch.url, allow_private)
        changes["url"] = patch.url
    if patch.events is not None:
        changes["events"] = list(patch.events)
    if patch.description is not None:
        changes["description"] = patch.description
    if patch.enabled is not None:
        changes["enabled"] = patch.enabled
        if patch.enabled:
            changes.update(failing_since=None, disabled_at=None, disabled_reason=None)
    if changes:
        changes["updated_at"] = now
        with store.outbox() as db:
            outbox.update_endpoint(db, endpoint_id, changes)
    return get(store, program_id, endpoint_id, now)


def delete(store: Store, program_id: str, endpoint_id: str) -> dict[str, Any]:
    """Delete an endpoint with its deliveries (nothing more is sent to it)."""
    _found(store, program_id, endpoint_id)
    with store.outbox() as db, outbox.transaction(db):
        outbox.delete_endpoint(db, endpoint_id)
        if not outbox.endpoints(db, program_id):
            marks.forget(db, program_id)  # its last endpoint: its marks are no longer kept
    return {"endpoint_id": endpoint_id, "deleted": True}


def rotate(store: Store, program_id: str, endpoint_id: str, now: datetime) -> dict[str, Any]:
    """A new signing secret; the one it replaces keeps signing beside it for 24 hours (a secret
    older than that, from an earlier rotation, stops at once)."""
    row = _found(store, program_id, endpoint_id)
    secret = signing.new_secret()
    changes = {
        "secret": secret,
        "previous_secret": row["secret"],
        "previous_until": now + signing.ROTATION_OVERLAP,
        "updated_at": now,
    }
    with store.outbox() as db:
        outbox.update_endpoint(db, endpoint_id, changes)
    return {**view({**row, **changes}, now), "secret": secret}


def delivery_view(row: dict[str, Any]) -> dict[str, Any]:
    """A delivery as the log shows it: the last attempt's answer, how many attempts were made
    (`attempt`), when the next is due, and every attempt (`attempt_log`)."""
    return {
        "delivery_id": row["delivery_id"],
        "endpoint_id": row["endpoint_id"],
        "event_id": row["event_id"],
        "type": row["type"],
        "status": row["status"],
        "response_status": row["response_status"],
        "duration_ms": row["duration_ms"],
        "attempt": row["attempts"],
        "next_attempt_at": row["next_attempt_at"],
        "created_at": row["created_at"],
        "last_attempt_at": row["last_attempt_at"],
        "error": row["error"],
        "attempt_log": row["attempt_log"],
    }


def _delivery(store: Store, endpoint_id: str, delivery_id: str) -> dict[str, Any]:
    with store.outbox() as db:
        found = outbox.deliveries(db, endpoint_id, None, 1, delivery=delivery_id)
    if not found:
        raise NotFound(f"no delivery {delivery_id} to webhook endpoint {endpoint_id}")
    return delivery_view(found[0])


def ping(store: Store, program_id: str, endpoint_id: str, now: datetime) -> dict[str, Any]:
    """A `ping` event for this endpoint alone (whatever types it takes, enabled or not), due now."""
    row = _found(store, program_id, endpoint_id)
    event_id = events.event_id(events.PING, program_id, endpoint_id, new_id("ping"))
    data = {"endpoint_id": endpoint_id, "url": row["url"], "message": "a test event from tally"}
    event = outbox.Event(
        event_id, events.PING, program_id, now, events.body(event_id, events.PING, now, program_id, data)
    )
    with store.outbox() as db, outbox.transaction(db):
        this_one = {program_id: [{"endpoint_id": endpoint_id, "events": [events.PING]}]}
        made = outbox.emit(db, [event], this_one, now)
        assert made == 1, "a ping's id is new every time"
    return _delivery(store, endpoint_id, outbox.delivery_id(event_id, endpoint_id))


def delivery_log(
    store: Store, program_id: str, endpoint_id: str, status: str | None, limit: int
) -> list[dict[str, Any]]:
    """The endpoint's deliveries, newest event first, with every attempt of each."""
    _found(store, program_id, endpoint_id)
    with store.outbox() as db:
        return [delivery_view(row) for row in outbox.deliveries(db, endpoint_id, status, limit)]


def resend(
    store: Store, program_id: str, endpoint_id: str, delivery_id: str, now: datetime
) -> dict[str, Any]:
    """Send a delivery again now (the same event, the same `webhook-id`), with a new retry window."""
    _found(store, program_id, endpoint_id)
    with store.outbox() as db:
        done = outbox.resend(db, endpoint_id, delivery_id, now)
    if not done:
        raise NotFound(f"no delivery {delivery_id} to webhook endpoint {endpoint_id}")
    return _delivery(store, endpoint_id, delivery_id)
