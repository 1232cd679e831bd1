"""Sending one signed delivery, in this process or in a process of its own (CONTRACT section 13).

`send_one` is an attempt: POST the body with its signature headers, a 2xx within 10 s succeeds;
another status, a redirect (never followed), a refused address or a timeout fails, and the
answer's first 4 KiB are kept. Two senders make attempts for the worker (api/outbound/worker.py):

- `InlineSender`: on the worker's own event loop (tests, benchmarks, `Deliverer.deliver_due`;
  a stub resolver can be given to it).
- `ProcessSender`: in a child process (`python -m api.outbound.sending`) at the lowest CPU
  priority (nice 19). The HTTP client's work (connections, TLS, HTTP parsing: 1 to 3 ms of
  interpreter time per delivery) then never holds the server's interpreter lock, and when the
  two cores are busy the kernel gives them to ingest first: deliveries wait, track calls do not.
  It is started when the first delivery is due, ends when its input closes (the server stopped
  or died: it finishes the attempts under way, starts no other), and is started again when it
  dies. Two ways to use it:
  - `send_group` (the embedded database): the child signs and sends a claimed group of one
    endpoint's deliveries one after the other and records each attempt in the attempt file
    (ingest/webhooks_out/journal.py) before it sends the next, then answers once for the
    group: the server does a few microseconds of work per delivery, where each message back and
    forth would take the interpreter from ingest again. So the child holds the endpoint's
    signing secrets while it sends (in memory only, never written or logged).
  - `send` (PostgreSQL, where each attempt is recorded in the database at once): one attempt,
    signed by the worker; the child never sees a secret.

Messages are one JSON line each: to the child `{"n", "url", "body", "headers"}` or
`{"n", "journal", "group": [...]}`, back `{"n", "ok", "code", "ms", "body", "error"}` (an
`Outcome`) or `{"n", "sent", "failed": [...]}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import orjson

from api.outbound import transport
from ingest.domain.clock import utcnow
from ingest.webhooks_out import schedule, signing
from ingest.webhooks_out.addresses import url_problem
from ingest.webhooks_out.journal import AttemptJournal
from ingest.webhooks_out.outbox import Attempt, Claimed, Outcome

log = logging.getLogger("tally.webhooks")
NICE = 19  # the child's CPU priority: the lowest (ingest first when the cores are busy)


async def _read_capped(response: httpx.Response, limit: int) -> str:
    kept = bytearray()
    async for chunk in response.aiter_bytes():
        kept += chunk
        if len(kept) >= limit:
            break
    return bytes(kept[:limit]).decode("utf-8", "replace")


async def send_one(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], allow_private: bool
) -> Outcome:
    """One attempt: POST `body` to `url` with `headers` (signed by the caller)."""
    started = time.monotonic()
    status: int | None = None
    kept: str | None = None
    error: str | None = None
    problem = url_problem(url, allow_private)
    if problem is not None:
        error = f"url {problem}"
    else:
        try:
            async with asyncio.timeout(schedule.TIMEOUT_SECONDS):
                async with client.stream("POST", url, content=body, headers=headers) as answer:
                    status = answer.status_code
                    kept = await _read_capped(answer, schedule.BODY_KEPT)
        except TimeoutError:
            error = f"no complete answer within {schedule.TIMEOUT_SECONDS:g} s"
        except transport.AddressRefused as exc:
            error = str(exc)
        except Exception as exc:  # any failure to reach the endpoint is a failed attempt
            error = f"{type(exc).__name__}: {exc}"[:500] if str(exc) else type(exc).__name__
    elapsed = int((time.monotonic() - started) * 1000)
    if error is None and status is not None and not 200 <= status < 300:
        error = f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
    succeeded = error is None and status is not None
    return Outcome(succeeded, status, elapsed, kept, error)


class InlineSender:
    """Attempts on the caller's event loop."""

    def __init__(self, allow_private: bool, resolver: transport.Resolver = transport.system_resolver) -> None:
        self._allow_private = allow_private
        self._client = transport.client(allow_private, resolver, schedule.TIMEOUT_SECONDS)

    async def __aenter__(self) -> InlineSender:
        await self._client.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._client.__aexit__(kind, exc, tb)

    async def send(self, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        return await send_one(self._client, url, body, headers, self._allow_private)


def headers_at(claimed: Claimed, now: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of an attempt at `now`: signed with the endpoint's secret,
    and with the previous one too during a rotation."""
    signing_with = [claimed.secret]
    if claimed.previous_secret and claimed.previous_until is not None and claimed.previous_until > now:
        signing_with.append(claimed.previous_secret)
    headers = signing.headers(claimed.event_id, int(now.timestamp()), claimed.body, signing_with)
    headers["content-type"] = "application/json"
    return headers


def next_at(claimed: Claimed, outcome: Outcome, now: datetime, rng: random.Random) -> datetime | None:
    """When to try a delivery again after this attempt (None: it succeeded, or no more tries)."""
    if outcome.succeeded:
        return None
    return schedule.next_attempt(claimed.first_attempt_at or now, claimed.attempts + 1, now, rng)


@dataclass(frozen=True)
class Failed:
    """A failed attempt of a group, for the server's log."""

    delivery_id: str
    type: str
    endpoint_id: str
    why: str
    next_at: datetime | None


@dataclass(frozen=True)
class GroupSent:
    sent: int
    failed: list[Failed]


class SenderLost(Exception):
    """The sending process died or stopped answering before it said what an attempt came to:
    no attempt is recorded (the endpoint did nothing wrong); the delivery is due again."""


def _claimed_message(c: Claimed) -> dict[str, Any]:
    return {
        "d": c.delivery_id,
        "e": c.endpoint_id,
        "ev": c.event_id,
        "t": c.type,
        "o": c.event_order,
        "p": c.attempts,
        "first": c.first_attempt_at.isoformat() if c.first_attempt_at else None,
        "body": c.body.decode(),
        "url": c.url,
        "s": c.secret,
        "ps": c.previous_secret,
        "pu": c.previous_until.isoformat() if c.previous_until else None,
        "f": c.failing,
    }


def _claimed(m: dict[str, Any]) -> Claimed:
    return Claimed(
        str(m["d"]),
        str(m["e"]),
        str(m["ev"]),
        str(m["t"]),
        int(m["o"]),
        int(m["p"]),
        datetime.fromisoformat(m["first"]) if m["first"] else None,
        str(m["body"]).encode(),
        str(m["url"]),
        str(m["s"]),
        m["ps"],
        datetime.fromisoformat(m["pu"]) if m["pu"] else None,
        bool(m["f"]),
    )


def group_seconds(size: int) -> float:
    """How long a group of `size` deliveries may take in the sending process: each attempt
    times out there, so more means it hangs. Shorter than the group's lease (worker.lease_for)."""
    return size * (schedule.TIMEOUT_SECONDS + 2) + GROUP_MARGIN_SECONDS


GROUP_MARGIN_SECONDS = 15.0


class ProcessSender:
    """Attempts made by a child process (the module's docstring says why)."""

    def __init__(self, allow_private: bool) -> None:
        self._allow_private = allow_private
        self._child: asyncio.subprocess.Process | None = None
        self._reading: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[Outcome | None]] = {}
        self._groups: dict[int, asyncio.Future[Any]] = {}
        self._numbers = itertools.count(1)
        self._starting = asyncio.Lock()

    async def __aenter__(self) -> ProcessSender:
        return self

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        child = self._child
        return child.pid if child is not None and child.returncode is None else None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()  # the child finishes what it has and exits
        try:
            async with asyncio.timeout(schedule.TIMEOUT_SECONDS + 2):
                await child.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
        if self._reading is not None:
            await asyncio.gather(self._reading, return_exceptions=True)
        self._fail_waiting()

    async def send(self, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        """One attempt by the child; `SenderLost` when it dies or hangs meanwhile."""
        child = await self._running()
        number = next(self._numbers)
        answer: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
        self._waiting[number] = answer
        message = {"n": number, "url": url, "body": body.decode(), "headers": headers}
        try:
            assert child.stdin is not None
            child.stdin.write(orjson.dumps(message) + b"\n")
            await child.stdin.drain()
            async with asyncio.timeout(schedule.TIMEOUT_SECONDS + 5):
                found = await answer
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()  # it hangs: the next attempt starts a fresh one
            raise SenderLost("the sending process did not answer") from None
        except (BrokenPipeError, ConnectionResetError):
            raise SenderLost("the sending process exited") from None
        finally:
            self._waiting.pop(number, None)
        if found is None:
            raise SenderLost("the sending process exited")
        return found

    async def send_group(self, group: list[Claimed], journal: Path) -> GroupSent:
        """Have the child send `group` (one endpoint's, in order), recording each attempt in the
        file at `journal`; what it sent. A child that dies or stops sent what the file says."""
        child = await self._running()
        number = next(self._numbers)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._groups[number] = answer
        message = {"n": number, "journal": str(journal), "group": [_claimed_message(c) for c in group]}
        try:
            assert child.stdin is not None
            child.stdin.write(orjson.dumps(message) + b"\n")
            await child.stdin.drain()
            async with asyncio.timeout(group_seconds(len(group))):
                found = await answer
        except TimeoutError:
            # Each attempt is bounded in the child, so it hangs (or was stopped): end it before
            # the group's lease runs out and another worker may send the same deliveries.
            log.error(
                "webhook sending process %d did not finish a group of %d in %g s; ending it",
                child.pid,
                len(group),
                group_seconds(len(group)),
            )
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
            return GroupSent(0, [])
        except (BrokenPipeError, ConnectionResetError):
            return GroupSent(0, [])
        finally:
            self._groups.pop(number, None)
        if found is None:  # the child exited
            return GroupSent(0, [])
        failed = [
            Failed(f["d"], f["t"], f["e"], f["why"], datetime.fromisoformat(f["next"]) if f["next"] else None)
            for f in found["failed"]
        ]
        return GroupSent(int(found["sent"]), failed)

    async def _running(self) -> asyncio.subprocess.Process:
        async with self._starting:
            if self._child is None or self._child.returncode is not None:
                self._child = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "api.outbound.sending",
                    "1" if self._allow_private else "0",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
                self._reading = asyncio.create_task(self._read(self._child))
                log.info("webhook sending process %d started", self._child.pid)
            return self._child

    async def _read(self, child: asyncio.subprocess.Process) -> None:
        assert child.stdout is not None
        while line := await child.stdout.readline():
            try:
                found = orjson.loads(line)
                number = int(found["n"])
                if "sent" in found:
                    group = self._groups.get(number)
                    if group is not None and not group.done():
                        group.set_result(found)
                    continue
                outcome = Outcome(
                    bool(found["ok"]), found["code"], int(found["ms"]), found["body"], found["error"]
                )
                answer = self._waiting.get(number)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("the webhook sending process wrote an unreadable line")
                continue
            if answer is not None and not answer.done():
                answer.set_result(outcome)
        code = await child.wait()
        if self._child is child:
            log.warning(
                "webhook sending process %d exited (code %s); started again when needed", child.pid, code
            )
        self._fail_waiting()

    def _fail_waiting(self) -> None:
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_result(None)
        for group in self._groups.values():
            if not group.done():
                group.set_result(None)


# -- the child process ---------------------------------------------------------------------------
async def _serve(allow_private: bool) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer
    running: set[asyncio.Task[None]] = set()
    journals: dict[str, AttemptJournal] = {}
    stopping = False
    rng = random.Random()  # noqa: S311 - jitter, not a secret

    def answer(message: dict[str, Any]) -> None:
        out.write(orjson.dumps(message) + b"\n")
        out.flush()

    async def group(client: httpx.AsyncClient, message: dict[str, Any]) -> None:
        path = str(message["journal"])
        journal = journals.get(path) or journals.setdefault(path, AttemptJournal(path))
        sent = 0
        failed: list[dict[str, Any]] = []
        for claimed in map(_claimed, message["group"]):
            if stopping:
                break
            now = utcnow()
            headers = headers_at(claimed, now)
            outcome = await send_one(client, claimed.url, claimed.body, headers, allow_private)
            retry = next_at(claimed, outcome, now, rng)
            journal.append([Attempt.of(claimed, outcome, now, retry)])
            sent += 1
            if not outcome.succeeded:
                why = outcome.error or f"HTTP {outcome.response_status}"
                nxt = retry.isoformat() if retry else None
                failed.append(
                    {"d": claimed.delivery_id, "t": claimed.type, "e": claimed.endpoint_id}
                    | {"why": why, "next": nxt}
                )
        answer({"n": message["n"], "sent": sent, "failed": failed})

    async def attempt(client: httpx.AsyncClient, message: dict[str, Any]) -> None:
        outcome = await send_one(
            client,
            str(message["url"]),
            str(message["body"]).encode(),
            dict(message["headers"]),
            allow_private,
        )
        o = outcome
        answer(
            {"n": message["n"], "ok": o.succeeded, "code": o.response_status}
            | {"ms": o.duration_ms, "body": o.response_body, "error": o.error}
        )

    async with transport.client(allow_private, transport.system_resolver, schedule.TIMEOUT_SECONDS) as client:
        while line := await reader.readline():
            message = orjson.loads(line)
            work = group(client, message) if "group" in message else attempt(client, message)
            task = asyncio.create_task(work)
            running.add(task)
            task.add_done_callback(running.discard)
        stopping = True  # the server stopped or died: finish the attempts under way, no more
        await asyncio.gather(*running, return_exceptions=True)


def main() -> None:
    with contextlib.suppress(OSError):
        os.nice(NICE)
    allow_private = len(sys.argv) > 1 and sys.argv[1] == "1"
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        asyncio.run(_serve(allow_private))


if __name__ == "__main__":
    main()
