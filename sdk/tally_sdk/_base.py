"""What `Tally` and `AsyncTally` share: settings, credentials and how a call becomes a request."""

from __future__ import annotations

from typing import Any

import httpx

from tally_sdk._core import Call, RetryPolicy, resolve_settings

DEFAULT_TIMEOUT = 10.0

# A call's own timeout: seconds (every phase), an `httpx.Timeout`, or None for the client's.
Timeout = float | httpx.Timeout | None


class Settings:
    """Base URL, default headers, credentials and the default retry policy of a client."""

    def __init__(
        self, base_url: str | None, api_key: str | None, account_token: str | None, retry: RetryPolicy | None
    ) -> None:
        self.base_url, self._headers, self._credentials = resolve_settings(base_url, api_key, account_token)
        self.retry = retry or RetryPolicy()

    def request_args(self, call: Call, timeout: Timeout) -> dict[str, Any]:
        """`build_request` arguments for `call`: its credential's `Authorization` and, when given,
        its own timeout. `ConfigurationError` (nothing sent) when that credential is missing."""
        args = call.request_args()
        args["headers"].update(self._credentials.header(call))
        if timeout is not None:
            args["timeout"] = timeout
        return args

    def __repr__(self) -> str:  # never shows a credential
        return f"{type(self).__name__}(base_url={self.base_url!r})"
