"""Tally's Python server SDK: track sales, leads and refunds from a brand's server, and read
sales, commissions, payouts, partners (with their balances and statements) and programs back;
explain a sale, and (a workspace owner) hold, release or void it.

    from tally_sdk import Tally
    tally = Tally()  # SERVICE_API_KEY, TALLY_ACCOUNT_TOKEN (and TALLY_BASE_URL) from the environment
    result = tally.track_sale(customer_external_id="user_42", amount=4900, invoice_id="in_123")
    for line in tally.list_commissions("prog_...", period="2026-01"):  # every page, as needed
        ...
    statement = tally.get_statement("prog_...", "alice", currency="usd").data
    tally.hold_sale("prog_...", "in_123", reason="dispute opened")  # an owner's; explain_sale reads it

`AsyncTally` has the same methods, awaited. Every call takes `timeout=` and `retry=` for itself.
Errors are `TallyAPIError` subclasses keyed on the API's `error.code`, carrying the raw answer;
a key flagged for rotation emits `ApiKeyRotationWarning` and sets `result.rotation_deadline`.
`tally_sdk.renewals.handle_invoice_paid` tracks subscription renewals. `result.data` is typed
(`tally_sdk.responses`); `logging.getLogger("tally_sdk")` logs each request at DEBUG and each
retry at INFO (never a credential or a body); `tally_sdk.__version__` is the SDK's version.
"""

import logging

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
from tally_sdk.pagination import AsyncPager, Page, Pager
from tally_sdk.responses import (
    ApiWarning,
    Balance,
    CommissionRow,
    ExplainStep,
    LeadData,
    LedgerLine,
    NotPaid,
    PartnerData,
    PayoutBatch,
    PayoutRow,
    PayoutTotal,
    ProgramData,
    RefundData,
    RowFailure,
    SaleData,
    SaleExplanation,
    SaleLine,
    SaleLines,
    SaleRow,
    SaleTestModeData,
    Statement,
    StatementEntry,
)

# A library's logger stays silent until the application configures logging.
logging.getLogger("tally_sdk").addHandler(logging.NullHandler())

__all__ = [
    "ApiKeyRotationRequired",
    "ApiKeyRotationWarning",
    "ApiWarning",
    "AsyncPager",
    "AsyncTally",
    "AuthenticationError",
    "BadRequestError",
    "Balance",
    "CommissionRow",
    "ConfigurationError",
    "ConflictError",
    "ConnectionFailed",
    "DuplicateError",
    "ExplainStep",
    "InvalidResponseError",
    "LeadData",
    "LedgerLine",
    "NotFoundError",
    "NotPaid",
    "Page",
    "Pager",
    "PartnerData",
    "PayoutBatch",
    "PayoutRow",
    "PayoutTotal",
    "PermissionDeniedError",
    "ProgramData",
    "RateLimitError",
    "RefundData",
    "RetryPolicy",
    "RowFailure",
    "SaleData",
    "SaleExplanation",
    "SaleLine",
    "SaleLines",
    "SaleRow",
    "SaleTestModeData",
    "ServerError",
    "Statement",
    "StatementEntry",
    "Tally",
    "TallyAPIError",
    "TrackResult",
    "ValidationError",
    "__version__",
]
