"""`tally login`, `tally logout` and `tally auth status`: the account credential account commands
send (api/cli/client.py says which one and where to)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from api.cli.client import (
    LOGIN_HINT,
    Credential,
    account_credential,
    call,
    checked_url,
    config_path,
    masked,
    operator_target,
    read_token,
    save_login,
    stored_login,
)
from api.cli.errors import EXIT_AUTH, ApiError, AuthError
from api.cli.options import examples, json_option
from api.cli.output import emit


@click.command(
    short_help="store an account token for the CLI",
    epilog=examples(
        "tally login --url http://127.0.0.1:8000 --token - < acct-token.txt",
        "TALLY_ACCOUNT_TOKEN=acct_... tally login --url https://tally.example.com",
    ),
)
@click.option(
    "--url",
    required=True,
    envvar="TALLY_URL",
    metavar="URL",
    help="the server's base URL, e.g. http://127.0.0.1:8000 (default: TALLY_URL)",
)
@click.option(
    "--token",
    metavar="TOKEN|-",
    help="the account token (acct_...); `-` reads it from stdin. Omitted: TALLY_ACCOUNT_TOKEN, else a "
    "prompt. A token on the command line is visible to other local users.",
)
def login(url: str, token: str | None) -> None:
    """Check an account token against a server and store it (mode 0600) for the account
    commands. The token is read from stdin with --token -, else from TALLY_ACCOUNT_TOKEN, else
    asked for without echo on a terminal."""
    url = checked_url(url, "--url")
    value = read_token(token, "TALLY_ACCOUNT_TOKEN", "account token (acct_...): ")
    try:
        programs = call("GET", "/api/v1/programs", url=url, token=value)
    except ApiError as exc:
        if exc.code != "account_token_required":
            raise
        if not value.startswith("acct_"):
            raise AuthError("not an account token: account tokens start with acct_") from None
        raise AuthError(
            f"unknown account token: {url} has no account with this token (mistyped, or from another server?)"
        ) from None
    path = save_login(url, value)
    print(f"logged in to {url}; {len(programs)} program(s) visible; credential stored in {path}")


@click.command(short_help="remove the stored login", epilog=examples("tally logout"))
def logout() -> None:
    """Remove the login `tally login` stored. The token itself stays valid on the server (an
    owner or the operator replaces it); TALLY_ACCOUNT_TOKEN, when set, is still used."""
    path = config_path()
    try:
        login = stored_login()
    except AuthError:  # unreadable: removed all the same
        login = None
    try:
        path.unlink()
    except FileNotFoundError:
        print(f"not logged in: no stored login ({path})", file=sys.stderr)
    else:
        print(f"logged out of {login[0] if login else 'the server'}: removed {path}")
    if os.environ.get("TALLY_ACCOUNT_TOKEN"):
        print("TALLY_ACCOUNT_TOKEN is still set: account commands keep using it", file=sys.stderr)


@click.group(
    short_help="the credentials the CLI sends (auth status checks them)",
    epilog=examples(
        "tally auth status", "TALLY_ACCOUNT_TOKEN=acct_... TALLY_URL=https://t.example tally auth status"
    ),
)
def auth() -> None:
    """The credentials the CLI sends: the account token (TALLY_ACCOUNT_TOKEN, else the stored
    login) and the operator token (TALLY_OPERATOR_TOKEN)."""


def _operator_status(url: str) -> dict[str, Any]:
    """Whether TALLY_OPERATOR_TOKEN is set, and whether the server at `url` takes it."""
    if not os.environ.get("TALLY_OPERATOR_TOKEN"):
        return {"set": False, "valid": None}
    _, token = operator_target(url)
    try:
        call("GET", "/api/v1/operator/unroutable?limit=1", url=url, token=token)
    except ApiError as exc:
        if exc.exit_code != EXIT_AUTH:
            raise
        return {"set": True, "valid": False, "error": exc.code}
    return {"set": True, "valid": True}


def _account_status(credential: Credential) -> dict[str, Any]:
    status: dict[str, Any] = {"token": masked(credential.token), "source": credential.source}
    try:
        programs = call("GET", "/api/v1/programs", url=credential.url, token=credential.token)
    except ApiError as exc:
        if exc.exit_code != EXIT_AUTH:
            raise
        return status | {"valid": False, "error": exc.code}
    workspaces = {p["workspace_id"] for p in programs}
    return status | {"valid": True, "programs": len(programs), "workspaces": len(workspaces)}


@auth.command(
    "status",
    short_help="which server and credential the CLI uses, checked against the server",
    epilog=examples("tally auth status", "tally auth status --json"),
)
@json_option("the status")
def auth_status(as_json: bool) -> None:
    """Say which server the account commands call and with which account token (masked), and
    where each comes from, and check the token (and TALLY_OPERATOR_TOKEN, when set) against
    the server. Exit code 4 when there is no account token or the server refuses one."""
    credential = account_credential()
    account = _account_status(credential)
    operator = _operator_status(credential.url)
    if as_json:
        emit(
            {
                "url": credential.url,
                "url_source": credential.url_source,
                "account": account,
                "operator": operator,
            }
        )
    else:
        print(f"{credential.url} (from {credential.url_source})")
        verdict = (
            f"valid: {account['programs']} program(s) in {account['workspaces']} workspace(s)"
            if account["valid"]
            else f"refused ({account['error']})"
        )
        print(f"  account token {account['token']} (from {account['source']}): {verdict}")
        if operator["set"]:
            verdict = "accepted" if operator["valid"] else f"refused ({operator['error']})"
            print(f"  operator token (from TALLY_OPERATOR_TOKEN): {verdict}")
        else:
            print("  operator token: not set (TALLY_OPERATOR_TOKEN)")
    if not account["valid"]:
        raise AuthError(f"{credential.url} refuses the account token from {credential.source}: {LOGIN_HINT}")
    if operator["set"] and not operator["valid"]:
        raise AuthError(f"{credential.url} refuses TALLY_OPERATOR_TOKEN")
