"""The one clock: everything that needs "now" calls `utcnow()` (tests freeze it)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC with a `Z` suffix (second precision)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
