"""How `tally serve` runs uvicorn: no proxy-header trust of its own, slow clients timed out, and a
failed start reported as one line.

- `proxy_headers=False`: uvicorn would otherwise believe `X-Forwarded-For` from 127.0.0.1; the
  client address is found by `api.proxies` against `TALLY_TRUSTED_PROXIES` instead.
- `GuardedProtocol`: uvicorn's httptools protocol with a header read timeout. A connection that
  has not completed a request's headers within `header_timeout` of connecting, or of the previous
  response on a kept-alive connection, is closed (uvicorn has no such option; its keep-alive
  timer stops at the first byte, so a client dribbling header bytes held a connection forever).
  Both timeouts (the header read's and uvicorn's keep-alive) are swept rather than timed per
  request (see the class).
  Slow bodies are timed out by `api.http.read_body` (`TALLY_BODY_TIMEOUT_SECONDS` per pause,
  `TALLY_BODY_TOTAL_TIMEOUT_SECONDS` for the whole body, 408).
- `run`: uvicorn's start-up errors (lifespan failure, port in use) are held back while starting;
  `StartupFailed` carries the reason in one line instead.
- Stopped by a signal (SIGTERM, Ctrl-C), uvicorn shuts down gracefully and then raises the same
  signal again, which ends the process at once: the log lines still queued (the app's `stopped`
  line among them) are written before that (`_Server.capture_signals`), waiting at most
  `FLUSH_ON_SIGNAL_SECONDS` (stderr may be a full pipe nobody reads: never a hang at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import weakref
from collections.abc import Callable, Generator
from typing import Any, ClassVar

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api import observability

FLUSH_ON_SIGNAL_SECONDS = 2.0


class StartupFailed(Exception):
    """Raised by `run` when the server did not start (database unusable, port in use); one line."""


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type when the message is empty, whitespace collapsed."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, closing connections whose request headers take too long.

    Its two timeouts take no timer per request: uvicorn arms and cancels one for the keep-alive
    and this class one for the headers, each about as costly as reading and validating a track
    call's body under uvloop. A connection notes when each wait began (`_idle_since`: kept alive
    after a response, until data arrives; `_headers_since`: since it connected or its last
    response, until a request's headers are complete), and one sweep per server, every
    `SWEEP_FRACTION` of the shorter timeout while connections are open, closes those past
    either: a connection is closed up to that fraction after its timeout."""

    header_timeout: ClassVar[float] = 10.0
    SWEEP_FRACTION: ClassVar[float] = 0.1
    _sweeps: ClassVar[weakref.WeakKeyDictionary[Any, asyncio.TimerHandle]] = weakref.WeakKeyDictionary()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle_since: float | None = None
        self._headers_since: float | None = None

    # -- the two timeouts, swept ----------------------------------------------------------------
    def _sweep_every(self) -> float:
        return max(0.01, min(self.header_timeout, float(self.timeout_keep_alive)) * self.SWEEP_FRACTION)

    def _start_sweep(self) -> None:
        state = self.server_state
        if state not in self._sweeps:
            self._sweeps[state] = self.loop.call_later(self._sweep_every(), self._sweep, state)

    def _sweep(self, state: Any) -> None:
        now = self.loop.time()
        for connection in list(state.connections):
            if isinstance(connection, GuardedProtocol):
                connection._expire(now)
        if state.connections:
            self._sweeps[state] = self.loop.call_later(self._sweep_every(), self._sweep, state)
        else:
            self._sweeps.pop(state, None)

    def _expire(self, now: float) -> None:
        idle, headers = self._idle_since, self._headers_since
        if (idle is not None and now - idle >= self.timeout_keep_alive) or (
            headers is not None and now - headers >= self.header_timeout
        ):
            self._idle_since = self._headers_since = None
            if not self.transport.is_closing():
                self.transport.close()

    def _unset_keepalive_if_required(self) -> None:  # (uvicorn's: data arrived, or a response ended)
        self._idle_since = None
        super()._unset_keepalive_if_required()

    # -- uvicorn's protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_since = self.loop.time()
        self._start_sweep()

    def connection_lost(self, exc: Exception | None) -> None:
        self._idle_since = self._headers_since = None
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._headers_since = None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        """uvicorn's, noting the keep-alive wait instead of arming a timer for it."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:  # the next pipelined request starts
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = self.loop.time()
        # Pipelined requests whose headers already arrived started above; otherwise the next
        # request's headers get `header_timeout` from now.
        if self.cycle is None or self.cycle.response_complete:
            self._headers_since = self.loop.time()


def guarded_protocol(header_timeout: float) -> type[GuardedProtocol]:
    """`GuardedProtocol` with this header timeout (uvicorn builds protocols from a class)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"header_timeout": header_timeout})


class _StartupGate(logging.Filter):
    """Holds back uvicorn's error records until the server has started, keeping their text."""

    def __init__(self, server: uvicorn.Server) -> None:
        super().__init__()
        self.server = server
        self.held: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.server.started or record.levelno < logging.ERROR:
            return True
        self.held.append(record.getMessage())
        return False

    def reason(self) -> str:
        for text in self.held:
            lines = [line for line in text.strip().splitlines() if line.strip()]
            if not lines or text.startswith("Application startup failed"):
                continue
            # A lifespan failure arrives as a traceback: its last line names the exception.
            return " ".join((lines[-1] if lines[0].startswith("Traceback") else lines[0]).split())
        return "the server did not start"


def config(app: Starlette, host: str, port: int, header_timeout: float) -> uvicorn.Config:
    """uvicorn's configuration for `tally serve` (tests run the same in a thread)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(header_timeout),
        proxy_headers=False,
        log_level="warning",
        log_config=None,  # uvicorn's records go through tally's handler (api.observability)
        access_log=False,  # tally writes one access line per request itself
        timeout_graceful_shutdown=10,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, printing `announce` to stdout once it accepts connections."""

    announce = ""
    on_started: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()
        if self.started and self.announce:
            print(self.announce, flush=True)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's; and once a signal has stopped the server, the queued log lines are
        written before uvicorn raises that signal again (which ends the process at once)."""
        with super().capture_signals():
            yield
            if self._captured_signals:
                observability.stop_logging(timeout=FLUSH_ON_SIGNAL_SECONDS)


def run(
    app: Starlette,
    host: str,
    port: int,
    header_timeout: float,
    announce: str = "",
    on_started: Callable[[], None] | None = None,
) -> None:
    """Serve `app` until stopped (printing `announce` and calling `on_started` once started); raise
    `StartupFailed` (one line) when it cannot start."""
    server = _Server(config(app, host, port, header_timeout))
    server.announce = announce
    server.on_started = on_started
    gate = _StartupGate(server)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(gate)
    try:
        server.run()
    except SystemExit:  # uvicorn's way out of a failed start
        if server.started:
            raise
    finally:
        uvicorn_log.removeFilter(gate)
    if not server.started:
        reason = getattr(app.state, "startup_failure", None) or gate.reason()
        raise StartupFailed(reason)
