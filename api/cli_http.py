"""The CLI's HTTP side: the stored login and calls to a running server."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


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


def _error_line(response: httpx.Response) -> str:
    try:
        err = response.json().get("error", {})
    except ValueError:
        return f"HTTP {response.status_code}"
    return f"{err.get('code', response.status_code)}: {err.get('message', 'request failed')}"


def fetch_bytes(path: str) -> bytes:
    """GET a non-JSON resource (a report file) with the stored login."""
    url, token = load_login()
    try:
        response = httpx.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=300)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach tally at {url}: {exc}") from None
    if response.status_code >= 400:
        raise CliError(_error_line(response))
    return response.content


def stream(method: str, path: str, *, url: str, token: str, body: Any = None) -> Iterator[dict[str, Any]]:
    """Call an endpoint that streams NDJSON progress lines; yield each line as a dict."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/x-ndjson"}
    try:
        with httpx.stream(
            method, url + path, json=body, headers=headers, timeout=httpx.Timeout(3600, connect=10)
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise CliError(_error_line(response))
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach tally at {url}: {exc}") from None


def operator_target(url: str | None) -> tuple[str, str]:
    """Where and how operator commands call: `--url` or the login's URL or TALLY_BASE_URL, and
    the operator token from TALLY_OPERATOR_TOKEN."""
    token = os.environ.get("TALLY_OPERATOR_TOKEN")
    if not token:
        raise CliError("operator commands need TALLY_OPERATOR_TOKEN in the environment")
    if url is None:
        try:
            url, _ = load_login()
        except CliError:
            url = os.environ.get("TALLY_BASE_URL", "http://127.0.0.1:8000")
    return url.rstrip("/"), token
