"""The one factory that turns `TALLY_DATABASE` into a storage backend.

Nothing else names a backend class: `api/` and `reports/` see the protocols of ingest/storage/contract.py.
A file path is the embedded DuckDB database (one `tally serve`); a `postgresql://` URL (with
libpq's environment for what it leaves out) is the shared PostgreSQL database (several replicas).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from ingest.progress import Progress, RowsApplied
from ingest.storage.contract import BackupSummary, Store
from ingest.storage.duckdb.backup import check_target
from ingest.storage.duckdb.store import DatabaseInUse, DuckStore, index_keys

DEFAULT_DATABASE = "./tally.duckdb"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

__all__ = [
    "DEFAULT_DATABASE",
    "DatabaseInUse",
    "SourceUnavailable",
    "backup_offline",
    "describe",
    "is_shared",
    "open_store",
    "prepare",
]


def is_shared(database: str | Path) -> bool:
    """Whether `database` names a PostgreSQL database (rather than an embedded file)."""
    return str(database).startswith(POSTGRES_SCHEMES)


def describe(database: str | Path) -> str:
    """`database` as messages and logs may show it: a URL without its password."""
    if is_shared(database):
        from ingest.storage.postgres.conn import describe as describe_url

        return describe_url(str(database))
    return str(database)


def open_store(
    database: str | Path,
    key_cache_mb: int = 64,
    memory_mb: int = 512,
    on_progress: RowsApplied | None = None,
    engine_dir: str | None = None,
    credential_cache: int = 4096,
    partitions: int = 1,
) -> Store:
    """The backend for `database`: a file path opens the embedded DuckDB file (created when
    missing, migrated, its key index caught up), its memory bounded by `memory_mb` and the key
    index's cache by `key_cache_mb`. `DatabaseInUse` when another store holds it. A
    `postgresql://` URL connects to that database and migrates it; the reconciler's working copy
    lives in `engine_dir` (a temporary directory when None), bounded by `memory_mb`, and the
    track endpoints keep up to `credential_cache` program keys in memory; its programs are
    reconciled in `partitions` partitions (ingest/storage/partitions.py; the embedded file is
    reconciled whole)."""
    if is_shared(database):
        from ingest.storage.postgres.store import PgStore

        return PgStore(
            str(database),
            memory_mb=memory_mb,
            engine_dir=engine_dir,
            credential_cache=credential_cache,
            partitions=partitions,
        )
    return DuckStore(database, key_cache_mb, on_progress, memory_mb)


def prepare(database: str | Path, on_progress: RowsApplied | None = None) -> int:
    """`tally migrate`'s second half: bring what the backend derives from the log up to date
    offline (the embedded key index; a shared database keeps its keyed tables as it goes),
    so that `tally serve` starts at once. Returns the raw rows applied."""
    if is_shared(database):
        return 0
    return index_keys(database, on_progress)


class SourceUnavailable(Exception):
    """Raised by `backup_offline` when the database to copy cannot be opened (a server holds it,
    it is not a database, or it is PostgreSQL's to back up)."""


def backup_offline(database: str, output: str, progress: Progress) -> BackupSummary:
    """`tally backup` without a server: copy a database no server has open (`database` must
    exist); its journal is replayed first, as `tally serve`'s start-up does, then the copy is
    made as ingest/storage/duckdb/backup.py says. Raises `BackupTargetUnusable`, or
    `SourceUnavailable` when the file cannot be opened (a server holds it)."""
    if is_shared(database):
        raise SourceUnavailable(
            "a PostgreSQL database is backed up with pg_dump (docs/operations.md); tally backup copies"
            " the embedded database only"
        )
    target = check_target(output, database)
    try:
        store = DuckStore(database)
    except (duckdb.Error, DatabaseInUse) as exc:
        raise SourceUnavailable(f"cannot open {database} ({str(exc).splitlines()[0]})") from exc
    try:
        return store.backup(str(target), lambda: None, progress)
    finally:
        store.close()
