"""Tally's Python server SDK: track sales, leads and refunds from a brand's server.

    from tally_sdk import Tally
    tally = Tally()  # SERVICE_API_KEY (and TALLY_BASE_URL) from the environment
    result = tally.track_sale(customer_external_id="user_42", amount=4900, invoice_id="in_123")

`AsyncTally` has the same methods, awaited. Errors are `TallyAPIError` subclasses keyed on the
API's `error.code`; a key flagged for rotation emits `ApiKeyRotationWarning` and sets
`result.rotation_deadline`. `tally_sdk.renewals.handle_invoice_paid` tracks subscription renewals.
`result.data` is typed (`tally_sdk.responses`); `tally_sdk.__version__` is the SDK's version.
"""

from tally_sdk._core import RetryPolicy, TrackResult
from tally_sdk._version import __version__
from tally_sdk.client import AsyncTally, Tally
from tally_sdk.errors import (
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
from tally_sdk.responses import ApiWarning, LeadData, RefundData, SaleData, SaleTestModeData

__all__ = [
    "ApiKeyRotationRequired",
    "ApiKeyRotationWarning",
    "ApiWarning",
    "AsyncTally",
    "AuthenticationError",
    "BadRequestError",
    "ConfigurationError",
    "ConflictError",
    "ConnectionFailed",
    "DuplicateError",
    "InvalidResponseError",
    "LeadData",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RefundData",
    "RetryPolicy",
    "SaleData",
    "SaleTestModeData",
    "ServerError",
    "Tally",
    "TallyAPIError",
    "TrackResult",
    "ValidationError",
    "__version__",
]
