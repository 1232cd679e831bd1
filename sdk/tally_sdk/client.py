"""`Tally` (sync) and `AsyncTally` (async) server clients on httpx.

Both build bodies with `tally_sdk._bodies` and drive the same retry/response generator from
`tally_sdk._core`; they differ only in how they send and sleep.

    tally = Tally()  # SERVICE_API_KEY and TALLY_BASE_URL from the environment
    tally.track_sale(customer_external_id="user_42", amount=4900, invoice_id="in_123")
    tally.track_sale_payload({"customerExternalId": "user_42", "amount": 4900, "invoiceId": "in_123"})
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import httpx

from tally_sdk import _bodies
from tally_sdk._core import Call, RetryPolicy, TrackResult, attempts, resolve_settings
from tally_sdk.responses import LeadData, RefundData, SaleData, SaleTestModeData

DEFAULT_TIMEOUT = 10.0


class _Settings:
    def __init__(self, base_url: str | None, api_key: str | None, retry: RetryPolicy | None):
        self.base_url, self._headers = resolve_settings(base_url, api_key)
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(base_url={self.base_url!r})"


class Tally(_Settings):
    """Synchronous client. `transport` accepts any `httpx.BaseTransport` (tests, ASGI apps)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(base_url, api_key, retry)
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
        return self._call(call)

    def track_sale_payload(self, payload: Mapping[str, Any]) -> TrackResult[SaleData]:
        """`track_sale` with the documented camelCase shape (`customerExternalId`, ...)."""
        return self._call(_bodies.sale_call_from_payload(payload))

    def track_test_sale(self) -> TrackResult[SaleTestModeData]:
        """Send the test-mode sale (`additional_data.test_mode`); `data.test_mode` is true."""
        return self._call(_bodies.make_test_sale_call())

    def track_lead(
        self,
        *,
        customer_external_id: str,
        email: str | None = None,
        click_id: str | None = None,
        name: str | None = None,
    ) -> TrackResult[LeadData]:
        """Record a server-mode lead (signup) for the key's program."""
        call = _bodies.lead_call(
            customer_external_id=customer_external_id, email=email, click_id=click_id, name=name
        )
        return self._call(call)

    def track_refund(
        self, *, transaction_id: str, refund_id: str, amount: int, reason: str | None = None
    ) -> TrackResult[RefundData]:
        """Record a refund of the sale `transaction_id`; `refund_id` is the idempotency key."""
        call = _bodies.refund_call(
            transaction_id=transaction_id, refund_id=refund_id, amount=amount, reason=reason
        )
        return self._call(call)

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, call: Call) -> TrackResult[Any]:
        steps = attempts(call, self.retry)
        delay = next(steps)
        request = self._http.build_request(**call.request_args())
        while True:
            if delay > 0:
                self._sleep(delay)
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = self._http.send(request)
            except httpx.TransportError as exc:
                outcome = exc
            try:
                delay = steps.send(outcome)
            except StopIteration as done:
                result: TrackResult[Any] = done.value
                return result


class AsyncTally(_Settings):
    """Asynchronous client; same methods as `Tally`, awaited."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(base_url, api_key, retry)
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, transport=transport, timeout=timeout
        )

    async def track_sale(
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
        return await self._call(call)

    async def track_sale_payload(self, payload: Mapping[str, Any]) -> TrackResult[SaleData]:
        """`track_sale` with the documented camelCase shape (`customerExternalId`, ...)."""
        return await self._call(_bodies.sale_call_from_payload(payload))

    async def track_test_sale(self) -> TrackResult[SaleTestModeData]:
        """Send the test-mode sale (`additional_data.test_mode`); `data.test_mode` is true."""
        return await self._call(_bodies.make_test_sale_call())

    async def track_lead(
        self,
        *,
        customer_external_id: str,
        email: str | None = None,
        click_id: str | None = None,
        name: str | None = None,
    ) -> TrackResult[LeadData]:
        """Record a server-mode lead (signup) for the key's program."""
        call = _bodies.lead_call(
            customer_external_id=customer_external_id, email=email, click_id=click_id, name=name
        )
        return await self._call(call)

    async def track_refund(
        self, *, transaction_id: str, refund_id: str, amount: int, reason: str | None = None
    ) -> TrackResult[RefundData]:
        """Record a refund of the sale `transaction_id`; `refund_id` is the idempotency key."""
        call = _bodies.refund_call(
            transaction_id=transaction_id, refund_id=refund_id, amount=amount, reason=reason
        )
        return await self._call(call)

    async def aclose(self) -> None:
        """Close the underlying connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _call(self, call: Call) -> TrackResult[Any]:
        steps = attempts(call, self.retry)
        delay = next(steps)
        request = self._http.build_request(**call.request_args())
        while True:
            if delay > 0:
                await self._sleep(delay)
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = await self._http.send(request)
            except httpx.TransportError as exc:
                outcome = exc
            try:
                delay = steps.send(outcome)
            except StopIteration as done:
                result: TrackResult[Any] = done.value
                return result
