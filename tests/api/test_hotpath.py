"""The track endpoints' fast lane (api/hotpath.py) answers exactly as the full Starlette stack.

Each case is sent twice to one app: through the fast lane, then with the fast lane switched off
(every request through middleware and router). Status, headers and body must match once the
values that differ per request anyway (ids, request ids, dates) are masked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
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


# -- the lane's edges: what a malformed, oversized, mistyped or over-filled body gets --------------
REFUND = "/api/v1/track/refund"
LEAD = "/api/v1/track/lead"
CLICK = "/api/v1/track/click"
_JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("n", "path", "content", "headers"),
    [
        (30, SALE, b"", _JSON),  # empty
        (31, SALE, b'{"transaction_id": "in", "amount": 5', _JSON),  # truncated
        (32, SALE, b'{"transaction_id": "in"} trailing', _JSON),
        (33, SALE, b'{"transaction_id": "in_\\ud800", "customer_external_id": "c", "amount": 5}', _JSON),
        (34, SALE, b'{"transaction_id": "in", "customer_external_id": "c", "amount": NaN}', _JSON),
        (35, SALE, b'{"transaction_id": "in", "customer_external_id": "c", "amount": 1e400}', _JSON),
        (
            36,
            SALE,
            b'{"transaction_id": "in", "customer_external_id": "c", "amount": 99999999999999999999}',
            _JSON,
        ),
        (37, SALE, b'"just a string"', _JSON),
        (38, SALE, b"\xff\xfe{}", _JSON),  # not UTF-8
        (
            39,
            SALE,
            b'{"transaction_id": "in", "customer_external_id": "c", "amount": 5, "coupon": "x"}',
            _JSON,
        ),
        (40, SALE, b'{"transaction_id": "in", "customer_external_id": "c", "amount": true}', _JSON),
        (43, SALE, b"x" * (1024 * 1024 + 1), {"content-type": "application/octet-stream"}),
        (44, REFUND, b'{"transaction_id": "in", "refund_id": "r", "amount": 1, "extra": 1}', _JSON),
        (45, REFUND, b"{", _JSON),
        (46, LEAD, b'{"customer_external_id": "u", "unknown": 1}', _JSON),
        (47, CLICK, b'{"program_id": "p", "partner_code": "alice", "utm": "x"}', _JSON),
        (48, CLICK, b"[]", _JSON),
    ],
)
def test_fast_lane_edges_answer_like_the_full_stack(
    world: World, n: int, path: str, content: bytes, headers: dict[str, str]
) -> None:
    _both(world, "POST", path, n, content=content, headers={**world.key, **headers})


@pytest.mark.parametrize(("n", "headers"), [(41, {"content-type": "text/plain"}), (42, {})])
def test_fast_lane_takes_json_whatever_its_content_type_like_the_full_stack(
    world: World, n: int, headers: dict[str, str]
) -> None:
    """The body is read as JSON whatever Content-Type says (or without one), in both lanes."""
    sale = {"transaction_id": "in", "customer_external_id": "c", "amount": 5}
    _both(world, "POST", SALE, n, json=sale, headers={**world.key, **headers})


def test_fast_lane_refuses_an_oversized_body_sent_in_chunks_like_the_full_stack(world: World) -> None:
    """No Content-Length (chunked): the lane reads up to the limit and refuses, as the full stack."""

    def chunks() -> Iterator[bytes]:
        yield b'{"transaction_id": "'
        for _ in range(17):
            yield b"x" * 65536
        yield b'"}'

    answers = []
    for table in (world.client.app.hot, {}):  # type: ignore[attr-defined]
        saved, world.client.app.hot = world.client.app.hot, table  # type: ignore[attr-defined]
        r = world.client.post(SALE, content=chunks(), headers={**world.key, **_JSON})
        world.client.app.hot = saved  # type: ignore[attr-defined]
        assert "content-length" not in r.request.headers
        answers.append(_shape(r))
    assert answers[0] == answers[1]
    assert answers[0][0] == 413


def test_a_sale_in_one_lane_is_a_duplicate_in_the_other(world: World) -> None:
    body = {"transaction_id": "in_both_lanes", "customer_external_id": "c", "amount": 5}
    first = world.client.post(SALE, json=body, headers=world.key)
    saved, world.client.app.hot = world.client.app.hot, {}  # type: ignore[attr-defined]
    second = world.client.post(SALE, json=body, headers=world.key)
    world.client.app.hot = saved  # type: ignore[attr-defined]
    assert first.status_code == 200
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "duplicate_transaction"
