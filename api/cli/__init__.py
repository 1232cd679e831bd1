"""The `tally` command line, on click: `serve` runs the server; every other command is a client
of a running server over HTTP (account commands with the account token, operator commands with
the operator token) and never opens its database, except `migrate` and `backup --database`,
which work on a file no server holds.

One module per group of commands (auth, programs, books, finance, payouts, partners, webhooks,
operations, stripe, migrate, backup, serve, completion); what they share: client.py (which server, which
credential, the calls), output.py (tables, --json, progress), options.py, errors.py (exit
codes)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import click

from api.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, CliError
from api.cli.options import examples
from ingest.storage import private
from reconcile import allocator

# Each command, from the module that defines it; a module is imported only when its command
# runs (or help lists it), so `tally programs list` does not load the database's modules.
COMMANDS = {
    "serve": "api.cli.serve:serve",
    "login": "api.cli.auth:login",
    "logout": "api.cli.auth:logout",
    "auth": "api.cli.auth:auth",
    "programs": "api.cli.programs:programs",
    "keys": "api.cli.programs:keys",
    "reconcile": "api.cli.operations:reconcile",
    "unroutable": "api.cli.operations:unroutable",
    "demo": "api.cli.operations:demo",
    "backfill": "api.cli.books:backfill",
    "report": "api.cli.books:report",
    "explain": "api.cli.books:explain",
    "payouts": "api.cli.payouts:payouts",
    "partners": "api.cli.partners:partners",
    "webhooks": "api.cli.webhooks:webhooks",
    "periods": "api.cli.finance:periods",
    "fixes": "api.cli.finance:fixes",
    "commissions": "api.cli.finance:commissions",
    "migrate": "api.cli.migrate:migrate",
    "backup": "api.cli.backup:backup",
    "stripe": "api.cli.stripe:stripe",
    "completion": "api.cli.completion:completion",
}


def version() -> str:
    try:
        return metadata.version("tally")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


ENVIRONMENT = """environment:
  TALLY_ACCOUNT_TOKEN   account token for account commands instead of the stored login (and `tally login`)
  TALLY_URL             the server account commands (and --url) talk to, instead of the login's
  TALLY_OPERATOR_TOKEN  operator token for `tally reconcile`, `unroutable`, `backup` and `demo`
  TALLY_BASE_URL        the server when there is no TALLY_URL and no login
  TALLY_STRIPE_WEBHOOK_SECRETS  the secret `tally stripe trigger` and `tally demo` sign with
  XDG_CONFIG_HOME       where `tally login` stores its credential (default ~/.config/tally/)"""

EXIT_STATUS = """exit status: 0 on success; otherwise a one-line reason on stderr and 1 (2 for usage errors,
4 for authentication failures: no credential, or the server answered 401 or 403; 130 when
interrupted; 141 when stdout is closed early, e.g. `| head`)."""


class _Piped(Exception):
    """Raised (in place of click's own handling) when stdout's reader went away."""


class Tally(click.Group):
    """The root group: its commands loaded when asked for (`COMMANDS`), and a closed stdout
    ending the command quietly with 141 (click would exit 1)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, name = COMMANDS[cmd_name].split(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _Piped from None


@click.group(
    cls=Tally,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog=examples(
        "tally serve --port 8000",
        "tally login --url http://127.0.0.1:8000 --token -",
        'eval "$(tally completion bash)"',
        after=f"{ENVIRONMENT}\n\n\b\n{EXIT_STATUS}",
    ),
)
@click.version_option(version(), "--version", prog_name="tally", message="%(prog)s %(version)s")
def cli() -> None:
    """Partner-referral tracking: the server, and a client of a running server."""


def _usage(exc: click.UsageError) -> int:
    """A usage error as one line on stderr (CONTRACT section 10); exit code 2."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):  # `tally` (or a group) alone: its help
        print(exc.format_message(), file=sys.stderr)
        return EXIT_USAGE
    path = exc.ctx.command_path if exc.ctx is not None else "tally"
    message = " ".join(exc.format_message().split())
    print(f"{path}: error: {message} (see `{path} --help`)", file=sys.stderr)
    return EXIT_USAGE


def _quiet_stdout() -> None:
    """stdout's reader went away: point stdout at /dev/null so the interpreter's final flush
    does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `tally` with `argv` (default: the process's arguments); the exit code."""
    allocator.tune()  # before anything imports Polars (reconcile/allocator.py)
    private.restrict_umask()  # every file a command writes is the user's alone (ingest/private.py)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(args=args, prog_name="tally", standalone_mode=False)
        sys.stdout.flush()
    except (_Piped, BrokenPipeError):
        _quiet_stdout()
        return EXIT_PIPE
    except click.UsageError as exc:
        return _usage(exc)
    except click.Abort:
        return EXIT_INTERRUPTED
    except CliError as exc:
        print(f"tally: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except click.ClickException as exc:
        print(f"tally: {' '.join(exc.format_message().split())}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a file the command reads or writes
        where = f": {exc.filename}" if exc.filename else ""
        print(f"tally: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_FAILURE
    return code if isinstance(code, int) else 0


__all__ = ["cli", "main", "version"]
