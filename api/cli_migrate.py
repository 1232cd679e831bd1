"""`tally migrate`: bring the database's schema up to this release (ingest/migrations.py).

`tally serve` applies pending migrations itself at start; `migrate` does it on its own, without
serving, and says what it did: before an upgrade is rolled out, or to check a backup's version.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from api.cli_http import CliError
from api.cli_ops import progress_bar
from ingest.storage import migrations
from ingest.storage.factory import DEFAULT_DATABASE, DatabaseInUse, describe, is_shared, prepare


def cmd_migrate(args: argparse.Namespace) -> None:
    path = args.database or os.environ.get("TALLY_DATABASE") or DEFAULT_DATABASE
    if args.status:
        _status(path)
        return
    step = lambda m: print(f"applying {m.version}: {m.description}", flush=True)  # noqa: E731
    try:
        if is_shared(path):
            from ingest.storage.postgres.conn import migrate

            before, applied = migrate(path, on_step=step)
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
    with progress_bar() as bar:
        task = bar.add_task("key index", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, 1))

        try:
            applied = prepare(path, progress)
        except DatabaseInUse as exc:
            raise CliError(str(exc)) from None
        bar.update(task, completed=applied, total=max(applied, 1))
    print(f"{path}: key index up to date ({applied} raw rows applied)")


def _status(path: str) -> None:
    try:
        if is_shared(path):
            from ingest.storage.postgres.conn import migration_status

            version, todo = migration_status(path)
        else:
            version, todo = migrations.status_of_file(path)
    except (migrations.DatabaseTooNew, migrations.MigrationFailed) as exc:
        raise CliError(str(exc)) from None
    print(f"{describe(path)}: schema version {version} (this tally knows up to {migrations.LATEST})")
    for m in todo:
        print(f"pending {m.version}: {m.description}")


def add_migrate(sub: Any) -> None:
    migrate = sub.add_parser(
        "migrate",
        help="apply pending schema migrations (a DuckDB file no server holds, or a PostgreSQL database)",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="example: tally migrate --database /srv/tally/tally.db",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    migrate.add_argument(
        "--database",
        help=f"DuckDB file or postgresql:// URL (default: TALLY_DATABASE, else {DEFAULT_DATABASE})",
    )
    migrate.add_argument(
        "--status", action="store_true", help="only show the version and what is pending; change nothing"
    )
    migrate.set_defaults(func=cmd_migrate)
