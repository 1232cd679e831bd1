"""The `tally` command line. `serve` runs the server; account commands are HTTP clients of a
running server using the credential stored by `tally login` (they never open the database)."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, NoReturn

from api.cli_backup import add_backup
from api.cli_engineering import add_commissions, add_engineering, add_settings_options, settings_body
from api.cli_http import ApiError, CliError, call, emit, examples, read_token, save_login
from api.cli_migrate import add_migrate
from api.cli_ops import add_operations
from api.cli_payouts import add_payouts
from api.settings import SettingsError, load_settings
from ingest.storage import private
from reconcile import allocator


# -- commands ------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> None:
    from api import observability, serving
    from api.app import create_app

    overrides: dict[str, Any] = {}
    if args.database:
        overrides["database"] = args.database
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        raise CliError(f"refusing to start: {exc}") from None
    # The writer thread wakes from fsync many times a second; with the default 5 ms GIL switch
    # interval every wake-up would wait behind the event loop. 0.5 ms keeps commits prompt.
    sys.setswitchinterval(float(os.environ.get("TALLY_SWITCH", "0.0005")))
    # Requests allocate many short-lived objects; collecting the young generation every 700
    # allocations (the default) and the old one often costs more than the requests themselves.
    gc.set_threshold(50_000, 50, 1_000)
    listening = f"tally: listening on http://{args.host}:{args.port} (database {settings.database_name})"
    # TALLY_LOG_FORMAT, TALLY_LOG_LEVEL (stderr); held back until started: a failed start is one line
    observability.configure_logging(settings, hold=True)
    try:
        serving.run(
            create_app(settings),
            args.host,
            args.port,
            settings.header_timeout_seconds,
            listening,
            on_started=observability.release_logging,
        )
    except serving.StartupFailed as exc:
        observability.stop_logging(discard=True)
        raise CliError(f"cannot start: {exc}") from None
    finally:
        observability.stop_logging()


def cmd_login(args: argparse.Namespace) -> None:
    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"--url must start with http:// or https:// (got {url!r})")
    token = read_token(args.token, "TALLY_ACCOUNT_TOKEN", "account token (acct_...): ")
    try:
        programs = call("GET", "/api/v1/programs", url=url, token=token)
    except ApiError as exc:
        if exc.code != "account_token_required":
            raise
        if not token.startswith("acct_"):
            raise CliError("not an account token: account tokens start with acct_") from None
        raise CliError(
            f"unknown account token: {url} has no account with this token (mistyped, or from another server?)"
        ) from None
    path = save_login(url, token)
    print(f"logged in to {url}; {len(programs)} program(s) visible; credential stored in {path}")


def cmd_programs_create(args: argparse.Namespace) -> None:
    # Every setting goes in the create call itself: they are the program's first terms (a later
    # PATCH would be a change of terms, and sales dated before it would keep the defaults).
    body = {"workspace_id": args.workspace, "name": args.name, **settings_body(args)}
    emit(call("POST", "/api/v1/programs", body=body))


def cmd_programs_list(args: argparse.Namespace) -> None:
    programs = call("GET", "/api/v1/programs")
    if args.json:
        emit(programs)
        return
    for p in programs:
        print(f"{p['program_id']}\t{p['workspace_id']}\t{p['api_token_masked'] or '-'}\t{p['name']}")


def cmd_keys_regenerate(args: argparse.Namespace) -> None:
    data = call("POST", f"/api/v1/programs/{args.program}/api-key")
    print(data["api_key"])
    print(
        "this is the only time the key is shown; store it server-side (SERVICE_API_KEY). "
        "The previous key no longer works.",
        file=sys.stderr,
    )


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's conventions: epilogs (examples) kept as written, and usage errors
    as one line on stderr (exit code 2), like every other failure (CONTRACT section 10)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see `{self.prog} --help`)\n")


def version() -> str:
    try:
        return metadata.version("tally")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


ENVIRONMENT = """environment:
  TALLY_ACCOUNT_TOKEN   account token for `tally login` when --token is not given
  TALLY_OPERATOR_TOKEN  operator token for `tally reconcile` and `tally demo` (never on the command line)
  TALLY_BASE_URL        server URL for operator commands when there is no login and no --url
  XDG_CONFIG_HOME       where `tally login` stores its credential (default ~/.config/tally/)

