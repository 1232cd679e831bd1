"""The SDK tests' transport: `RealApp` puts the in-process tally behind an httpx transport. It
answers with the app's own responses; the faults a test scripts are built from the app too (its
error map, its real answer altered or lost on the way back), and only what no tally answers (a
proxy's page, a network failure) is written by hand."""

from __future__ import annotations

import copy
import json
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import httpx
from starlette.requests import Request

from api.errors import error_response
from ingest.domain.errors import TallyError
from tally_sdk import AsyncTally, RetryPolicy, Tally
from tests.conftest import World
from tests.stripe_fixtures import load_event, with_metadata

Answer = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class Sleeps(list[float]):
    """Records the delays a client asked for instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)

    async def asleep(self, seconds: float) -> None:
        self.append(seconds)


class Refusal(TallyError):
    """An error of any code and status, for the app's error map to answer."""

    def __init__(self, code: str, status: int, message: str, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.code, self.status = code, status  # type: ignore[misc]


# -- the real app behind an httpx transport -------------------------------------------------------
APP_URL = "http://testserver"  # the in-process app's base URL (doc_url and Link point there)


class RealApp:
    """A MockTransport handler in front of the real app of `world` (its TestClient's lifespan runs):
    records each request and answers it with the app's own response, unless a scripted fault is
    due (in order): an exception (the network failed), a response, or a callable of the request.
    `mount` is the path a reverse proxy serves the app under (stripped before the app sees it)."""

    def __init__(self, world: World, *faults: Answer, mount: str = "") -> None:
        self.world = world
        self.faults = list(faults)
        self.mount = mount
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        fault = self.faults.pop(0) if self.faults else None
        if fault is None:
            return self.forward(request)
        if isinstance(fault, Exception):
            # a fresh exception per raise: a scripted one (a parametrize value, a list `* 3`) lives
            # as long as the module, and its traceback would keep this test's frames, with their
            # database connections, alive until the interpreter exits
            raise copy.copy(fault).with_traceback(None)
        if isinstance(fault, httpx.Response):
            return fault
        return fault(request)

    def forward(self, request: httpx.Request) -> httpx.Response:
        """The app's answer to `request`, as an httpx response."""
        path = request.url.raw_path.decode()
        assert path.startswith(self.mount), f"{path} is not under {self.mount}"
        answer = self.world.client.request(
            request.method, path.removeprefix(self.mount), content=request.content, headers=request.headers
        )
        return httpx.Response(
            answer.status_code, headers=answer.headers.multi_items(), content=answer.content
        )

    def lost(self, instead: Exception | httpx.Response) -> Callable[[httpx.Request], httpx.Response]:
        """A fault: the app processes the request, then its answer is lost on the way back: the
        client sees `instead` (a network error raised, or a proxy's page such as `proxy(504)`)."""

        def answer(request: httpx.Request) -> httpx.Response:
            self.forward(request)
            if isinstance(instead, Exception):
                raise instead
            return instead

        return answer

    def altered(
        self, edit: Callable[[httpx.Response], httpx.Response]
    ) -> Callable[[httpx.Request], httpx.Response]:
        """A fault: the app's real answer to the request, changed by `edit` (a header added, a body
        key dropped: `reshaped`), for what another tally version or a proxy could send."""

        def answer(request: httpx.Request) -> httpx.Response:
            return edit(self.forward(request))

        return answer

    def error(self, error: TallyError) -> Callable[[httpx.Request], httpx.Response]:
        """A fault: `error` answered by the app's own error map (envelope, doc_url, headers) for
        the request, without running it; the app echoes the client's `X-Request-Id`."""

        def answer(request: httpx.Request) -> httpx.Response:
            scope = {
                "type": "http",
                "app": self.world.client.app,
                "method": request.method,
                "path": request.url.path,
                "headers": request.headers.raw,
                "query_string": request.url.query,
                "state": {},
            }
            response = error_response(Request(scope), error)
            headers = [(k.decode(), v.decode()) for k, v in response.raw_headers if k != b"content-length"]
            headers.append(("X-Request-Id", request.headers["x-request-id"]))
            return httpx.Response(response.status_code, headers=headers, content=bytes(response.body))

        return answer

    @property
    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


def reshaped(response: httpx.Response, body: Any) -> httpx.Response:
    """`response` (status and headers) with another JSON `body`."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k != "content-length"]
    return httpx.Response(response.status_code, headers=headers, json=body)


def outcomes(world: World) -> list[tuple[str, int, str, str]]:
    """The program's tracking log, oldest first: (endpoint, status, outcome, request id) of each
    request the app processed (faults built by `RealApp.error` never reach it)."""
    r = world.client.get(f"/api/v1/programs/{world.program_id}/tracking-log", headers=world.owner)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["next_before"] is None  # one page holds a test's few requests
    entries = reversed(r.json()["data"]["entries"])
    return [(e["endpoint"], e["status"], e["outcome"], e["request_id"]) for e in entries]


def proxy(status: int) -> httpx.Response:
    """What a proxy in front of tally answers when tally does not (502, 504): not tally's envelope."""
    reason = {502: "Bad Gateway", 504: "Gateway Timeout"}[status]
    return httpx.Response(status, text=f"<html><body><h1>{status} {reason}</h1></body></html>")


def real_client(app: RealApp, sleeps: Sleeps | None = None, retries: int = 2, **kwargs: Any) -> Tally:
    return Tally(
        **{"base_url": APP_URL, "api_key": app.world.api_key, **kwargs},
        transport=httpx.MockTransport(app),
        retry=RetryPolicy(max_retries=retries),
        sleep=sleeps if sleeps is not None else Sleeps(),
    )


def real_async_client(app: RealApp, sleeps: Sleeps | None = None, retries: int = 2) -> AsyncTally:
    return AsyncTally(
        base_url=APP_URL,
        api_key=app.world.api_key,
        transport=httpx.MockTransport(app),
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


def settled_lead(world: World, customer: str) -> str:
    """A real click for the world's partner and a settled server-mode lead for `customer` carrying
    it, so the customer's sales are attributed; returns the click id."""
    r = world.client.post(
        "/api/v1/track/click", json={"program_id": world.program_id, "partner_code": world.partner_code}
    )
    assert r.status_code == 201, r.text
    click_id = str(r.json()["data"]["click_id"])
    r = world.client.post(
        "/api/v1/track/lead", json={"customer_external_id": customer, "click_id": click_id}, headers=world.key
    )
    assert r.status_code == 200, r.text
    return click_id


# -- the typed response data against what the app answers ------------------------------------------
def shape_problems(data: Any, typed: Any) -> list[str]:
    """What keeps the JSON object `data` from being a `typed` (a TypedDict): missing or
    undeclared keys, values of another type (lists and nested TypedDicts followed)."""
    if not isinstance(data, dict):
        return [f"{typed.__name__}: {data!r} is not an object"]
    hints = get_type_hints(typed)
    problems = [
        f"{typed.__name__}: {k} missing from {data}" for k in sorted(typed.__required_keys__ - set(data))
    ]
    problems += [f"{typed.__name__}: {k} not declared, in {data}" for k in sorted(set(data) - set(hints))]
    for key, value in data.items():
        if key in hints and not conforms(value, hints[key]):
            problems.append(f"{typed.__name__}.{key}: {value!r} is not {hints[key]}")
    return problems


def conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a type hint made of str, int, bool, None, unions, Literals,
    lists, dicts and TypedDicts."""
    origin = get_origin(hint)
    if origin is Literal:
        return value in get_args(hint)
    if origin in (Union, types.UnionType):
        return any(conforms(value, arg) for arg in get_args(hint))
    if origin is list:
        return isinstance(value, list) and all(conforms(item, get_args(hint)[0]) for item in value)
    if origin is dict:
        keys, values = get_args(hint)
        return isinstance(value, dict) and all(
            conforms(k, keys) and conforms(v, values) for k, v in value.items()
        )
    if is_typeddict(hint):
        return not shape_problems(value, hint)
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    assert hint in (str, bool), f"conforms() does not know {hint!r}"
    return isinstance(value, hint)


def check_shape(data: Any, typed: Any) -> None:
    problems = shape_problems(data, typed)
    assert problems == [], problems
