"""The `tally` command line. `serve` runs the server; account commands are HTTP clients of a
running server using the credential stored by `tally login` (they never open the database)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from api.settings import SettingsError, load_settings


class CliError(Exception):
    """Raised by a CLI command to stop with a one-line reason and a non-zero exit code."""


# -- login storage -----------------------------------------------------------------------------
def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tally" / "credentials.json"


def save_login(url: str, token: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": url.rstrip("/"), "token": token}, fh)
    path.chmod(0o600)
    return path


def load_login() -> tuple[str, str]:
    path = config_path()
    try:
        stored = json.loads(path.read_text())
        return str(stored["url"]), str(stored["token"])
    except (OSError, ValueError, KeyError):
        raise CliError(f"not logged in: run `tally login --url URL --token acct_...` ({path})") from None


# -- HTTP ----------------------------------------------------------------------------------------
def call(
    method: str, path: str, *, url: str | None = None, token: str | None = None, body: Any = None
) -> Any:
    if url is None or token is None:
        url, token = load_login()
    try:
        response = httpx.request(
            method, url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=120
        )
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach tally at {url}: {exc}") from None
    try:
        payload = response.json()
    except ValueError:
        raise CliError(f"{method} {path}: HTTP {response.status_code} without a JSON body") from None
    if response.status_code >= 400:
        err = payload.get("error", {}) if isinstance(payload, dict) else {}
        raise CliError(f"{err.get('code', response.status_code)}: {err.get('message', 'request failed')}")
    for warning in payload.get("warnings", []) or []:
        print(f"warning: {warning.get('code')}: {warning.get('message')}", file=sys.stderr)
    return payload.get("data")


def emit(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


# -- commands ------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

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
    print(f"tally: listening on http://{args.host}:{args.port} (database {settings.database})", flush=True)
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
