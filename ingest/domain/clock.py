"""The one clock: everything that needs "now" calls `utcnow()` (tests freeze it)."""

from __future__ import annotations

from datetime import UTC, datetime

_LATEST = datetime.max.replace(tzinfo=UTC)
_EARLIEST = datetime.min.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    """Format a datetime as RFC 3339 UTC with a `Z` suffix (second precision), always four year
    digits. A naive datetime is taken to be UTC already (tally never makes one; a Polars frame
    without a time zone may). Inputs are bounded (`ingest/domain/bounds.py`), so a time whose UTC value
    falls outside years 1..9999 can only be an old stored one: it is shown as the nearest
    representable second rather than failing the response."""
    if moment.tzinfo is None:
        utc = moment
    else:
        try:
            utc = moment.astimezone(UTC)
        except OverflowError:
            utc = _LATEST if moment.year > 1 else _EARLIEST
    return f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}Z"
