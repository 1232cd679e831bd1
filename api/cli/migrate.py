"""`tally migrate`: bring the database's schema up to this release (ingest/migrations.py).

`tally serve` applies pending migrations itself at start; `migrate` does it on its own, without
serving, and says what it did: before an upgrade is rolled out, or to check a backup's version.
`--status` on an embedded file a running server holds reads the version through that server
(`GET /readyz`), since the file itself can only be opened by its one holder."""

from __future__ import annotations

import fcntl
import os

import click
import httpx

from api.cli.client import server_url
from api.cli.errors import CliError
from api.cli.options import examples, url_option
from api.cli.output import Progress
from ingest.storage import migrations
from ingest.storage.factory import DEFAULT_DATABASE, DatabaseInUse, describe, is_shared, prepare


@click.command(
    short_help="apply pending schema migrations (a DuckDB file no server holds, or a PostgreSQL database)",
    epilog=examples(
        "tally migrate --database /srv/tally/tally.db",
        "tally migrate --database /srv/tally/tally.db --status --url http://127.0.0.1:8000",
    ),
)
@click.option(
    "--database",
    metavar="PATH|URL",
    help=f"DuckDB file or postgresql:// URL (default: TALLY_DATABASE, else {DEFAULT_DATABASE})",
)
@click.option("--status", is_flag=True, help="only show the version and what is pending; change nothing")
@url_option()
def migrate(database: str | None, status: bool, url: str | None) -> None:
    """Bring the database's schema up to this release. `tally serve` applies pending migrations
    itself at start; `migrate` does it on its own, without serving. With --status, on a file a
    running server holds, the version is read through that server (--url)."""
    path = database or os.environ.get("TALLY_DATABASE") or DEFAULT_DATABASE
    if status:
        _status(path, url)
        return
    holder = None if is_shared(path) else _holder(path)
    if holder is not None:
        raise CliError(
            f"{path} is held by process {holder} (is a `tally serve` running on it? it applies pending "
            "migrations itself when it starts; stop it to migrate the file here)"
        )
    step = lambda m: print(f"applying {m.version}: {m.description}", flush=True)  # noqa: E731
    try:
        if is_shared(path):
            from ingest.storage.postgres.conn import migrate as migrate_shared  # psycopg: only for PostgreSQL

            before, applied = migrate_shared(path, on_step=step)
        else:
            before, applied = migrations.migrate_file(path, on_step=step)
    except (migrations.DatabaseTooNew, migrations.MigrationFailed) as exc:
        raise CliError(str(exc)) from None
    name = describe(path)
    if applied:
        print(f"{name}: schema version {before} -> {applied[-1].version}")
    else:
        print(f"{name}: schema version {before}, up to date")
    if not is_shared(path):  # a shared database keeps its keyed tables as it goes
        _index_keys(path)


def _index_keys(path: str) -> None:
    """Bring the key index beside the database up to date (the one-time part of an upgrade
    from a release without it: a replay of the whole log), with progress, so that `tally serve`
    starts at once afterwards."""
    with Progress("key index") as progress:
        try:
            applied = prepare(path, lambda done, total: progress.update("key index", done, total))
        except DatabaseInUse as exc:
            raise CliError(str(exc)) from None
    print(f"{path}: key index up to date ({applied} raw rows applied)")


def _holder(path: str) -> str | None:
    """The process holding the embedded database at `path` (the pid in its `.lock`, which every
    store holds for its lifetime: ingest/duckdb_store.py), or None when none does. Looked at
    with a shared lock, taken and let go at once; nothing is written."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _print_status(name: str, version: int, source: str = "") -> None:
    print(f"{name}: schema version {version} (this tally knows up to {migrations.LATEST}){source}")
    for m in migrations.MIGRATIONS:
        if m.version > version:
            print(f"pending {m.version}: {m.description}")


def _status(path: str, url: str | None) -> None:
    if not is_shared(path) and (holder := _holder(path)) is not None:
        _status_through_server(path, holder, server_url(url))
        return
    try:
        if is_shared(path):
            from ingest.storage.postgres.conn import migration_status  # psycopg: only for PostgreSQL

            version, _ = migration_status(path)
        else:
            version, _ = migrations.status_of_file(path)
    except (migrations.DatabaseTooNew, migrations.MigrationFailed) as exc:
        raise CliError(str(exc)) from None
    _print_status(describe(path), version)


def _status_through_server(path: str, holder: str, url: str) -> None:
    """`--status` of a file a running server holds: its version as that server reports it."""
    held = f"{path} is held by process {holder} (a running tally serve)"
    try:
        response = httpx.get(f"{url}/readyz", timeout=10)
    except (httpx.HTTPError, httpx.InvalidURL):
        raise CliError(
            f"{held} and {url} does not answer: pass that server's --url (or TALLY_URL) to read the "
            "version through it, or stop it and run this again"
        ) from None
    try:
        version = int(response.json()["data"]["schema_version"])
    except (ValueError, KeyError, TypeError):
        raise CliError(
            f"{held}, and {url}/readyz answered {response.status_code} without a schema version "
            "(not ready, or not that server?)"
        ) from None
    _print_status(path, version, f"; read through {url}, the server holding it (process {holder})")
