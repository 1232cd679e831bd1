"""Domain errors. Each carries the contract's `code` and HTTP `status`; `api/errors.py` is the one
place that turns them into the JSON error envelope."""

from __future__ import annotations

from typing import Any, ClassVar


class TallyError(Exception):
    """Base of every error a client may see: a stable `code`, a status and a human message."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra: dict[str, Any] = extra
        self.logged = False  # set once a tracking-log line recorded this refusal
        self.check: str | None = None  # which part of the check failed (a refusal's log note)


class InvalidJson(TallyError):
    """Raised by body parsing when a request body is not a JSON object."""

    code = "invalid_json"
    status = 400


class InvalidSignature(TallyError):
    """Raised by webhook verification when the processor signature is missing, wrong or too old."""

    code = "invalid_signature"
    status = 400


class MissingCredentials(TallyError):
    """Raised by auth when an endpoint needs a credential and no Authorization header was sent."""

    code = "missing_credentials"
    status = 401


class MalformedAuthorization(TallyError):
    """Raised by auth when the Authorization header is not `Bearer <token>`."""

    code = "malformed_authorization"
    status = 401


class InvalidApiKey(TallyError):
    """Raised by auth when a program key matches no program (unknown, or replaced)."""

    code = "invalid_api_key"
    status = 401


class ApiKeyRotationRequired(TallyError):
    """Raised by auth when a key flagged for rotation is used at or after its deadline."""

    code = "api_key_rotation_required"
    status = 401


class ProgramKeyRequired(TallyError):
    """Raised by auth when a track endpoint gets a credential that is not a program key."""

    code = "program_key_required"
    status = 401


class AgentKeyRequired(TallyError):
    """Raised by auth when an agent endpoint gets a credential that is not an agent key."""

    code = "agent_key_required"
    status = 401


class AccountTokenRequired(TallyError):
    """Raised by auth when an account endpoint gets a credential that is not an account token."""

    code = "account_token_required"
    status = 401


class OperatorTokenRequired(TallyError):
    """Raised by auth when an operator endpoint gets anything but the operator token."""

    code = "operator_token_required"
    status = 401


class OwnerRequired(TallyError):
    """Raised when a workspace member (not an owner) attempts an owner action."""

    code = "owner_required"
    status = 403


class InsufficientScope(TallyError):
    """Raised when an agent key lacks the scope an agent endpoint requires."""

    code = "insufficient_scope"
    status = 403


class ProgramNotFound(TallyError):
    """Raised when a program id is unknown or belongs to a workspace the caller cannot see."""

    code = "program_not_found"
    status = 404


class PartnerNotFound(TallyError):
    """Raised when a partner code is unknown in the program."""

    code = "partner_not_found"
    status = 404


class SaleNotFound(TallyError):
    """Raised when a sale (transaction id) is unknown in the program."""

    code = "sale_not_found"
    status = 404


class NotFound(TallyError):
    """Raised for any other unknown resource or path."""

    code = "not_found"
    status = 404


class MethodNotAllowed(TallyError):
    """Raised when a known path is called with a method it does not support."""

    code = "method_not_allowed"
    status = 405


class DuplicateTransaction(TallyError):
    """Raised by track/sale when the transaction id is already recorded for the program."""

    code = "duplicate_transaction"
    status = 409


class DuplicateRefund(TallyError):
    """Raised by track/refund when the refund id is already recorded for the program."""

    code = "duplicate_refund"
    status = 409


class Conflict(TallyError):
    """Raised when a resource to create already exists (e.g. a partner code)."""

    code = "conflict"
    status = 409


class LinePaid(TallyError):
    """Raised by a finance action (hold, void) on a sale one of whose lines is in a payout batch:
    a paid line never changes (a refund after payment is a clawback)."""

    code = "line_paid"
    status = 409


class LineInBatch(TallyError):
    """Raised by a finance action (hold, void) on a sale one of whose lines an open payout batch
    holds: cancel the batch first (its `payout_id` is in the message and in `error.payout_id`)."""

    code = "line_in_batch"
    status = 409


class BatchPaid(TallyError):
    """Raised by cancelling a payout batch that is paid already: money was sent; a row whose
    payment bounced is marked failed instead."""

    code = "batch_paid"
    status = 409


class CurrencyNotSupported(TallyError):
    """Raised by a payout file (PayPal, Wise) asked for in a currency that service cannot pay."""

    code = "currency_not_supported"
    status = 422


class InvalidTransition(TallyError):
    """Raised by a finance action its lines' state does not allow (release of a line not held,
    hold of a held or void one, anything on a void one)."""

    code = "invalid_transition"
    status = 409


class StripeAccountInUse(TallyError):
    """Raised when a program setting names a processor account used by another workspace's program."""

    code = "stripe_account_in_use"
    status = 409


class RequestTimeout(TallyError):
    """Raised when a client sends its request body too slowly (the connection is then closed)."""

    code = "request_timeout"
    status = 408


class PayloadTooLarge(TallyError):
    """Raised by body parsing when a request body exceeds 1 MiB."""

    code = "payload_too_large"
    status = 413


class ValidationFailed(TallyError):
    """Raised when a request body violates its schema; `fields` lists each violation."""

    code = "validation_error"
    status = 422


class ProgramMismatch(TallyError):
    """Raised when a body names a program other than the one the credential is scoped to."""

    code = "program_mismatch"
    status = 422


class RefundExceedsSale(TallyError):
    """Raised by track/refund when the amount exceeds what is left to refund on the sale."""

    code = "refund_exceeds_sale"
    status = 422


class RateLimited(TallyError):
    """Raised when a client exceeds its request rate; carries `retry_after` seconds."""

    code = "rate_limited"
    status = 429


class ReconcileRunning(TallyError):
    """Raised at once when a call needs the reconcile run lock (reconcile, payouts, backfill,
    period close) while a run holds it, here or on another replica; carries `retry_after`
    seconds (the `Retry-After` header). No thread waits for the lock."""

    code = "reconcile_running"
    status = 409


class ServiceUnavailable(TallyError):
    """Raised when the server cannot accept writes right now (starting or shutting down)."""

    code = "service_unavailable"
    status = 503


class DatabaseUnavailable(TallyError):
    """Raised when the database or its journal cannot be written (disk full, unreachable); nothing
    of the request was acknowledged, and `/readyz` answers 503 until it recovers. Answered with
    `Retry-After: retry_after` (seconds)."""

    code = "database_unavailable"
    status = 503
    retry_after = 1


ALL_ERRORS: tuple[type[TallyError], ...] = tuple(
    cls for cls in list(globals().values()) if isinstance(cls, type) and issubclass(cls, TallyError)
)
