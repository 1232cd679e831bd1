"""A consistent copy of the embedded database, taken while the server runs (or offline).

The running server owns the DuckDB file, so the copy is made inside it (`POST
/api/v1/operator/backup`, `tally backup`):

1. The writer is synced with a flush (`Writer.sync_blocking`): every batch acknowledged so far,
   including the ones only in the write-ahead journal (`<database>.journal/`), is copied into
   DuckDB before the sync returns.
2. A read transaction is opened and pinned on the database right after. DuckDB's committed state
   is always a prefix of whole journal batches (the copier inserts whole batches, in order, in
   one transaction each; a control-plane commit inserts every pending batch first), so the
   snapshot holds every acknowledged row up to the sync and never half a group.
3. The copy file is attached, the schema copied (`COPY FROM DATABASE ... (SCHEMA)`: tables,
   constraints, sequences, views), then every table's rows inserted from the pinned snapshot, table
   by table (the progress shown). Writes keep flowing meanwhile; rows acknowledged after the
   snapshot are simply not in this copy.
4. The copy is checkpointed and detached (so it has no `.wal` of its own), fsynced, and renamed
   from `<path>.partial` into place. It depends on no journal: its `journal_state` says which
   batches it holds, and a server started on it begins a fresh journal after them.

Not in the copy: `<database>.mirror/` (the reconciler's Parquet mirror, written again when
missing), `<database>.rows` (its row store, made anew by the next run) and
`<database>.journal/set-aside/` (batches the database refused; counted in the result so an
operator copies that folder by hand when there is one).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

from ingest.domain.errors import TallyError
from ingest.progress import Progress
from ingest.storage.contract import BackupSummary, BackupTargetUnusable
from ingest.storage.durable import fsync_path
from ingest.storage.private import FILE_MODE, restrict_umask

_counter = itertools.count(1)
_one_at_a_time = threading.Lock()


class _NotOurs(Exception):
    """Raised by `copy_database` when the copy file could not be created: nothing of it is ours."""


# The longest name the copy is written under: `<name>.partial`, and DuckDB's `.wal` beside it.
_LONGEST_SUFFIX = ".partial.wal"


def _partial(target: Path) -> Path:
    return target.with_name(target.name + ".partial")


def check_target(path: str, database: str) -> Path:
    """The copy's path, when it can take one: absolute, not there yet, in an existing writable
    directory, with a file name short enough for `<name>.partial.wal`, and not the database or
    anything of it. A `<path>.partial` left by a backup that was killed does not count (the
    copy replaces it; `_claim_partial`). Raises `BackupTargetUnusable`."""
    try:
        return _check_target(path, database)
    except OSError as exc:  # a path the system refuses (too long, a loop, no permission)
        raise BackupTargetUnusable(f"path cannot be used: {exc.strerror or exc}") from None


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _check_target(path: str, database: str) -> Path:
    if not path or "\x00" in path:
        raise BackupTargetUnusable("path must be a file path")
    target = Path(path)
    if not target.is_absolute():
        raise BackupTargetUnusable("path must be absolute (a path on the server's machine)")
    if target.name in ("", ".", "..") or path.endswith("/"):
        raise BackupTargetUnusable("path must name a file, not a directory")
    source = Path(database).resolve()
    try:
        resolved = target.parent.resolve() / target.name
    except (OSError, RuntimeError) as exc:
        raise BackupTargetUnusable(f"path cannot be resolved: {exc.__class__.__name__}") from None
    if resolved == source or str(resolved).startswith(
        (f"{source}.journal", f"{source}.mirror", f"{source}.wal")
    ):
        raise BackupTargetUnusable("path must not be the database itself or one of its files")
    if not resolved.parent.is_dir():
        raise BackupTargetUnusable(f"directory {target.parent} does not exist")
    longest = _name_max(resolved.parent) - len(_LONGEST_SUFFIX)
    if len(os.fsencode(target.name)) > longest:
        raise BackupTargetUnusable(
            f"the file name is {len(os.fsencode(target.name))} bytes; it may have at most {longest}"
            f" (the copy is written as <name>{_LONGEST_SUFFIX} first)"
        )
    if not os.access(resolved.parent, os.W_OK | os.X_OK):
        raise BackupTargetUnusable(f"directory {target.parent} is not writable by the server")
    if resolved.exists() or resolved.is_symlink():
        raise BackupTargetUnusable(f"{resolved} already exists; tally never overwrites a file")
    for taken in (_partial(resolved), Path(f"{_partial(resolved)}.wal")):
        if taken.is_symlink() or (taken.exists() and not taken.is_file()):
            raise BackupTargetUnusable(f"{taken} is in the way and is not a file tally left")
    return resolved


def _held(partial: Path) -> bool:
    """Whether another process has the copy file `partial` open: DuckDB holds a lock on a
    database file for as long as a process has it open (an ATTACH included), and the system
    drops it when that process ends. Backups in this process run one at a time."""
    try:
        fd = os.open(partial, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise BackupTargetUnusable(f"{partial} is in the way: {exc.strerror or exc}") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # (drops the lock just taken)
    return False


def _claim_partial(partial: Path) -> None:
    """Make way for the copy at `partial`: a `<path>.partial` (and its `.wal`) left by a backup
    that was killed is removed; one a running backup is writing is refused."""
    if _held(partial):
        raise BackupTargetUnusable(
            f"a backup to {partial.with_suffix('')} is being written by another process; try again"
            " when it is done"
        )
    for stale in (partial, Path(f"{partial}.wal")):
        try:
            stale.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise BackupTargetUnusable(f"cannot remove the stale {stale}: {exc.strerror or exc}") from None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def copy_database(
    cur: duckdb.DuckDBPyConnection,
    target: Path,
    pin: Callable[[], None],
    progress: Progress,
    set_aside: int = 0,
) -> BackupSummary:
    """Copy the database of `cur` (a cursor of its own, not in a transaction) to `target`.

    `pin()` is called after the copy file is attached and before the snapshot is opened: it
    makes every acknowledged write visible in the database (the writer's sync), so the
    snapshot opened right after holds them. Raises `BackupTargetUnusable` when the copy cannot
    be written (its disk full, the directory gone); nothing is left at `target` then."""
    started = time.monotonic()
    partial = _partial(target)
    alias = f"tally_backup_{os.getpid()}_{next(_counter)}"
    restrict_umask()  # DuckDB creates the copy (and its WAL): 0600, whatever the umask
    with _one_at_a_time:
        _claim_partial(partial)  # (refused: what is there is another backup's, left alone)
        try:
            row = cur.execute("SELECT current_database()").fetchone()
            source = str(row[0]) if row else "main"
            try:
                cur.execute(f"ATTACH {_literal(str(partial))} AS {alias}")
            except duckdb.Error as exc:
                if _held(partial):  # another backup created it meanwhile: it is that one's
                    raise _NotOurs(f"cannot create {partial}: {exc}") from None
                raise BackupTargetUnusable(f"cannot create {partial}: {exc}") from None
            try:
                progress("syncing the journal", 0, 1)
                pin()
                cur.execute("BEGIN TRANSACTION")
                # The first read of the database fixes this transaction's snapshot.
                tables = [
                    str(r[0])
                    for r in cur.execute(
                        "SELECT table_name FROM duckdb_tables() WHERE database_name = ?"
                        " AND schema_name = 'main' AND NOT temporary ORDER BY table_name",
                        [source],
                    ).fetchall()
                ]
                summary = BackupSummary(str(target), 0, len(tables), set_aside=set_aside)
                cur.execute(f"COPY FROM DATABASE {_quote(source)} TO {alias} (SCHEMA)")
                for done, table in enumerate(tables):
                    progress(f"copying {table}", done, len(tables))
                    cur.execute(
                        f"INSERT INTO {alias}.main.{_quote(table)}"
                        f" SELECT * FROM {_quote(source)}.main.{_quote(table)}"
                    )
                    counted = cur.execute(f"SELECT count(*) FROM {alias}.main.{_quote(table)}").fetchone()
                    summary.rows[table] = int(counted[0]) if counted else 0
                if "raw_events" in tables:
                    got = cur.execute(f"SELECT coalesce(max(seq), 0) FROM {alias}.main.raw_events").fetchone()
                    summary.last_seq = int(got[0]) if got else 0
                if "journal_state" in tables:
                    got = cur.execute(f"SELECT max(last_batch) FROM {alias}.main.journal_state").fetchone()
                    summary.last_batch = int(got[0]) if got and got[0] is not None else 0
                cur.execute("COMMIT")
                progress("writing the copy to disk", len(tables), len(tables))
                cur.execute(f"CHECKPOINT {alias}")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
                raise
            finally:
                with contextlib.suppress(duckdb.Error):
                    cur.execute(f"DETACH {alias}")
            if Path(f"{partial}.wal").exists():
                raise BackupTargetUnusable(f"the copy at {partial} was not checkpointed completely")
            fsync_path(partial)
            if target.exists():
                raise BackupTargetUnusable(f"{target} appeared while the copy was written; it was left alone")
            partial.chmod(FILE_MODE)
            partial.rename(target)
            fsync_path(target.parent, directory=True)
        except _NotOurs as exc:
            raise BackupTargetUnusable(str(exc)) from None
        except TallyError:
            _remove(partial, Path(f"{partial}.wal"))
            raise
        except (OSError, duckdb.Error) as exc:
            _remove(partial, Path(f"{partial}.wal"))
            if isinstance(exc, duckdb.Error) and not isinstance(exc, duckdb.IOException):
                raise
            raise BackupTargetUnusable(f"could not write the copy at {target}: {exc}") from None
    summary.bytes = target.stat().st_size
    summary.duration_ms = int((time.monotonic() - started) * 1000)
    return summary


def set_aside_count(database: str) -> int:
    """Journal batches the database refused, kept in `<database>.journal/set-aside/`."""
    return len(list(Path(f"{database}.journal/set-aside").glob("*.json")))
