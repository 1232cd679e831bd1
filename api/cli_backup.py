"""`tally backup`: a consistent copy of the database, from a running server (over HTTP, with the
operator token) or, with `--database`, from a file no server has open."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from api.cli_http import CliError, operator_target, stream
from api.cli_ops import progress_bar
from ingest.domain.errors import TallyError
from ingest.storage.contract import BackupSummary
from ingest.storage.factory import SourceUnavailable, backup_offline, is_shared

DESCRIPTION = """Write a consistent copy of the database, with every acknowledged write (those only in
the write-ahead journal too), while the server runs (through POST /api/v1/operator/backup, with
the operator token) or, with --database, from a file no server has open. The copy is one DuckDB
file that tally serve starts on."""

EPILOG = """examples:
  TALLY_OPERATOR_TOKEN=... tally backup --output /var/backups/tally-2026-11-23.db
  tally backup --token-stdin --url http://127.0.0.1:8000 -o /srv/backups/t.db < operator-token
  tally backup --database data/tally.db --output /tmp/copy.db    # no server running

Restore: stop the server and start it on the copy (tally serve --database COPY), or move the
copy into place as the database file. See docs/operations.md."""


def _report(data: dict[str, Any]) -> None:
    rows = data.get("rows", {})
    print(
        f"wrote {data['path']}: {data['bytes']} bytes, {data['tables']} tables, "
        f"{rows.get('raw_events', 0)} raw events (up to seq {data['last_seq']}, journal batch "
        f"{data['last_batch']}) in {data['duration_ms']} ms"
    )
    if data.get("set_aside"):
        print(
            f"warning: {data['set_aside']} journal batch(es) the database refused are in "
            "<database>.journal/set-aside/ and not in the copy; keep that folder with it",
            file=sys.stderr,
        )


def _online(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    if args.token_stdin:
        token = sys.stdin.readline().strip()
        if not token:
            raise CliError("--token-stdin: no operator token on standard input")
        os.environ["TALLY_OPERATOR_TOKEN"] = token
    url, token = operator_target(args.url)
    summary: dict[str, Any] | None = None
    body = {"path": str(Path(args.output).absolute())}
    with progress_bar(console) as bar:
        task = bar.add_task("backup", total=1)
        for line in stream("POST", "/api/v1/operator/backup", url=url, token=token, body=body):
            if "progress" in line:
                p = line["progress"]
                bar.update(task, description=p["stage"], completed=p["done"], total=max(1, p["total"]))
            elif "error" in line:
                raise CliError(f"{line['error']['code']}: {line['error']['message']}")
            elif "data" in line:
                summary = line["data"]
                bar.update(task, description="done", completed=1, total=1)
    if summary is None:
        raise CliError("the server closed the stream without a result")
    return summary


def _offline(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    if is_shared(args.database):  # (the URL may hold a password: never echoed)
        raise CliError(
            "a PostgreSQL database is backed up with pg_dump (docs/operations.md); tally backup copies"
            " the embedded database only"
        )
    if not Path(args.database).is_file():
        raise CliError(f"database {args.database} does not exist")
    with progress_bar(console) as bar:
        task = bar.add_task("backup", total=1)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=max(1, total))

        try:
            summary: BackupSummary = backup_offline(
                args.database, str(Path(args.output).absolute()), progress
            )
        except TallyError as exc:
            raise CliError(exc.message) from None
        except SourceUnavailable as exc:
            raise CliError(
                f"{exc}; when a server has it open, run tally backup without --database to copy it"
                " through the server"
            ) from None
        bar.update(task, description="done", completed=1, total=1)
    return vars(summary)


def cmd_backup(args: argparse.Namespace) -> None:
    console = Console(stderr=True)
    _report(_offline(args, console) if args.database else _online(args, console))


def add_backup(sub: Any) -> None:
    backup = sub.add_parser(
        "backup",
        help="write a consistent copy of the database (operator)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    backup.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATH",
        help="where the copy is written (a new file; through a server, a path on the server's "
        "machine: relative paths are made absolute here)",
    )
    backup.add_argument(
        "--url", help="the server (default: the login's URL, else TALLY_BASE_URL, else http://127.0.0.1:8000)"
    )
    backup.add_argument(
        "--token-stdin",
        action="store_true",
        help="read the operator token from standard input (default: TALLY_OPERATOR_TOKEN)",
    )
    backup.add_argument(
        "--database",
        metavar="PATH",
        help="copy this DuckDB file directly, without a server (it must not be open in one)",
    )
    backup.set_defaults(func=cmd_backup)
