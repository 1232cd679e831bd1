"""The operator's list of unroutable processor events (`GET /api/v1/operator/unroutable`).

Rows come from `rc_unroutable`, as of the last reconcile run (reconcile/unroutable.py says what
is in it and why). Newest first: by first receive time, then event id, both descending. Pages are
keyed, not counted: a page's `next_cursor` is an opaque token naming the last row it showed, and
the next page starts strictly after it, so events received meanwhile never shift a page. The
token is URL-safe base64 of JSON and is not a secret; a token that does not decode is a 422.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ingest.storage.contract import Reader

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
TABLE = "rc_unroutable"
# rc_unroutable column -> the listing's field.
FIELDS = {
    "event_id": "event_id",
    "event_type": "type",
    "stripe_account": "account",
    "reason": "reason",
    "received_at": "received_at",
    "routes_to": "routes_to",
    "meta_program_id": "metadata_program_id",
    "object_id": "object_id",
    "amount": "amount",
    "currency": "currency",
    "test_mode": "test_mode",
    "occurred_at": "occurred_at",
}


class BadCursor(ValueError):
    """Raised by `decode` when a cursor is not one this listing made."""


@dataclass(frozen=True)
class Position:
    """Where a page ended: the last row's receive time and event id ('' for none)."""

    received_at: datetime
    event_id: str


def encode(position: Position) -> str:
    text = json.dumps({"r": position.received_at.astimezone(UTC).isoformat(), "e": position.event_id})
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(cursor: str) -> Position:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        found = json.loads(raw)
        moment = datetime.fromisoformat(found["r"])
        event_id = found["e"]
    except (binascii.Error, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise BadCursor("not a cursor this listing gave (pass next_cursor as it came)") from exc
    if moment.tzinfo is None or not isinstance(event_id, str):
        raise BadCursor("not a cursor this listing gave (pass next_cursor as it came)")
    return Position(moment.astimezone(UTC), event_id)


def page(db: Reader, limit: int, after: Position | None) -> dict[str, Any]:
    """One page of at most `limit` events after `after` (None: the newest), and the cursor of
    the next page (None on the last)."""
    if not db.table_exists(TABLE):
        return {"events": [], "next_cursor": None}
    columns = ", ".join(f"{column} AS {name}" for column, name in FIELDS.items())
    where, params = "", list[Any]()
    if after is not None:
        where = " WHERE received_at < ? OR (received_at = ? AND coalesce(event_id, '') < ?)"
        params = [after.received_at, after.received_at, after.event_id]
    rows = db.dicts(
        f"SELECT {columns} FROM {TABLE}{where}"
        " ORDER BY received_at DESC, coalesce(event_id, '') DESC LIMIT ?",
        [*params, limit + 1],
    )
    events = [{**row, "test_mode": bool(row["test_mode"])} for row in rows[:limit]]
    more = len(rows) > limit
    last = events[-1] if events else None
    cursor = encode(Position(last["received_at"], last["event_id"] or "")) if more and last else None
    return {"events": events, "next_cursor": cursor}
