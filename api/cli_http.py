"""The CLI's HTTP side: the stored login and calls to a running server."""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


class CliError(Exception):
    """Raised by a CLI command to stop with a one-line reason and a non-zero exit code."""


class ApiError(CliError):
    """The server answered with the contract's error envelope (CONTRACT section 1)."""

    def __init__(self, status: int, code: str, message: str, fields: list[dict[str, Any]]) -> None:
        self.status, self.code, self.fields = status, code, fields
        detail = "; ".join(f"{f.get('field')}: {f.get('message')}" for f in fields if isinstance(f, dict))
        line = f"{code}: {message}"
        if detail and detail not in message:
            line += f" ({detail})"
        super().__init__(line)


def api_error(response: httpx.Response) -> ApiError:
    """The error a >= 400 response stands for: its envelope's code, message and field details."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict):
        return ApiError(response.status_code, f"HTTP {response.status_code}", "no error envelope", [])
    fields = err.get("fields")
    return ApiError(
        response.status_code,
        str(err.get("code", response.status_code)),
        str(err.get("message", "request failed")),
        fields if isinstance(fields, list) else [],
    )


def examples(*lines: str) -> str:
    """An argparse epilog with a command's examples (every command has at least one)."""
    return "example" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(f"  {line}" for line in lines)


# -- tokens ------------------------------------------------------------------------------------
def clean_token(raw: str, where: str) -> str:
    """A token read from argv, stdin or the environment, without its surrounding whitespace.
    Never quoted back: a bad one is described, not shown."""
    token = raw.strip()
    if not token:
        raise CliError(f"no token in {where}")
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise CliError(
            f"the token in {where} has characters a token never has (spaces, control or non-ASCII)"
        )
    return token


def read_token(value: str | None, env: str, prompt: str) -> str:
    """A token from `--token VALUE`, `--token -` (one line of stdin), the environment variable
    `env`, or (on a terminal) a prompt that does not echo."""
    if value == "-":
        return clean_token(sys.stdin.readline(), "stdin")
    if value is not None:
        return clean_token(value, "--token")
    if os.environ.get(env):
        return clean_token(os.environ[env], env)
    if sys.stdin.isatty():
        return clean_token(getpass.getpass(prompt), "the prompt")
    raise CliError(f"no token: pass --token - (reads stdin) or set {env}")


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
BUSY_TRIES = 10  # a call refused because a reconcile run holds the lock is tried again


def busy_wait(response: httpx.Response) -> float | None:
    """Seconds to wait before trying a call again when the server answered 409
    `reconcile_running` (nothing of the call was done), else None."""
    if response.status_code != 409:
        return None
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    if code != "reconcile_running":
        return None
    try:
        return min(10.0, max(0.5, float(response.headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0


def call(
    method: str, path: str, *, url: str | None = None, token: str | None = None, body: Any = None
) -> Any:
    return call_status(method, path, url=url, token=token, body=body)[1]


def call_status(
    method: str, path: str, *, url: str | None = None, token: str | None = None, body: Any = None
) -> tuple[int, Any]:
    """`call`, with the HTTP status of the success (200 and 201 can mean different things)."""
    if url is None or token is None:
        url, token = load_login()
    for attempt in range(BUSY_TRIES):
        try:
            response = httpx.request(
                method, url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=120
            )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise unreachable(url, exc) from None
        wait = busy_wait(response)
        if wait is None or attempt == BUSY_TRIES - 1:
            break
        print(f"a reconcile run is in progress; trying again in {wait:.0f} s", file=sys.stderr)
        time.sleep(wait)
    if response.status_code >= 400:
        raise api_error(response)
    try:
        payload = response.json()
    except ValueError:
        raise CliError(f"{method} {path}: HTTP {response.status_code} without a JSON body") from None
    if not isinstance(payload, dict):
        raise CliError(f"{method} {path}: HTTP {response.status_code} without the data envelope")
    for warning in payload.get("warnings", []) or []:
        print(f"warning: {warning.get('code')}: {warning.get('message')}", file=sys.stderr)
    return response.status_code, payload.get("data")


def emit(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def unreachable(url: str, exc: Exception) -> CliError:
    return CliError(f"cannot reach tally at {url}: {str(exc) or type(exc).__name__}")


def fetch_bytes(path: str) -> bytes:
    """GET a non-JSON resource (a report file) with the stored login."""
    url, token = load_login()
    try:
        response = httpx.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=300)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise unreachable(url, exc) from None
    if response.status_code >= 400:
        raise api_error(response)
    return response.content


def stream(method: str, path: str, *, url: str, token: str, body: Any = None) -> Iterator[dict[str, Any]]:
    """Call an endpoint that streams NDJSON progress lines; yield each line as a dict. A call
    refused because a reconcile run holds the lock (nothing of it was done) is tried again."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/x-ndjson"}
    try:
        for attempt in range(BUSY_TRIES):
            with httpx.stream(
                method, url + path, json=body, headers=headers, timeout=httpx.Timeout(3600, connect=10)
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    wait = busy_wait(response)
                    if wait is not None and attempt < BUSY_TRIES - 1:
                        print(
                            f"a reconcile run is in progress; trying again in {wait:.0f} s", file=sys.stderr
                        )
                        time.sleep(wait)
                        continue
                    raise api_error(response)
                for line in response.iter_lines():
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except ValueError:
                            raise CliError(f"{method} {path}: a progress line is not JSON") from None
                return
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise unreachable(url, exc) from None


def operator_target(url: str | None) -> tuple[str, str]:
    """Where and how operator commands call: `--url` or the login's URL or TALLY_BASE_URL, and
    the operator token from TALLY_OPERATOR_TOKEN."""
    raw = os.environ.get("TALLY_OPERATOR_TOKEN")
    if not raw:
        raise CliError("operator commands need TALLY_OPERATOR_TOKEN in the environment")
    token = clean_token(raw, "TALLY_OPERATOR_TOKEN")
    if url is None:
        try:
            url, _ = load_login()
        except CliError:
            url = os.environ.get("TALLY_BASE_URL", "http://127.0.0.1:8000")
    return url.rstrip("/"), token
