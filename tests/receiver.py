"""A real HTTP receiver the webhook tests start: a brand's server on 127.0.0.1, on a port of its
own, that records every request (headers and body, as sent) and answers as the test scripts it:
200 by default, a status for the next N requests, a redirect, a body, or hanging until released.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        found: dict[str, Any] = orjson.loads(self.body)
        return found

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


Answer = tuple[int, dict[str, str], bytes]


class Receiver:
    """Start with `Receiver()`; `url` is its address; `close()` stops it."""

    def __init__(self, port: int = 0) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._script: list[Answer] = []
        self.default: Answer = (200, {}, b"ok")
        self.hang = threading.Event()  # set: requests wait (unanswered) until `release()`
        self._released = threading.Event()
        self.seen = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                answer = receiver._take(Received(self.path, headers, body))
                if receiver.hang.is_set():
                    receiver._released.wait(60)
                status, extra, payload = answer
                try:
                    self.send_response(status)
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the sender went away (killed, or timed out)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, got: Received) -> Answer:
        with self.seen:
            self.received.append(got)
            self.seen.notify_all()
            return self._script.pop(0) if self._script else self.default

    def answer(self, *answers: Answer) -> None:
        """The next requests get these answers, in order (then `default`)."""
        with self._lock:
            self._script.extend(answers)

    def fail(self, times: int, status: int = 500) -> None:
        self.answer(*[(status, {}, b"not now")] * times)

    def release(self) -> None:
        """Answer the hanging requests (and stop hanging)."""
        self.hang.clear()
        self._released.set()

    def wait_for(
        self, count: int, seconds: float = 30, where: Callable[[Received], bool] | None = None
    ) -> None:
        """Until `count` requests (matching `where`) came in; AssertionError after `seconds`."""

        def enough() -> bool:
            return len([r for r in self.received if where is None or where(r)]) >= count

        with self.seen:
            if not self.seen.wait_for(enough, timeout=seconds):
                raise AssertionError(
                    f"the receiver got {len(self.received)} requests, not {count}, in {seconds} s"
                )

    def ids(self) -> list[str]:
        with self._lock:
            return [r.webhook_id for r in self.received]

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
