"""How a CLI command fails: a one-line reason on stderr and an exit code (CONTRACT section 10).

0 success; 1 a failure (`CliError`, the server's error envelope); 2 a usage error; 4 an
authentication failure (`AuthError`: no credential, or the server answered 401 or 403, as gh
does); 130 interrupted; 141 stdout's reader went away (`| head`)."""

from __future__ import annotations

from typing import Any

import httpx

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_AUTH = 4
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141  # 128 + SIGPIPE, what a shell pipeline expects


class CliError(Exception):
    """Raised by a CLI command to stop with a one-line reason and a non-zero exit code."""

    exit_code = EXIT_FAILURE


class AuthError(CliError):
    """Raised when a command has no credential to send, or the server refused the one it sent."""

    exit_code = EXIT_AUTH


class ApiError(CliError):
    """Raised when the server answers with the contract's error envelope (CONTRACT section 1);
    exit code 4 when it is a 401 or 403 (the credential is missing, unknown or not allowed)."""

    def __init__(
        self, status: int, code: str, message: str, fields: list[dict[str, Any]], extra: dict[str, Any]
    ) -> None:
        self.status, self.code, self.message, self.fields, self.extra = status, code, message, fields, extra
        if status in (401, 403):
            self.exit_code = EXIT_AUTH
        super().__init__(f"{code}: {message}{details(message, fields)}")


def details(message: str, fields: list[dict[str, Any]]) -> str:
    """The field details an error adds to its message, each once: ` (period: must be YYYY-MM)`;
    nothing for a field whose message the error's message already says."""
    said = [
        f"{f.get('field')}: {f.get('message')}"
        for f in fields
        if isinstance(f, dict) and str(f.get("message")) not in message
    ]
    return f" ({'; '.join(said)})" if said else ""


ENVELOPE_KEYS = frozenset({"code", "message", "doc_url", "fields"})


def api_error(response: httpx.Response) -> ApiError:
    """The error a >= 400 response stands for: its envelope's code, message, field details and
    any other keys the server put in it (a hint, a deadline)."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict):
        return ApiError(response.status_code, f"HTTP {response.status_code}", "no error envelope", [], {})
    fields = err.get("fields")
    return ApiError(
        response.status_code,
        str(err.get("code", response.status_code)),
        str(err.get("message", "request failed")),
        fields if isinstance(fields, list) else [],
        {k: v for k, v in err.items() if k not in ENVELOPE_KEYS},
    )
