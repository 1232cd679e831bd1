"""Tally's Python server SDK: track sales, leads and refunds from a brand's server.

    from sdk import Tally
    tally = Tally()  # SERVICE_API_KEY (and TALLY_BASE_URL) from the environment
    result = tally.track_sale(customer_external_id="user_42", amount=4900, invoice_id="in_123")

`AsyncTally` has the same methods, awaited. Errors are `TallyAPIError` subclasses keyed on the
API's `error.code`; a key flagged for rotation emits `ApiKeyRotationWarning` and sets
`result.rotation_deadline`. `sdk.renewals.handle_invoice_paid` tracks subscription renewals.
"""

from sdk._core import RetryPolicy, TrackResult
from sdk.client import AsyncTally, Tally
from sdk.errors import (
    ApiKeyRotationRequired,
    ApiKeyRotationWarning,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ConflictError,
    ConnectionFailed,
    DuplicateError,
    InvalidResponseError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    TallyAPIError,
    ValidationError,
)

__all__ = [
    "ApiKeyRotationRequired",
    "ApiKeyRotationWarning",
    "AsyncTally",
    "AuthenticationError",
    "BadRequestError",
    "ConfigurationError",
    "ConflictError",
    "ConnectionFailed",
    "DuplicateError",
    "InvalidResponseError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RetryPolicy",
    "ServerError",
    "Tally",
    "TallyAPIError",
    "TrackResult",
    "ValidationError",
]
