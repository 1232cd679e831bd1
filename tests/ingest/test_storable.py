"""`storable` answers from the values a row holds (the writer checks every row it appends) exactly
what checking every column of the raw log says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.storage.schema import _RAW_CHECKS, RAW_EVENT_FIELDS, storable

_INT64 = 2**63


def _every_column(row: dict[str, Any]) -> list[dict[str, str]]:
    """The rule, column by column (what `storable` answered before it looked only at the row)."""
    problems = []
    for name, kind, nullable in _RAW_CHECKS:
        value = row.get(name)
        if value is None:
            fits = nullable
        elif kind == "BIGINT":
            fits = type(value) is int and -_INT64 <= value < _INT64
        elif kind == "VARCHAR":
            fits = (
                type(value) is str
                and "\x00" not in value
                and not any(0xD800 <= ord(c) < 0xE000 for c in value)
            )
        elif kind == "BOOLEAN":
            fits = type(value) is bool
        else:
            fits = isinstance(value, datetime) and value.tzinfo is not None
        if not fits:
            problems.append({"field": name, "message": f"cannot be stored as {kind}"})
    return problems


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.text(max_size=8),
    st.sampled_from(["ok", "a\x00b", "\ud800", "é", ""]),
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=5))])),
    st.datetimes(),  # naive
    st.floats(allow_nan=False),
)
NAMES = st.sampled_from([*RAW_EVENT_FIELDS, "not_a_column"])
BASE = {
    "seq": 1,
    "received_at": datetime(2026, 11, 1, tzinfo=UTC),
    "source": "track",
    "kind": "sale",
    "outcome": "accepted",
    "test_mode": False,
    "body": "{}",
    "headers": "{}",
}


@settings(max_examples=400, deadline=None)
@given(changes=st.dictionaries(NAMES, VALUES, max_size=8), start_full=st.booleans())
def test_storable_is_the_column_by_column_rule(changes: dict[str, Any], start_full: bool) -> None:
    row = {**(BASE if start_full else {}), **changes}
    assert storable(row) == _every_column(row)


def test_a_track_sale_row_fits() -> None:
    row = {**BASE, "program_id": "prog_1", "transaction_id": "in_1", "amount": 4900, "currency": "usd"}
    assert storable(row) == [] == _every_column(row)
