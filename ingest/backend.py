"""The one factory that turns `TALLY_DATABASE` into a storage backend.

Nothing else names a backend class: `api/` and `reports/` see the protocols of ingest/store.py.
"""

from __future__ import annotations

from pathlib import Path

from ingest.duckdb_store import DatabaseInUse, DuckStore, index_keys
from ingest.hotkeys import Progress
from ingest.store import Store

DEFAULT_DATABASE = "./tally.duckdb"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

__all__ = ["DEFAULT_DATABASE", "BackendUnavailable", "DatabaseInUse", "open_store", "prepare"]


class BackendUnavailable(Exception):
    """`TALLY_DATABASE` names a backend this build does not have."""


def _embedded(database: str | Path) -> Path | str:
    if str(database).startswith(POSTGRES_SCHEMES):
        raise BackendUnavailable(
            "the PostgreSQL backend is not available yet; TALLY_DATABASE must be a file path"
        )
    return database


def open_store(
    database: str | Path, key_cache_mb: int = 64, memory_mb: int = 512, on_progress: Progress | None = None
) -> Store:
    """The backend for `database`: a file path opens the embedded DuckDB file (created when
    missing, migrated, its key index caught up), its memory bounded by `memory_mb` and the key
    index's cache by `key_cache_mb`. `DatabaseInUse` when another store holds it."""
    return DuckStore(_embedded(database), key_cache_mb, on_progress, memory_mb)


def prepare(database: str | Path, on_progress: Progress | None = None) -> int:
    """`tally migrate`'s second half: bring what the backend derives from the log up to date
    offline (the embedded key index), so that `tally serve` starts at once. Returns the raw
    rows applied."""
    return index_keys(_embedded(database), on_progress)
