"""`tally serve` as a process: client addresses behind the rate limit, slow clients timed out,
and a failed start reported in one line."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    OPERATOR_TOKEN,
    ROOT,
    WEBHOOK_SECRET,
    LiveServer,
    live_program,
    start_server,
)
from tests.stripe_fixtures import signed_delivery

pytestmark = pytest.mark.slow

CLICK = "/api/v1/track/click"
LIMITS = {"TALLY_PUBLIC_RATE_PER_SECOND": "0.001", "TALLY_PUBLIC_RATE_BURST": "3"}
TIMEOUTS = {
    "TALLY_HEADER_TIMEOUT_SECONDS": "1",
    "TALLY_BODY_TIMEOUT_SECONDS": "1",
    "TALLY_BODY_TOTAL_TIMEOUT_SECONDS": "3",
}
CLOSED_WITHIN = 10.0  # a generous bound for a 1 s timeout on a shared machine


def serve(tmp: Path, **env: str) -> Iterator[LiveServer]:
    server = start_server(tmp / "serve.duckdb", **env)
    try:
        yield server
    finally:
        server.stop()
        if server.process.stderr:
            server.process.stderr.close()


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve(tmp_path_factory.mktemp("untrusted"), **LIMITS, **TIMEOUTS)


@pytest.fixture(scope="module")
def behind_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve(tmp_path_factory.mktemp("proxy"), **LIMITS, TALLY_TRUSTED_PROXIES="127.0.0.1")


def clicks(
    server: LiveServer, n: int, forwarded: list[str] | None = None, source: str = "127.0.0.1"
) -> list[int]:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=server.url, transport=transport, timeout=10) as c:
        return [
            c.post(CLICK, json={}, headers={"X-Forwarded-For": forwarded[i]} if forwarded else {}).status_code
            for i in range(n)
        ]


# -- client address ----------------------------------------------------------------------------
def test_spoofed_forwarded_for_neither_escapes_nor_locks_out(untrusted: LiveServer) -> None:
    # From 127.0.0.1, the address uvicorn's own proxy-header handling trusted by default.
    statuses = clicks(untrusted, 5, [f"198.51.100.{i}" for i in range(5)])
    assert 429 not in statuses[:3]
    assert statuses[3:] == [429, 429]
    clicks(untrusted, 5, ["127.0.0.4"] * 5)  # naming another client (its victim) every time
    assert clicks(untrusted, 1, source="127.0.0.4") != [429]


def test_trusted_proxy_forwarded_address_is_the_client(behind_proxy: LiveServer) -> None:
    assert 429 not in clicks(behind_proxy, 5, [f"198.51.100.{i}" for i in range(5)])
    statuses = clicks(behind_proxy, 4, ["192.0.2.1"] * 4)
    assert statuses[-1] == 429
    assert clicks(behind_proxy, 1, ["192.0.2.2"]) != [429]


# -- slow clients ------------------------------------------------------------------------------
def connect(server: LiveServer, source: str) -> socket.socket:
    """A raw connection from its own loopback address (the rate-limit tests use up 127.0.0.1's)."""
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=CLOSED_WITHIN, source_address=(source, 0))


def closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes `sock` (reading and discarding anything it sends)."""
    start = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {CLOSED_WITHIN} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_partial_request_line_is_closed(untrusted: LiveServer) -> None:
    with connect(untrusted, "127.0.0.10") as sock:
        sock.sendall(b"POST /api/v1/track/cl")
        assert closed_after(sock) < CLOSED_WITHIN


def test_dribbled_headers_after_a_response_are_closed(untrusted: LiveServer) -> None:
    with connect(untrusted, "127.0.0.11") as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b" 200 " in sock.recv(65536)
        start = time.monotonic()
        try:  # one header byte every 0.2 s: never idle long, never finished
            for byte in b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 200:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
                if time.monotonic() - start > CLOSED_WITHIN:
                    pytest.fail("the server kept a dribbling connection open")
        except (BrokenPipeError, ConnectionResetError):
            return
        pytest.fail("the server kept a dribbling connection open")  # pragma: no cover


def test_stalled_body_gets_408_and_close(untrusted: LiveServer) -> None:
    with connect(untrusted, "127.0.0.12") as sock:
        sock.sendall(
            b"POST /api/v1/track/lead HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"customer_'
        )
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pytest.fail(f"no answer to a stalled body within {CLOSED_WITHIN} s")
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), received
    assert b"connection: close" in head.lower()
    assert b'"code":"request_timeout"' in body


@pytest.mark.parametrize("path", ["/api/v1/track/sale", "/webhooks/stripe"])
def test_stalled_body_on_the_fast_lane_gets_408_and_close(untrusted: LiveServer, path: str) -> None:
    """The ingest lanes take a body that came with its headers at once, and wait for the rest
    under the same timeouts as every endpoint (a sale's key is checked before its body)."""
    _, _, key = live_program(untrusted.url)
    with connect(untrusted, "127.0.0.16") as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n".encode()
            + f"Authorization: Bearer {key}\r\n".encode()
            + b'Content-Length: 100\r\n\r\n{"transaction_'
        )
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), received
    assert b"connection: close" in head.lower()
    assert b'"code":"request_timeout"' in body


