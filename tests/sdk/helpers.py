"""Scripted httpx transports and envelope builders for the SDK tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from sdk import AsyncTally, RetryPolicy, Tally
from tests.stripe_fixtures import load_event, with_metadata

BASE_URL = "http://tally.test"
API_KEY = "aff_test0123456789abcdefghijklmnopqrstuv"

Answer = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class Script:
    """A MockTransport handler: answers in order (the last one repeats) and records requests."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers) or [ok({})]
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return answer(request)

    @property
    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


class Sleeps(list[float]):
    """Records the delays a client asked for instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)

    async def asleep(self, seconds: float) -> None:
        self.append(seconds)


def ok(data: Any, warnings: list[Any] | None = None, **headers: str) -> httpx.Response:
    body: dict[str, Any] = {"data": data}
    if warnings is not None:
        body["warnings"] = warnings
    return httpx.Response(200, json=body, headers={"X-Request-Id": "req_1", **headers})


def err(status: int, code: str, message: str = "refused", **extra: Any) -> httpx.Response:
    error = {"code": code, "message": message, "doc_url": f"{BASE_URL}/docs/errors#{code}"}
    error.update(extra)
    headers = {"X-Request-Id": "req_err"}
    return httpx.Response(status, json={"error": error}, headers=headers)


def client(script: Script, sleeps: Sleeps | None = None, retries: int = 2) -> Tally:
    return Tally(
        base_url=BASE_URL,
        api_key=API_KEY,
        transport=httpx.MockTransport(script),
        retry=RetryPolicy(max_retries=retries),
        sleep=sleeps if sleeps is not None else Sleeps(),
    )


def async_client(script: Script, sleeps: Sleeps | None = None, retries: int = 2) -> AsyncTally:
    return AsyncTally(
        base_url=BASE_URL,
        api_key=API_KEY,
        transport=httpx.MockTransport(script),
        retry=RetryPolicy(max_retries=retries),
        sleep=(sleeps if sleeps is not None else Sleeps()).asleep,
    )


# -- a renewal invoice in the legacy layout, and the sale the SDK tracks for it ------------------
KEY = {"svc_customer_key": "user_42", "svc_click_id": "clk_1", "program_id": "prog_1"}


def legacy_cycle(amount: Any = 4900) -> dict[str, Any]:
    """Legacy layout: top-level `subscription` string and `subscription_details.metadata`."""
    event = with_metadata(load_event("stripe-sync-engine__invoice_paid.json"), KEY, "legacy")
    event["data"]["object"]["amount_paid"] = amount
    return event


LEGACY_SALE = {
    "customerExternalId": "user_42",
    "invoiceId": "in_1KJqKBJDPojXS6LNJbvLUgEy",
    "amount": 4900,
    "currency": "usd",
    "isRecurring": True,
    "saleType": "subscription",
    "subscriptionId": "sub_JsuPyCPhXWfZar",
    "occurred_at": "2022-01-20T03:25:10Z",
}
