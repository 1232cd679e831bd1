"""The track endpoints' fast lane (api/hotpath.py) answers exactly as the full Starlette stack.

Each case is sent twice to one app: through the fast lane, then with the fast lane switched off
(every request through middleware and router). Status, headers and body must match once the
values that differ per request anyway (ids, request ids, dates) are masked.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import orjson
import pytest

from ingest.stripe import sign
from tests.conftest import OPERATOR_TOKEN, WEBHOOK_SECRET, World, bearer

_VOLATILE = re.compile(r"\b(sale|lead|clk|req|ref|evt)_[0-9a-f]{24}\b")
_PER_RUN = ("date", "x-request-id", "content-length")


def _shape(r: httpx.Response) -> tuple[int, dict[str, str], Any]:
    headers = {k: v for k, v in r.headers.items() if k not in _PER_RUN}
    body = _VOLATILE.sub(r"\1_*", r.text)
    return r.status_code, headers, body


def _both(world: World, method: str, path: str, n: int, **kwargs: Any) -> None:
    """Send a request (made unique by `n`) through each lane and compare the answers."""
    app = world.client.app
    hot = dict(app.hot)  # type: ignore[attr-defined]
    answers = []
    original = kwargs.get("json")
    for lane, table in (("fast", hot), ("full", {})):
        app.hot = table  # type: ignore[attr-defined]
        if isinstance(original, dict):
            unique = ("transaction_id", "refund_id")
            kwargs["json"] = {k: (f"{v}-{lane}" if k in unique else v) for k, v in original.items()}
        r = world.client.request(method, path, **kwargs)
        assert r.headers["x-request-id"]
        answers.append(_shape(r))
    app.hot = hot  # type: ignore[attr-defined]
    fast, full = answers
    masked = [(s, h, b.replace("-fast", "-*").replace("-full", "-*")) for s, h, b in (fast, full)]
    assert masked[0] == masked[1], f"case {n}: {method} {path}"


SALE = "/api/v1/track/sale"


@pytest.mark.parametrize(
    ("n", "method", "path", "kwargs"),
    [
        (1, "POST", SALE, {"json": {"transaction_id": "in", "customer_external_id": "c", "amount": 5}}),
        (2, "POST", SALE, {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        (3, "POST", SALE, {"json": [1, 2]}),
        (4, "POST", SALE, {"json": {"transaction_id": "in", "amount": "ten"}}),
        (5, "POST", SALE, {"json": {"transaction_id": "in", "customer_external_id": "c", "amount": 0}}),
        (6, "POST", SALE, {"content": b"x" * (1024 * 1024 + 1)}),
        (
            7,
            "POST",
            "/api/v1/track/refund",
            {"json": {"transaction_id": "nope", "refund_id": "r", "amount": 1}},
        ),
        (8, "POST", "/api/v1/track/lead", {"json": {"customer_external_id": "u1"}}),
        (9, "POST", "/api/v1/track/click", {"json": {"program_id": "prog_nope", "partner_code": "alice"}}),
    ],
)
def test_fast_lane_answers_like_the_full_stack(
    world: World, n: int, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    _both(world, method, path, n, headers={**world.key, **kwargs.pop("headers", {})}, **kwargs)


def test_fast_lane_refusals_match_for_credentials(world: World) -> None:
    body = {"json": {"transaction_id": "in", "customer_external_id": "c", "amount": 5}}
    _both(world, "POST", SALE, 10, **body)  # no credential
    _both(world, "POST", SALE, 11, headers={"Authorization": "Basic abc"}, **body)
    _both(world, "POST", SALE, 12, headers=bearer("aff_unknown"), **body)
    _both(world, "POST", SALE, 13, headers=bearer(OPERATOR_TOKEN), **body)
    _both(world, "POST", SALE, 14, headers={**world.key, "X-Request-Id": "client-id-1"}, **body)


def test_fast_lane_keeps_the_client_request_id_and_cors(world: World) -> None:
    r = world.client.post(
        "/api/v1/track/click",
        json={"program_id": world.program_id, "partner_code": "alice"},
        headers={"X-Request-Id": "brand-req-7"},
    )
    assert r.status_code == 201
    assert r.headers["x-request-id"] == "brand-req-7"
    assert r.headers["access-control-allow-origin"] == "*"
    r = world.client.post(SALE, content=b"[", headers={**world.key, "X-Request-Id": "bad id with spaces"})
    assert r.status_code == 400
    assert r.headers["x-request-id"].startswith("req_")


def test_fast_lane_answers_webhooks_like_the_full_stack(world: World) -> None:
    def event(n: int) -> bytes:
        return orjson.dumps(
            {"id": f"evt_lane_{n}", "object": "event", "type": "customer.created", "data": {}}
        )

    now = int(time.time())
    for n, body, signature in (
        (20, event(20), sign(event(20), WEBHOOK_SECRET, now)),
        (21, event(21), "t=1,v1=deadbeef"),
        (22, b"{broken", sign(b"{broken", WEBHOOK_SECRET, now)),
        (23, event(23), None),
    ):
        answers = []
        for table in (world.client.app.hot, {}):  # type: ignore[attr-defined]
            saved, world.client.app.hot = world.client.app.hot, table  # type: ignore[attr-defined]
            headers = {"Content-Type": "application/json"}
            if signature is not None:
                headers["Stripe-Signature"] = signature
            answers.append(_shape(world.client.post("/webhooks/stripe", content=body, headers=headers)))
            world.client.app.hot = saved  # type: ignore[attr-defined]
        fast, full = answers
        if n == 20:  # the same event twice: the second answer says duplicate
            assert fast[0] == full[0] == 200
            assert fast[1] == full[1]
            continue
        assert fast == full, f"case {n}"