exit status: 0 on success; otherwise a one-line reason on stderr and 1 (2 for usage errors,
130 when interrupted, 141 when stdout is closed early, e.g. `| head`)."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tally",
        description="partner-referral tracking: the server, and a client of a running server",
        epilog=examples("tally serve --port 8000", "tally login --url http://127.0.0.1:8000 --token -")
        + "\n\n"
        + ENVIRONMENT,
    )
    parser.add_argument("--version", action="version", version=f"tally {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the server",
        description="Run the tally server (settings from TALLY_* environment variables).",
        epilog=examples("TALLY_OPERATOR_TOKEN=... tally serve --host 0.0.0.0 --port 8000"),
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    serve.add_argument("--database", help="DuckDB file or postgresql:// URL (default: TALLY_DATABASE)")
    serve.set_defaults(func=cmd_serve)

    login = sub.add_parser(
        "login",
        help="store an account token for the CLI",
        description="Check an account token against a server and store it (mode 0600) for the "
        "account commands. The token is read from stdin with --token -, else from "
        "TALLY_ACCOUNT_TOKEN, else asked for without echo on a terminal.",
        epilog=examples(
            "tally login --url http://127.0.0.1:8000 --token - < acct-token.txt",
            "TALLY_ACCOUNT_TOKEN=acct_... tally login --url https://tally.example.com",
        ),
    )
    login.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    login.add_argument(
        "--token",
        metavar="TOKEN|-",
        help="the account token (acct_...); `-` reads it from stdin. Omitted: TALLY_ACCOUNT_TOKEN, "
        "else a prompt. A token on the command line is visible to other local users.",
    )
    login.set_defaults(func=cmd_login)

    programs = sub.add_parser(
        "programs",
        help="create or list programs",
        description="Create or list the programs of your workspaces.",
        epilog=examples("tally programs list"),
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    create = programs.add_parser(
        "create",
        help="create a program in a workspace (prints it as JSON)",
        description="Create a program; its API key is made with it but shown only by "
        "`tally keys regenerate`. Every setting can be given here, and should be: they are the "
        "program's first terms, valuing every sale however early it is dated (a later change of "
        "terms applies only to sales from then on). A setting not given keeps its default.",
        epilog=examples(
            'tally programs create --workspace ws_... --name "Brand partners"',
            'tally programs create --workspace ws_... --name "Brand partners" --commission-percent 12.5 '
            "--holding-days 14 --recurring-months 12 --platform-fee-percent 2",
            'tally programs create --workspace ws_... --name "Flat" --commission-flat "12.50 usd"',
        ),
    )
    create.add_argument("--workspace", required=True, help="workspace id (ws_...) the program belongs to")
    create.add_argument("--name", required=True, help="the program's name")
    add_settings_options(create)
    create.set_defaults(func=cmd_programs_create)
    plist = programs.add_parser(
        "list",
        help="list the programs you can see",
        description="One line per program: id, workspace, masked key, name (tab-separated).",
        epilog=examples("tally programs list", "tally programs list --json"),
    )
    plist.add_argument("--json", action="store_true", help="print the programs as a JSON array")
    plist.set_defaults(func=cmd_programs_list)

    keys = sub.add_parser(
        "keys",
        help="program API keys",
        description="Program API keys (workspace owners).",
        epilog=examples("tally keys regenerate --program prog_..."),
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    regen = keys.add_parser(
        "regenerate",
        help="make a new API key (the old one stops working); shown once",
        description="Generate or regenerate a program's API key. The key is printed once on "
        "stdout; the previous key stops working at once.",
        epilog=examples("tally keys regenerate --program prog_... > service-api-key"),
    )
    regen.add_argument("--program", required=True, help="program id (prog_...)")
    regen.set_defaults(func=cmd_keys_regenerate)
    add_operations(sub)
    add_payouts(sub)
    add_engineering(sub)
    add_commissions(sub)
    add_migrate(sub)
    add_backup(sub)
    return parser


def _quiet_stdout() -> None:
    """stdout's reader went away: point stdout at /dev/null so the interpreter's final flush
    does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    allocator.tune()  # before anything imports Polars (reconcile/allocator.py)
    private.restrict_umask()  # every file a command writes is the user's alone (ingest/private.py)
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        return 128 + signal.SIGPIPE
    except CliError as exc:
        print(f"tally: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file the command reads or writes
        where = f": {exc.filename}" if exc.filename else ""
        print(f"tally: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
