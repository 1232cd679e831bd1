"""ingest/storage/duckdb/copier.py: a journal written by the release before a trailing raw-log
column was added (migration 8's `promo_code`) is copied in with that column empty."""

from __future__ import annotations

from datetime import UTC, datetime

from ingest.storage.duckdb.copier import RAW_SCHEMA, revive_rows
from ingest.storage.schema import RAW_EVENT_FIELDS


def test_a_row_journaled_before_a_column_was_added_gets_it_empty() -> None:
    old = [None] * (len(RAW_EVENT_FIELDS) - 1)
    old[RAW_EVENT_FIELDS.index("received_at")] = "2026-01-01T00:00:00+00:00"
    old[RAW_EVENT_FIELDS.index("kind")] = "click"
    (row,) = revive_rows([old], RAW_SCHEMA)
    assert len(row) == len(RAW_EVENT_FIELDS) == len(RAW_SCHEMA)
    assert row[RAW_EVENT_FIELDS.index("promo_code")] is None
    assert row[RAW_EVENT_FIELDS.index("received_at")] == datetime(2026, 1, 1, tzinfo=UTC)
    current = [None] * len(RAW_EVENT_FIELDS)
    current[RAW_EVENT_FIELDS.index("promo_code")] = "SAVE10"
    assert revive_rows([current], RAW_SCHEMA)[0][RAW_EVENT_FIELDS.index("promo_code")] == "SAVE10"
