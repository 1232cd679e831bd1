"""Unexpected errors: the 500 envelope, one log record with the request id, and the keep-alive
connection kept (a real uvicorn server in a thread, with `tally serve`'s configuration)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from api import serving
from api.app import create_app
from api.settings import Settings
from ingest import tracking
from tests.conftest import World


async def boom(request: Request) -> Response:
    raise RuntimeError("boom: a bug on a non-hot route")


@pytest.fixture
def server(settings: Settings) -> Iterator[int]:
    app = create_app(settings)
    app.router.routes.append(Route("/test/boom", boom, methods=["GET"]))
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))  # bound here and handed over: no other test can take it
    port = listening.getsockname()[1]
    srv = uvicorn.Server(serving.config(app, "127.0.0.1", port, header_timeout=10))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not srv.started:
            assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
            time.sleep(0.02)
        yield port
    finally:
        srv.should_exit = True
        thread.join(20)
        listening.close()


def read_response(sock: socket.socket, buffered: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length from `sock` (leftovers stay in `buffered`)."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buffered += chunk
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection mid-body")
        rest += chunk
    buffered[:] = rest[length:]
    return int(lines[0].split()[1]), headers, rest[:length]


def get(path: str, request_id: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\nX-Request-Id: {request_id}\r\n\r\n".encode()


def test_unexpected_error_answers_envelope_and_keeps_connection(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tally.api")
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        buffered = bytearray()
        sock.sendall(get("/test/boom", "req-boom-1"))
        status, headers, body = read_response(sock, buffered)
        sock.sendall(get("/healthz", "req-after-boom"))  # the same connection serves the next one
        next_status, next_headers, _ = read_response(sock, buffered)
    assert status == 500
    assert headers["x-request-id"] == "req-boom-1"
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "internal_error"
    assert "close" not in headers.get("connection", "")
    assert next_status == 200
    assert next_headers["x-request-id"] == "req-after-boom"
    records = [r for r in caplog.records if r.name == "tally.api" and r.levelno == logging.ERROR]
    assert len(records) == 1
    record = records[0]
    assert "req-boom-1" in record.getMessage() and "GET /test/boom" in record.getMessage()
    assert record.__dict__["request_id"] == "req-boom-1"
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)
    assert not [r for r in caplog.records if r.name.startswith("uvicorn")]


def test_fast_lane_logs_the_same_way(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom: a bug on the fast lane")

    monkeypatch.setattr(tracking, "record_sale", broken)
    caplog.set_level(logging.ERROR, logger="tally.api")
    headers = {**world.key, "X-Request-Id": "req-hot-boom"}
    r = world.client.post("/api/v1/track/sale", json={"transaction_id": "t", "amount": 1}, headers=headers)
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert r.headers["x-request-id"] == "req-hot-boom"
    (record,) = [r for r in caplog.records if r.name == "tally.api"]
    assert record.__dict__["request_id"] == "req-hot-boom"
    assert "POST /api/v1/track/sale" in record.getMessage()
    assert record.exc_info is not None


def test_full_stack_answers_envelope_through_asgi(settings: Settings) -> None:
    app = create_app(settings)
    app.router.routes.append(Route("/test/boom", boom, methods=["GET"]))
    with TestClient(app) as client:  # raise_server_exceptions: nothing may be re-raised
        r = client.get("/test/boom", headers={"X-Request-Id": "req-asgi-boom"})
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert r.headers["x-request-id"] == "req-asgi-boom"
