"""The `tally` command line. `serve` runs the server; account commands are HTTP clients of a
running server using the credential stored by `tally login` (they never open the database)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from api.cli_backup import add_backup
from api.cli_http import CliError, call, emit, save_login
from api.cli_migrate import add_migrate
from api.cli_ops import add_operations
from api.settings import SettingsError, load_settings
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
    if settings.database.startswith(("postgresql://", "postgres://")):
        raise CliError(
            "refusing to start: the PostgreSQL backend is not available yet; use a DuckDB file path"
        )
    # The writer thread wakes from fsync many times a second; with the default 5 ms GIL switch
    # interval every wake-up would wait behind the event loop. 0.5 ms keeps commits prompt.
    sys.setswitchinterval(float(os.environ.get("TALLY_SWITCH", "0.0005")))
    # Requests allocate many short-lived objects; collecting the young generation every 700
    # allocations (the default) and the old one often costs more than the requests themselves.
    gc.set_threshold(50_000, 50, 1_000)
    listening = f"tally: listening on http://{args.host}:{args.port} (database {settings.database})"
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
    programs = call("GET", "/api/v1/programs", url=url, token=args.token)
    path = save_login(url, args.token)
    print(f"logged in to {url}; {len(programs)} program(s) visible; credential stored in {path}")


def cmd_programs_create(args: argparse.Namespace) -> None:
    emit(call("POST", "/api/v1/programs", body={"workspace_id": args.workspace, "name": args.name}))


def cmd_programs_list(args: argparse.Namespace) -> None:
    programs = call("GET", "/api/v1/programs")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tally", description="partner-referral tracking")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--database", help="DuckDB file (default: TALLY_DATABASE)")
    serve.set_defaults(func=cmd_serve)

    login = sub.add_parser("login", help="store an account token for the CLI")
    login.add_argument("--url", required=True)
    login.add_argument("--token", required=True)
    login.set_defaults(func=cmd_login)

    programs = sub.add_parser("programs", help="create or list programs").add_subparsers(
        dest="action", required=True
    )
    create = programs.add_parser("create")
    create.add_argument("--workspace", required=True)
    create.add_argument("--name", required=True)
    create.set_defaults(func=cmd_programs_create)
    programs.add_parser("list").set_defaults(func=cmd_programs_list)

    keys = sub.add_parser("keys", help="program API keys").add_subparsers(dest="action", required=True)
    regen = keys.add_parser("regenerate")
    regen.add_argument("--program", required=True)
    regen.set_defaults(func=cmd_keys_regenerate)
    add_operations(sub)
    add_migrate(sub)
    add_backup(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    allocator.tune()  # before anything imports Polars (reconcile/allocator.py)
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except CliError as exc:
        print(f"tally: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
