"""The CLI's HTTP side: which server and credential a command uses, and its calls to a running
server.

Account commands send an account token: `TALLY_ACCOUNT_TOKEN` when it is set (no login needed,
like gh's `GH_TOKEN`), else the one `tally login` stored. The server is `TALLY_URL` when set,
else the stored login's, else `TALLY_BASE_URL`, else http://127.0.0.1:8000; a stored token is
only ever sent to the server it was stored for. Operator commands send `TALLY_OPERATOR_TOKEN`
to `--url`, else the same server."""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from api.cli.errors import AuthError, CliError, api_error
from api.cli.output import Progress, progress_wanted

DEFAULT_URL = "http://127.0.0.1:8000"
LOGIN_HINT = "run `tally login --url URL --token -`, or set TALLY_ACCOUNT_TOKEN (and TALLY_URL)"


# -- tokens ------------------------------------------------------------------------------------
def clean_token(raw: str, where: str) -> str:
    """A token read from argv, stdin or the environment, without its surrounding whitespace.
    Never quoted back: a bad one is described, not shown."""
    token = raw.strip()
    if not token:
        raise AuthError(f"no token in {where}")
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


def masked(token: str) -> str:
    """A token as the CLI may show it: its prefix and last four characters (`acct_****3f9a`)."""
    prefix = token.split("_", 1)[0] + "_" if "_" in token[:8] else ""
    return f"{prefix}****{token[-4:]}" if len(token) > len(prefix) + 8 else f"{prefix}****"


# -- the stored login ----------------------------------------------------------------------------
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


def stored_login() -> tuple[str, str] | None:
    """The stored login's (url, token), or None when there is none."""
    path = config_path()
    try:
        stored = json.loads(path.read_text())
        return str(stored["url"]).rstrip("/"), str(stored["token"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        raise AuthError(f"the stored login {path} cannot be read: run `tally login` again") from None


def checked_url(url: str, where: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"{where} must start with http:// or https:// (got {url!r})")
    return url


# -- which server, which credential ----------------------------------------------------------------
@dataclass(frozen=True)
class Credential:
    """An account token and the server it goes to, with where each came from."""

    url: str
    token: str
    source: str  # "TALLY_ACCOUNT_TOKEN" or the stored login's path
    url_source: str


def account_credential() -> Credential:
    """The account token and server an account command uses (this module's docstring);
    `AuthError` when there is none."""
    env_url = os.environ.get("TALLY_URL")
    url = checked_url(env_url, "TALLY_URL") if env_url else None
    login = stored_login()
    if os.environ.get("TALLY_ACCOUNT_TOKEN"):
        token = clean_token(os.environ["TALLY_ACCOUNT_TOKEN"], "TALLY_ACCOUNT_TOKEN")
        if url is not None:
            return Credential(url, token, "TALLY_ACCOUNT_TOKEN", "TALLY_URL")
        if login is not None:
            return Credential(login[0], token, "TALLY_ACCOUNT_TOKEN", "the stored login")
        fallback, where = fallback_url()
        return Credential(fallback, token, "TALLY_ACCOUNT_TOKEN", where)
    if login is None:
        raise AuthError(f"not logged in: {LOGIN_HINT}")
    if url is not None and url != login[0]:
        raise AuthError(
            f"not logged in to {url} (TALLY_URL); the stored login is for {login[0]}: "
            "set TALLY_ACCOUNT_TOKEN, or run `tally login` for that server"
        )
    return Credential(login[0], login[1], str(config_path()), "the stored login")


def fallback_url() -> tuple[str, str]:
    """The server when nothing names one: TALLY_BASE_URL (the server's own setting), else the
    default `make run` serves on; with where it came from."""
    base = os.environ.get("TALLY_BASE_URL")
    if base:
        return checked_url(base, "TALLY_BASE_URL"), "TALLY_BASE_URL"
    return DEFAULT_URL, "the default"


def server_url(url: str | None) -> str:
    """The server a command with `--url` talks to: `--url` (or TALLY_URL, its environment
    variable), else the stored login's, else TALLY_BASE_URL, else the default."""
    url = url or os.environ.get("TALLY_URL")
    if url:
        return checked_url(url, "--url")
    try:
        login = stored_login()
    except AuthError:
        login = None
    return login[0] if login is not None else fallback_url()[0]


def operator_target(url: str | None) -> tuple[str, str]:
    """Where and how operator commands call: `server_url(url)` with the operator token from
    TALLY_OPERATOR_TOKEN."""
    raw = os.environ.get("TALLY_OPERATOR_TOKEN")
    if not raw:
        raise AuthError("operator commands need TALLY_OPERATOR_TOKEN in the environment")
    return server_url(url), clean_token(raw, "TALLY_OPERATOR_TOKEN")


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


def waiting(seconds: float) -> None:
    """Say that a call waits for a reconcile run (progress: only where progress is shown)."""
    if progress_wanted():
        print(f"a reconcile run is in progress; trying again in {seconds:.0f} s", file=sys.stderr)


def call(
    method: str, path: str, *, url: str | None = None, token: str | None = None, body: Any = None
) -> Any:
    return call_status(method, path, url=url, token=token, body=body)[1]


def call_status(
    method: str, path: str, *, url: str | None = None, token: str | None = None, body: Any = None
) -> tuple[int, Any]:
    """`call`, with the HTTP status of the success (200 and 201 can mean different things).
    Without `url` and `token`: the account credential (`account_credential`)."""
    if url is None or token is None:
        credential = account_credential()
        url, token = credential.url, credential.token
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
        waiting(wait)
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


def unreachable(url: str, exc: Exception) -> CliError:
    return CliError(f"cannot reach tally at {url}: {str(exc) or type(exc).__name__}")


def fetch_bytes(path: str) -> bytes:
    """GET a non-JSON resource (a report file) with the account credential."""
    credential = account_credential()
    try:
        response = httpx.get(
            credential.url + path, headers={"Authorization": f"Bearer {credential.token}"}, timeout=300
        )
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise unreachable(credential.url, exc) from None
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
                        waiting(wait)
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


def streamed_result(lines: Iterator[dict[str, Any]], progress: Progress) -> dict[str, Any]:
    """The `data` line of a streamed call (reconcile, backup), its `progress` lines shown on
    `progress`; an `error` line is raised."""
    for line in lines:
        if "progress" in line:
            p = line["progress"]
            progress.update(p["stage"], p["done"], p["total"])
        elif "error" in line:
            raise CliError(f"{line['error']['code']}: {line['error']['message']}")
        elif "data" in line:
            data: dict[str, Any] = line["data"]
            return data
    raise CliError("the server closed the stream without a result")