def test_a_body_in_parts_is_read_whole_on_the_fast_lane(untrusted: LiveServer) -> None:
    """A sale whose body arrives in three parts, the last ones after the lane found nothing more
    waiting, is read whole: nothing of it is lost between the parts."""
    _, _, key = live_program(untrusted.url)
    body = b'{"transaction_id": "in_parts", "customer_external_id": "c_parts", "amount": 4321}'
    with connect(untrusted, "127.0.0.17") as sock:
        sock.sendall(
            b"POST /api/v1/track/sale HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body[:20]
        )
        for part in (body[20:50], body[50:]):
            time.sleep(0.3)  # within the 1 s pause allowed
            sock.sendall(part)
        received = b""
        while b"\r\n\r\n" not in received or not received.endswith(b"}"):
            received += sock.recv(65536)
    head, _, answer = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), received
    assert b'"transaction_id":"in_parts"' in answer and b'"amount":4321' in answer


def test_an_idle_kept_alive_connection_is_closed(untrusted: LiveServer) -> None:
    """After an answer, a connection that sends nothing more is closed (the header timeout, 1 s
    here, swept rather than timed per request)."""
    with connect(untrusted, "127.0.0.18") as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b" 200 " in sock.recv(65536)
        assert 0.9 <= closed_after(sock) < CLOSED_WITHIN


def test_trickled_body_is_cut_off_after_the_whole_body_bound(untrusted: LiveServer) -> None:
    """A body sent a byte every 0.4 s never pauses for the 1 s per-pause bound; the whole body's
    bound (3 s) cuts it off: 408 `request_timeout`, connection closed."""
    with connect(untrusted, "127.0.0.15") as sock:
        sock.sendall(
            b"POST /api/v1/track/lead HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n"
        )
        sock.settimeout(0.4)
        received, start = b"", time.monotonic()
        try:
            for byte in b'{"customer_external_id": "' + b"c" * 170:
                sock.sendall(bytes([byte]))
                try:
                    if not (chunk := sock.recv(65536)):
                        break
                    received += chunk
                except TimeoutError:
                    pass
                if time.monotonic() - start > CLOSED_WITHIN:
                    pytest.fail("the server kept reading a trickled body")
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(CLOSED_WITHIN)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), received
    assert b"connection: close" in head.lower()
    assert b'"code":"request_timeout"' in body and b"longer than 3 s" in body


def test_slow_but_timely_requests_are_unaffected(untrusted: LiveServer) -> None:
    with connect(untrusted, "127.0.0.13") as sock:
        for part in (b"GET /hea", b"lthz HTTP/1.1\r\n", b"Host: t\r\n\r\n"):
            sock.sendall(part)
            time.sleep(0.1)
        assert b" 200 " in sock.recv(65536)
        time.sleep(0.2)  # idle on keep-alive, within the timeout
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b" 200 " in sock.recv(65536)
    transport = httpx.HTTPTransport(local_address="127.0.0.14")
    with httpx.Client(base_url=untrusted.url, transport=transport) as c:
        r = c.post("/api/v1/track/lead", content=b"{}", headers={"Content-Type": "application/json"})
        assert r.status_code == 422


# -- a failed start is one line ----------------------------------------------------------------
def tally_serve(database: Path, port: int | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "TALLY_DATABASE": str(database), "TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN, **env}
    cmd = [sys.executable, "-m", "api.cli", "serve", "--port", str(port or 0)]  # 0: the kernel picks
    return subprocess.run(
        cmd, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def assert_one_line_refusal(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tally: "), result.stderr
    for word in words:
        assert word in lines[0]


def test_corrupt_database_refuses_in_one_line(tmp_path: Path) -> None:
    database = tmp_path / "corrupt.duckdb"
    database.write_bytes(os.urandom(64 * 1024))
    assert_one_line_refusal(tally_serve(database), "cannot start", str(database))


def test_database_locked_by_another_server_refuses_in_one_line(untrusted: LiveServer) -> None:
    assert_one_line_refusal(tally_serve(untrusted.database), "cannot start", str(untrusted.database))


def test_port_in_use_refuses_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_refusal(
            tally_serve(tmp_path / "t.duckdb", port), "cannot start", "address already in use"
        )


def test_malformed_trusted_proxies_refuses_in_one_line(tmp_path: Path) -> None:
    result = tally_serve(tmp_path / "t.duckdb", TALLY_TRUSTED_PROXIES="127.0.0.1,proxy.internal")
    assert_one_line_refusal(result, "TALLY_TRUSTED_PROXIES", "proxy.internal")


# -- tenancy -----------------------------------------------------------------------------------
def test_cross_workspace_processor_account_claim_is_refused(untrusted: LiveServer) -> None:
    a_auth, a_pid, _ = live_program(untrusted.url)
    b_auth, b_pid, _ = live_program(untrusted.url)
    with httpx.Client(base_url=untrusted.url, timeout=10) as c:
        r = c.patch(f"/api/v1/programs/{a_pid}", json={"stripe_account_id": "acct_tenant_a"}, headers=a_auth)
        assert r.status_code == 200, r.text
        r = c.patch(f"/api/v1/programs/{b_pid}", json={"stripe_account_id": "acct_tenant_a"}, headers=b_auth)
        assert r.status_code == 409 and r.json()["error"]["code"] == "stripe_account_in_use"
        event = {
            "id": "evt_tenant_a",
            "object": "event",
            "type": "checkout.session.completed",
            "created": int(time.time()),
            "livemode": True,
            "account": "acct_tenant_a",
            "data": {"object": {"id": "cs_tenant_a", "object": "checkout.session", "amount_total": 100}},
        }
        body, header = signed_delivery(event, WEBHOOK_SECRET, int(time.time()))
        r = c.post("/webhooks/stripe", content=body, headers={"Stripe-Signature": header})
        assert r.status_code == 200 and r.json()["data"]["program_id"] == a_pid  # still A's sale
        r = c.get(f"/api/v1/programs/{b_pid}", headers=b_auth)
        assert r.json()["data"]["stripe_account_id"] is None
