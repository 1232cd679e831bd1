"""Errors and warnings raised by the Tally SDK, keyed on the API's `error.code`.

Branch on the class (or on `error.code`), never on the message text. Every API error keeps the
HTTP `status` (None when the SDK refused the call before sending it), the server's `request_id`,
the rest of the error envelope in `details`, and the raw answer: `headers`, `body` (its text),
`json_body` (parsed, or None) and `response` (the `httpx.Response` itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx


class ApiKeyRotationWarning(UserWarning):
    """Warned by the Tally clients when the API key is flagged for rotation (deadline ahead).

    A `UserWarning`, not a `DeprecationWarning`: Python hides the latter by default outside
    `__main__`, and a brand server must see this one before its key stops working.
    """


class ConfigurationError(ValueError):
    """Raised by the Tally clients when no API key is given and `SERVICE_API_KEY` is unset."""


class TallyAPIError(Exception):
    """Raised by the Tally clients when the API refuses a call (base of every API error)."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int | None = None,
        request_id: str | None = None,
        *,
        doc_url: str | None = None,
        details: Mapping[str, Any] | None = None,
        rotation_deadline: datetime | None = None,
        retry_after: float | None = None,
        after_retry: bool = False,
        response: httpx.Response | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" + (f" (request {request_id})" if request_id else ""))
        self.code = code
        self.message = message
        self.status = status
        self.request_id = request_id
        self.doc_url = doc_url
        self.details: Mapping[str, Any] = dict(details or {})
        self.rotation_deadline = rotation_deadline
        self.retry_after = retry_after
        self.after_retry = after_retry
        self.response = response

    @property
    def headers(self) -> httpx.Headers:
        """The answer's headers (empty when there was no answer: refused before sending, or
        the server not reached)."""
        return self.response.headers if self.response is not None else httpx.Headers()

    @property
    def body(self) -> str | None:
        """The answer's body as text (tally's JSON envelope, or a proxy's page), or None."""
        return self.response.text if self.response is not None else None

    @property
    def json_body(self) -> Any:
        """The answer's body parsed as JSON, or None when there is none or it is not JSON."""
        if self.response is None:
            return None
        try:
            return self.response.json()
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            return None


class ConnectionFailed(TallyAPIError):
    """Raised by the Tally clients when the API cannot be reached within the allowed retries."""


class InvalidResponseError(TallyAPIError):
    """Raised by the Tally clients when a response is not the contract's JSON envelope."""


class BadRequestError(TallyAPIError):
    """Raised by the Tally clients on a 4xx refusal of the body itself (400, 413, 415...)."""


class AuthenticationError(TallyAPIError):
    """Raised by the Tally clients on a 401: missing, malformed, unknown or replaced API key."""


class ApiKeyRotationRequired(AuthenticationError):
    """Raised by the Tally clients when a key flagged for rotation is used past its deadline."""

    @property
    def deadline(self) -> datetime | None:
        """The rotation deadline that has passed (from `error.deadline` or `Sunset`)."""
        return self.rotation_deadline


class PermissionDeniedError(TallyAPIError):
    """Raised by the Tally clients on a 403 (e.g. `owner_required`, `insufficient_scope`)."""


class NotFoundError(TallyAPIError):
    """Raised by the Tally clients on a 404 (`program_not_found`, `sale_not_found`...)."""


class ConflictError(TallyAPIError):
    """Raised by the Tally clients on a 409 that is not a duplicate (e.g. `conflict`)."""


class DuplicateError(ConflictError):
    """Raised by the Tally clients when the transaction or refund id is already recorded (409).

    `after_retry` is True when an earlier attempt of the same call may have reached the server
    (a timeout, a dropped connection, a 502/504): the duplicate is then most likely that very
    attempt, i.e. the sale is recorded once, as intended.
    """


class ValidationError(TallyAPIError):
    """Raised by the Tally clients on a 422, or before sending when an argument is invalid."""

    @property
    def fields(self) -> list[Mapping[str, Any]]:
        """The offending fields: `[{"field": "amount", "message": "..."}]`."""
        fields = self.details.get("fields")
        return [f for f in fields if isinstance(f, Mapping)] if isinstance(fields, list) else []


class RateLimitError(TallyAPIError):
    """Raised by the Tally clients on a 429 once retries are exhausted; see `retry_after`."""


class ServerError(TallyAPIError):
    """Raised by the Tally clients on a 5xx once retries (where safe) are exhausted."""


ERROR_CLASSES: Mapping[str, type[TallyAPIError]] = {
    "invalid_json": BadRequestError,
    "invalid_signature": BadRequestError,
    "payload_too_large": BadRequestError,
    "unsupported_media_type": BadRequestError,
    "missing_credentials": AuthenticationError,
    "malformed_authorization": AuthenticationError,
    "invalid_api_key": AuthenticationError,
    "api_key_rotation_required": ApiKeyRotationRequired,
    "program_key_required": AuthenticationError,
    "agent_key_required": AuthenticationError,
    "account_token_required": AuthenticationError,
    "operator_token_required": AuthenticationError,
    "owner_required": PermissionDeniedError,
    "insufficient_scope": PermissionDeniedError,
    "program_not_found": NotFoundError,
    "partner_not_found": NotFoundError,
    "sale_not_found": NotFoundError,
    "not_found": NotFoundError,
    "duplicate_transaction": DuplicateError,
    "duplicate_refund": DuplicateError,
    "conflict": ConflictError,
    "stripe_account_in_use": ConflictError,
    "line_paid": ConflictError,
    "invalid_transition": ConflictError,
    "validation_error": ValidationError,
    "program_mismatch": ValidationError,
    "refund_exceeds_sale": ValidationError,
    "rate_limited": RateLimitError,
    "internal_error": ServerError,
    "service_unavailable": ServerError,
    "database_unavailable": ServerError,
}

_STATUS_CLASSES: Mapping[int, type[TallyAPIError]] = {
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: ValidationError,
    429: RateLimitError,
}


def error_class(code: str, status: int) -> type[TallyAPIError]:
    """The exception class for an error `code`, else for the HTTP `status` family."""
    if code in ERROR_CLASSES:
        return ERROR_CLASSES[code]
    if status in _STATUS_CLASSES:
        return _STATUS_CLASSES[status]
    return ServerError if status >= 500 else BadRequestError
