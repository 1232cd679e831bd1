"""A minimal Chrome DevTools Protocol client: launch headless Chromium, drive one page.

Just what the browser tests need: navigate and wait for load, evaluate (awaiting promises),
read cookies, take a screenshot. Chromium is started with `--remote-debugging-port=0`; the
DevTools address is read from its stderr. Every wait has a timeout and the process is always
killed on close.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from websockets.sync.client import ClientConnection, connect

CHROMIUM = os.environ.get("TALLY_CHROMIUM", "/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
    "--window-size=1024,768",
)


class CDPError(RuntimeError):
    """Raised by the CDP client when Chromium answers a command with an error or times out."""


class Page:
    """One page target, spoken to over its own DevTools websocket."""

    def __init__(self, ws_url: str, timeout: float) -> None:
        self._stack = contextlib.ExitStack()
        self._ws: ClientConnection = self._stack.enter_context(
            connect(ws_url, max_size=None, open_timeout=timeout)
        )
        self._ids = itertools.count(1)
        self._timeout = timeout
        self.events: list[dict[str, Any]] = []
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Network.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + self._timeout
        while True:
            message = self._receive(deadline, method)
            if message.get("id") == call_id:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def wait_for(self, event: str) -> dict[str, Any]:
        """The first `event` received since the last call (already buffered or yet to come)."""
        deadline = time.monotonic() + self._timeout
        while True:
            for i, message in enumerate(self.events):
                if message.get("method") == event:
                    del self.events[: i + 1]
                    return message
            self.events.append(self._receive(deadline, event))

    def _receive(self, deadline: float, what: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CDPError(f"timed out waiting for {what}")
        try:
            raw = self._ws.recv(timeout=left)
        except TimeoutError:
            raise CDPError(f"timed out waiting for {what}") from None
        message: dict[str, Any] = json.loads(raw)
        return message

    def navigate(self, url: str) -> None:
        self.events.clear()
        result = self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise CDPError(f"navigation to {url} failed: {result['errorText']}")
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of `expression` (promises awaited); page exceptions raise `CDPError`."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"page threw: {text}")
        return result["result"].get("value")

    def wait_until(self, expression: str) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise CDPError(f"timed out waiting until {expression}")

    def cookies(self, url: str) -> list[dict[str, Any]]:
        cookies: list[dict[str, Any]] = self.send("Network.getCookies", urls=[url])["cookies"]
        return cookies

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def console_messages(self) -> list[str]:
        return [
            " ".join(str(a.get("value", a.get("description", ""))) for a in e["params"]["args"])
            for e in self.events
            if e.get("method") == "Runtime.consoleAPICalled"
        ]

    def close(self) -> None:
        self._stack.close()


class Chromium:
    """A headless Chromium process with its own throwaway profile."""

    # Each wait is a guard against a hang, not a performance check: on a 2-core machine busy
    # with other tests, starting Chromium and rendering a large report once took over 15 s.
    def __init__(self, *extra_flags: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="tally-chromium-")
        args = [CHROMIUM, *FLAGS, *extra_flags, f"--user-data-dir={self._profile}"]
        args += ["--remote-debugging-port=0", "about:blank"]
        self._proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._pages: list[Page] = []
        self._pump: threading.Thread | None = None
        try:
            self.ws_url = self._devtools_url()
        except BaseException:
            self.close()
            raise
        parsed = urlparse(self.ws_url)
        self.http = f"http://{parsed.netloc}"

    def _devtools_url(self) -> str:
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self._proc.stderr is not None
            for line in self._proc.stderr:
                lines.put(line)
            lines.put(None)

        self._pump = threading.Thread(target=pump, name="chromium-stderr", daemon=True)
        self._pump.start()
        seen: list[str] = []
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            if line.startswith("DevTools listening on "):
                return line.removeprefix("DevTools listening on ").strip()
        raise CDPError("Chromium did not report a DevTools address:\n" + "".join(seen[-20:]))

    def new_page(self) -> Page:
        r = httpx.put(f"{self.http}/json/new?about:blank", timeout=self.timeout)
        r.raise_for_status()
        page = Page(r.json()["webSocketDebuggerUrl"], self.timeout)
        self._pages.append(page)
        return page

    def close(self) -> None:
        try:
            while self._pages:
                self._pages.pop().close()
        finally:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=5)
            with contextlib.suppress(ProcessLookupError):  # helpers left in its own process group
                os.killpg(self._proc.pid, signal.SIGKILL)
            if self._pump is not None:
                self._pump.join(timeout=5)  # it ends at EOF, once the browser is gone
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
