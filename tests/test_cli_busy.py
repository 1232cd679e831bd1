"""The CLI tries a call again while the server answers 409 `reconcile_running` (a reconcile run
holds the lock and nothing of the call was done), waiting `Retry-After`; any other error is
reported at once. A real HTTP server on the loopback answers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from api.cli.client import call_status, stream
from api.cli.errors import ApiError

BUSY = json.dumps({"error": {"code": "reconcile_running", "message": "busy", "doc_url": "x"}}).encode()
OTHER = json.dumps({"error": {"code": "conflict", "message": "no", "doc_url": "x"}}).encode()


class Server:
    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers = answers
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = outer.answers[min(outer.calls, len(outer.answers) - 1)]
                outer.calls += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def serve() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.httpd.shutdown()
        server.httpd.server_close()


def test_a_busy_answer_is_tried_again_then_the_call_succeeds(serve: list[Server]) -> None:
    ok = json.dumps({"data": {"made": True}}).encode()
    server = Server([(409, BUSY), (409, BUSY), (201, ok)])
    serve.append(server)
    assert call_status("POST", "/x", url=server.url, token="t", body={}) == (201, {"made": True})
    assert server.calls == 3


def test_another_error_is_not_tried_again(serve: list[Server]) -> None:
    server = Server([(409, OTHER)])
    serve.append(server)
    with pytest.raises(ApiError):
        call_status("POST", "/x", url=server.url, token="t", body={})
    assert server.calls == 1


def test_a_streamed_call_is_tried_again_while_busy(serve: list[Server]) -> None:
    lines = b'{"progress": 1}\n{"data": 2}\n'
    server = Server([(409, BUSY), (200, lines)])
    serve.append(server)
    assert list(stream("POST", "/x", url=server.url, token="t")) == [{"progress": 1}, {"data": 2}]
    assert server.calls == 2
