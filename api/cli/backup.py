"""`tally backup`: a consistent copy of the database, from a running server (over HTTP, with the
operator token) or, with `--database`, from a file no server has open."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from api.cli.client import clean_token, operator_target, server_url, stream, streamed_result
from api.cli.errors import CliError
from api.cli.options import examples, url_option
from api.cli.output import Progress
from ingest.domain.errors import TallyError
from ingest.storage.factory import SourceUnavailable, backup_offline, is_shared

RESTORE = """Restore: stop the server and start it on the copy (tally serve --database COPY), or move the
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


def _online(output: str, url: str | None, token_stdin: bool) -> dict[str, Any]:
    if token_stdin:
        target, token = server_url(url), clean_token(sys.stdin.readline(), "standard input (--token-stdin)")
    else:
        target, token = operator_target(url)
    body = {"path": str(Path(output).absolute())}
    with Progress("backup") as progress:
        return streamed_result(
            stream("POST", "/api/v1/operator/backup", url=target, token=token, body=body), progress
        )


def _offline(database: str, output: str) -> dict[str, Any]:
    if is_shared(database):  # (the URL may hold a password: never echoed)
        raise CliError(
            "a PostgreSQL database is backed up with pg_dump (docs/operations.md); tally backup copies"
            " the embedded database only"
        )
    if not Path(database).is_file():
        raise CliError(f"database {database} does not exist")
    with Progress("backup") as progress:
        try:
            summary = backup_offline(database, str(Path(output).absolute()), progress.update)
        except TallyError as exc:
            raise CliError(exc.message) from None
        except SourceUnavailable as exc:
            raise CliError(
                f"{exc}; when a server has it open, run tally backup without --database to copy it"
                " through the server"
            ) from None
    return vars(summary)


@click.command(
    short_help="write a consistent copy of the database (operator)",
    epilog=examples(
        "TALLY_OPERATOR_TOKEN=... tally backup --output /var/backups/tally-2026-11-23.db",
        "tally backup --token-stdin --url http://127.0.0.1:8000 -o /srv/backups/t.db < operator-token",
        "tally backup --database data/tally.db --output /tmp/copy.db    # no server running",
        after=RESTORE,
    ),
)
@click.option(
    "-o",
    "--output",
    required=True,
    metavar="PATH",
    help="where the copy is written (a new file; through a server, a path on the server's machine: "
    "relative paths are made absolute here)",
)
@url_option(operator=True)
@click.option(
    "--token-stdin",
    is_flag=True,
    help="read the operator token from standard input (default: TALLY_OPERATOR_TOKEN)",
)
@click.option(
    "--database",
    metavar="PATH",
    help="copy this DuckDB file directly, without a server (it must not be open in one)",
)
def backup(output: str, url: str | None, token_stdin: bool, database: str | None) -> None:
    """Write a consistent copy of the database, with every acknowledged write (those only in the
    write-ahead journal too), while the server runs (through POST /api/v1/operator/backup, with
    the operator token) or, with --database, from a file no server has open. The copy is one
    DuckDB file that tally serve starts on."""
    _report(_offline(database, output) if database else _online(output, url, token_stdin))
