"""`Tally`, the synchronous server client on httpx (`AsyncTally`, its async twin, is
`tally_sdk.async_client`'s and is importable from here too).

Both build calls with `tally_sdk._bodies` (track) and `tally_sdk._reads` (reads) and drive the
same retry/response generator from `tally_sdk._core`; they differ only in how they send and sleep.
Every method takes `timeout=` (seconds, or an `httpx.Timeout`) and `retry=` (a `RetryPolicy`) for
that call alone.

    tally = Tally()  # SERVICE_API_KEY, TALLY_ACCOUNT_TOKEN and TALLY_BASE_URL from the environment
    tally.track_sale(customer_external_id="user_42", amount=4900, invoice_id="in_123", timeout=3)
    for line in tally.list_commissions("prog_...", period="2026-01"):
        ...
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import date, datetime
from types import TracebackType
from typing import Any, Self

import httpx

from tally_sdk import _bodies, _reads
from tally_sdk._base import DEFAULT_TIMEOUT, Settings, Timeout
from tally_sdk._core import Call, RetryPolicy, TrackResult, attempts
from tally_sdk.async_client import AsyncTally  # (its own module; importable from here too)
from tally_sdk.pagination import Pager
from tally_sdk.responses import (
    CommissionRow,
    LeadData,
    PartnerData,
    PayoutBatch,
    ProgramData,
    RefundData,
    SaleData,
    SaleExplanation,
    SaleLines,
    SaleRow,
    SaleTestModeData,
    Statement,
)

__all__ = ["DEFAULT_TIMEOUT", "AsyncTally", "Tally"]


class Tally(Settings):
    """Synchronous client. `api_key` (the program key, `SERVICE_API_KEY`) makes the track calls,
    `account_token` (`acct_...`, `TALLY_ACCOUNT_TOKEN`) the reads; either may be left out.
    `transport` accepts any `httpx.BaseTransport` (tests, ASGI apps)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        account_token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(base_url, api_key, account_token, retry)
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.base_url, headers=self._headers, transport=transport, timeout=timeout
        )

    def track_sale(
        self,
        *,
        customer_external_id: str,
        amount: int,
        invoice_id: str,
        currency: str = "usd",
        is_recurring: bool | None = None,
        sale_type: str | None = None,
        subscription_id: str | None = None,
        email: str | None = None,
        click_id: str | None = None,
        occurred_at: datetime | str | None = None,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[SaleData]:
        """Record a sale. A non-positive amount raises `ValidationError` without a request."""
        call = _bodies.sale_call(
            customer_external_id=customer_external_id,
            amount=amount,
            invoice_id=invoice_id,
            currency=currency,
            is_recurring=is_recurring,
            sale_type=sale_type,
            subscription_id=subscription_id,
            email=email,
            click_id=click_id,
            occurred_at=occurred_at,
        )
        return self._call(call, timeout, retry)

    def track_sale_payload(
        self, payload: Mapping[str, Any], *, timeout: Timeout = None, retry: RetryPolicy | None = None
    ) -> TrackResult[SaleData]:
        """`track_sale` with the documented camelCase shape (`customerExternalId`, ...)."""
        return self._call(_bodies.sale_call_from_payload(payload), timeout, retry)

    def track_test_sale(
        self, *, timeout: Timeout = None, retry: RetryPolicy | None = None
    ) -> TrackResult[SaleTestModeData]:
        """Send the test-mode sale (`additional_data.test_mode`); `data.test_mode` is true."""
        return self._call(_bodies.make_test_sale_call(), timeout, retry)

    def track_lead(
        self,
        *,
        customer_external_id: str,
        email: str | None = None,
        click_id: str | None = None,
        name: str | None = None,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[LeadData]:
        """Record a server-mode lead (signup) for the key's program."""
        call = _bodies.lead_call(
            customer_external_id=customer_external_id, email=email, click_id=click_id, name=name
        )
        return self._call(call, timeout, retry)

    def track_refund(
        self,
        *,
        transaction_id: str,
        refund_id: str,
        amount: int,
        reason: str | None = None,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[RefundData]:
        """Record a refund of the sale `transaction_id`; `refund_id` is the idempotency key."""
        call = _bodies.refund_call(
            transaction_id=transaction_id, refund_id=refund_id, amount=amount, reason=reason
        )
        return self._call(call, timeout, retry)

    # -- reads (account token): iterators over every row, fetched page by page -----------------
    def list_sales(
        self,
        program_id: str,
        *,
        transaction_id: str | None = None,
        start: date | datetime | str | None = None,
        end: date | datetime | str | None = None,
        attributed: bool | None = None,
        page_size: int = _reads.DEFAULT_PAGE_SIZE,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> Pager[SaleRow]:
        """The program's reconciled sales, oldest first; `start` / `end` bound `occurred_at` (a
        date is its whole day, `end`'s included)."""
        listing = _reads.sales(
            program_id,
            transaction_id=transaction_id,
            start=start,
            end=end,
            attributed=attributed,
            page_size=page_size,
        )
        return Pager(listing, self._sender(timeout, retry))

    def list_commissions(
        self,
        program_id: str,
        *,
        period: str | date | None = None,
        page_size: int = _reads.DEFAULT_PAGE_SIZE,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> Pager[CommissionRow]:
        """The program's commission lines (of one month `period`, `YYYY-MM`, when given)."""
        listing = _reads.commissions(program_id, period=period, page_size=page_size)
        return Pager(listing, self._sender(timeout, retry))

    def list_payouts(
        self, program_id: str, *, timeout: Timeout = None, retry: RetryPolicy | None = None
    ) -> Pager[PayoutBatch]:
        """The program's payout batches, newest first (a workspace owner's token)."""
        return Pager(_reads.payouts(program_id), self._sender(timeout, retry))

    def list_partners(
        self, program_id: str, *, timeout: Timeout = None, retry: RetryPolicy | None = None
    ) -> Pager[PartnerData]:
        """The program's partners."""
        return Pager(_reads.partners(program_id), self._sender(timeout, retry))

    def get_partner(
        self, program_id: str, code: str, *, timeout: Timeout = None, retry: RetryPolicy | None = None
    ) -> TrackResult[PartnerData]:
        """One partner of the program, with their payout details and `balances` per currency
        (what they are owed, pending and held)."""
        return self._call(_reads.partner(program_id, code), timeout, retry)

    def get_statement(
        self,
        program_id: str,
        code: str,
        *,
        currency: str | None = None,
        start: date | datetime | str | None = None,
        end: date | datetime | str | None = None,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[Statement]:
        """A partner's statement in `currency` (needed when they have money in several): every
        entry owed to or paid to them, oldest first, each with the balance after it; the closing
        balance is what the next payout batch pays, before the minimum. `start` / `end` bound the
        entries (a date is its whole day, `end`'s included); what comes before is the opening
        balance."""
        call = _reads.statement(program_id, code, currency=currency, start=start, end=end)
        return self._call(call, timeout, retry)

    # -- one sale: explain it; hold, release or void its lines (a workspace owner's) ---------------
    def explain_sale(
        self,
        program_id: str,
        transaction_id: str,
        *,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[SaleExplanation]:
        """How the sale `transaction_id` was attributed, step by step, and its commission lines
        with their bookings (`NotFoundError` `sale_not_found` before a reconcile run has seen it).
        Any id the ingest accepted works: it travels as one encoded path segment."""
        return self._call(_reads.explain(program_id, transaction_id), timeout, retry)

    def hold_sale(
        self,
        program_id: str,
        transaction_id: str,
        *,
        reason: str,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[SaleLines]:
        """Hold the sale's unpaid commission lines (never approved or batched while held), for
        `reason`; a workspace owner's token. `ConflictError` when a line is in an open batch
        (`line_in_batch`), paid (`line_paid`) or already held (`invalid_transition`)."""
        return self._act(program_id, transaction_id, "hold", reason, timeout, retry)

    def release_sale(
        self,
        program_id: str,
        transaction_id: str,
        *,
        reason: str,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[SaleLines]:
        """Release a held sale, for `reason`: its lines become pending, then approved after the
        holding period; a workspace owner's token."""
        return self._act(program_id, transaction_id, "release", reason, timeout, retry)

    def void_sale(
        self,
        program_id: str,
        transaction_id: str,
        *,
        reason: str,
        timeout: Timeout = None,
        retry: RetryPolicy | None = None,
    ) -> TrackResult[SaleLines]:
        """Void the sale's unpaid commission lines, for `reason`: never payable, the platform
        fee void too; a workspace owner's token (`ConflictError` as for `hold_sale`)."""
        return self._act(program_id, transaction_id, "void", reason, timeout, retry)

    def list_programs(
        self, *, timeout: Timeout = None, retry: RetryPolicy | None = None
    ) -> Pager[ProgramData]:
        """The programs of every workspace the account token belongs to."""
        return Pager(_reads.programs(), self._sender(timeout, retry))

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _act(
        self,
        program_id: str,
        transaction_id: str,
        action: str,
        reason: str,
        timeout: Timeout,
        retry: RetryPolicy | None,
    ) -> TrackResult[SaleLines]:
        return self._call(_reads.sale_action(program_id, transaction_id, action, reason), timeout, retry)

    def _sender(self, timeout: Timeout, retry: RetryPolicy | None) -> Callable[[Call], TrackResult[Any]]:
        return lambda call: self._call(call, timeout, retry)

    def _call(
        self, call: Call, timeout: Timeout = None, retry: RetryPolicy | None = None
    ) -> TrackResult[Any]:
        request = self._http.build_request(**self.request_args(call, timeout))
        steps = attempts(call, retry or self.retry)
        delay = next(steps)
        while True:
            if delay > 0:
                self._sleep(delay)
            outcome: httpx.Response | httpx.TransportError
            started = time.monotonic()
            try:
                outcome = self._http.send(request)
            except httpx.TransportError as exc:
                outcome = exc
            try:
                delay = steps.send((outcome, time.monotonic() - started))
            except StopIteration as done:
                result: TrackResult[Any] = done.value
                return result
