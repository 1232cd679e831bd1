"""The delivery worker: sends the outbox's due deliveries to brand servers (CONTRACT section 13).

It runs inside `tally serve` on a thread of its own with its own event loop (never on the loop
that answers requests, so ingest does not wait on it), unless `TALLY_WEBHOOKS_DELIVERY=0`. Every
replica may run one: what each sends is decided in the database.

- Claim: due deliveries are leased in the database (ingest/webhooks_out/outbox.py `claim`), up
  to `PER_ENDPOINT` per endpoint in event order, for long enough to send them all
  (`lease_for`); no two workers hold one delivery at once.
- Send: each endpoint's claimed deliveries one after the other (so an endpoint gets its events
  in order, as far as retries allow), endpoints side by side. A delivery is the event's stored
  body, signed with the endpoint's secret (and the previous one during a rotation) with the
  attempt's timestamp; a 2xx within 10 s succeeds; anything else (another status, a redirect,
  which is never followed, a refused address, a timeout) fails and is retried on the schedule
  of ingest/webhooks_out/schedule.py, and the answer's first 4 KiB are kept.
- Record: each attempt, the delivery's new status and the endpoint's failing streak, in one
  transaction with the other endpoints' attempts that finished meanwhile (a group commit, on a
  thread of its own while the sending goes on); the lease ends with it. An endpoint's next
  delivery is sent once its previous attempt is recorded.
- A worker that dies (SIGKILL) leaves its leases: its process no longer runs, so any worker of
  this host frees them when it starts, and any other when they run out. Only a delivery that
  was being sent at that moment can be sent twice (at least once, never lost).

`clock` and `rng` are injectable, so tests drive retries over days without waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

import httpx

from api.outbound import transport
from ingest.domain.clock import utcnow
from ingest.storage import lockfile
from ingest.storage.contract import Store
from ingest.webhooks_out import outbox, schedule, signing
from ingest.webhooks_out.addresses import url_problem

log = logging.getLogger("tally.webhooks")
T = TypeVar("T")

PER_ENDPOINT = 10  # deliveries of one endpoint claimed at once (then sent one after another)
BATCH = 200  # deliveries claimed at once, in all
POLL_SECONDS = 1.0  # how often a worker looks for due deliveries (it is also woken at once)
HOUSEKEEPING_SECONDS = 10.0  # how often it frees dead workers' leases and runs `every_so_often`


def lease_for(per_endpoint: int) -> timedelta:
    """Long enough to send `per_endpoint` deliveries one after another, each timing out."""
    return timedelta(seconds=per_endpoint * (schedule.TIMEOUT_SECONDS + 2) + 30)


async def _read_capped(response: httpx.Response, limit: int) -> str:
    kept = bytearray()
    async for chunk in response.aiter_bytes():
        kept += chunk
        if len(kept) >= limit:
            break
    return bytes(kept[:limit]).decode("utf-8", "replace")


class Deliverer:
    """Sends due deliveries: `start()` runs it on a thread of its own; `deliver_due()` sends
    what is due now, once, in the caller's thread (tests, benchmarks)."""

    def __init__(
        self,
        store: Store,
        allow_private: bool,
        *,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
        resolver: transport.Resolver = transport.system_resolver,
        per_endpoint: int = PER_ENDPOINT,
        poll_seconds: float = POLL_SECONDS,
        every_so_often: Callable[[], object] | None = None,
    ) -> None:
        self._store = store
        self._allow_private = allow_private
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not a secret
        self._resolver = resolver
        self._per_endpoint = per_endpoint
        self._poll = poll_seconds
        self.every_so_often = every_so_often
        self.holder = f"{lockfile.identity()}:{uuid.uuid4().hex[:8]}"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._stopping = False
        self._failing: str | None = None  # the database error the loop last logged
        self.sent = 0  # attempts made by this worker (bench, tests)
        # where attempts are recorded: one thread, so one database connection, whatever the load
        self._db = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tally-webhooks-db")

    # -- running on a thread of its own -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tally-webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sending: attempts under way are abandoned and their leases given back (they are
        sent again later, by this or another worker)."""
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._db.shutdown(wait=True)

    def wake(self) -> None:
        """Look for due deliveries now (new events, a ping, a resend), from any thread."""
        loop, event = self._loop, self._wakeup
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main(loop))
        finally:
            self._loop = None
            loop.close()

    async def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        self._wakeup = asyncio.Event()
        self._loop = loop
        running: dict[str, asyncio.Task[None]] = {}
        held: dict[str, list[str]] = {}  # endpoint -> delivery ids leased and not yet recorded
        housekept = 0.0
        recorder = _Recorder(self._write, self._db)
        async with transport.client(self._allow_private, self._resolver, schedule.TIMEOUT_SECONDS) as client:
            try:
                while not self._stopping:
                    if time.monotonic() - housekept >= HOUSEKEEPING_SECONDS:
                        housekept = time.monotonic()
                        self._guarded(self._housekeeping)
                    claimed = self._guarded(lambda: self._claim(list(running))) or []
                    for endpoint_id, group in _by_endpoint(claimed).items():
                        held[endpoint_id] = [c.delivery_id for c in group]
                        task = asyncio.create_task(
                            self._send_group(client, recorder, group, held[endpoint_id])
                        )
                        running[endpoint_id] = task
                        task.add_done_callback(functools.partial(self._finished, running, held, endpoint_id))
                    if claimed:
                        continue  # more may be due: look again before waiting
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._poll):
                            await self._wakeup.wait()
            finally:
                for task in running.values():
                    task.cancel()
                await asyncio.gather(*running.values(), return_exceptions=True)
                await recorder.finish()
                unsent = [d for ids in held.values() for d in ids]
                self._guarded(lambda: self._release(unsent))

    def _finished(
        self,
        running: dict[str, asyncio.Task[None]],
        held: dict[str, list[str]],
        endpoint: str,
        _task: asyncio.Task[None],
    ) -> None:
        running.pop(endpoint, None)
        held.pop(endpoint, None)
        if self._wakeup is not None:
            self._wakeup.set()  # the endpoint may have more waiting

    def _guarded(self, work: Callable[[], T]) -> T | None:
        """`work()`; a database that fails is logged once (until it works again), never raised."""
        try:
            found = work()
        except Exception as exc:
            what = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if what != self._failing:
                log.warning("webhook deliveries paused: %s", what)
                self._failing = what
            return None
        if self._failing is not None:
            log.info("webhook deliveries resumed")
            self._failing = None
        return found

    # -- once, in the caller's thread ---------------------------------------------------------------
    def deliver_due(self) -> int:
        """Send every delivery due now (claiming again until none is left); the attempts made."""
        return asyncio.run(self._drain())

    async def _drain(self) -> int:
        made = 0
        recorder = _Recorder(self._write, self._db)
        async with transport.client(self._allow_private, self._resolver, schedule.TIMEOUT_SECONDS) as client:
            self._housekeeping()
            while True:
                claimed = self._claim([])
                if not claimed:
                    return made
                groups = _by_endpoint(claimed)
                await asyncio.gather(*(self._send_group(client, recorder, g, []) for g in groups.values()))
                await recorder.finish()
                made += len(claimed)

    # -- the steps ----------------------------------------------------------------------------------
    def _housekeeping(self) -> None:
        """Free the leases of workers of this host that died; then `every_so_often`."""
        with self._store.outbox() as db:
            for holder in outbox.lease_holders(db):
                if holder != self.holder and lockfile.dead(holder):
                    outbox.free_leases(db, holder)
                    log.info("freed the webhook deliveries of a worker that died (%s)", holder)
        if self.every_so_often is not None:
            self.every_so_often()

    def _claim(self, busy: list[str]) -> list[outbox.Claimed]:
        now = self._clock()
        with self._store.outbox() as db:
            return outbox.claim(
                db, self.holder, now, now + lease_for(self._per_endpoint), self._per_endpoint, BATCH, busy
            )

    def _release(self, delivery_ids: list[str]) -> None:
        with self._store.outbox() as db:
            outbox.release(db, delivery_ids, self.holder)

    async def _send_group(
        self, client: httpx.AsyncClient, recorder: _Recorder, group: list[outbox.Claimed], held: list[str]
    ) -> None:
        for claimed in group:
            if self._stopping:
                return
            await self.attempt(client, recorder, claimed)
            with contextlib.suppress(ValueError):
                held.remove(claimed.delivery_id)

    def _write(self, attempts: list[outbox.Attempt]) -> None:
        now = self._clock()
        with self._store.outbox() as db:
            disabled = outbox.record(db, attempts, now - schedule.DISABLE_AFTER)
        for endpoint_id, reason in disabled.items():
            log.warning("webhook endpoint %s disabled: %s", endpoint_id, reason)

    async def attempt(
        self, client: httpx.AsyncClient, recorder: _Recorder, claimed: outbox.Claimed
    ) -> outbox.Outcome:
        """Sign and send one delivery, and record the attempt (this returns once it is committed)."""
        now = self._clock()
        outcome = await self._send(client, claimed, now)
        self.sent += 1
        failed_attempts = claimed.attempts + 1
        first = claimed.first_attempt_at or now
        next_at = None if outcome.succeeded else schedule.next_attempt(first, failed_attempts, now, self._rng)
        await recorder.record(outbox.Attempt(claimed, outcome, now, next_at))
        if not outcome.succeeded:
            log.info(
                "webhook delivery %s (%s) to endpoint %s failed: %s; %s",
                claimed.delivery_id,
                claimed.type,
                claimed.endpoint_id,
                outcome.error or f"HTTP {outcome.response_status}",
                f"next attempt at {next_at:%Y-%m-%dT%H:%M:%SZ}" if next_at else "no more attempts",
            )
        return outcome

    async def _send(
        self, client: httpx.AsyncClient, claimed: outbox.Claimed, now: datetime
    ) -> outbox.Outcome:
        signing_with = [claimed.secret]
        if claimed.previous_secret and claimed.previous_until is not None and claimed.previous_until > now:
            signing_with.append(claimed.previous_secret)
        headers = signing.headers(claimed.event_id, int(now.timestamp()), claimed.body, signing_with)
        headers["content-type"] = "application/json"
        started = time.monotonic()
        status: int | None = None
        kept: str | None = None
        error: str | None = None
        problem = url_problem(claimed.url, self._allow_private)
        if problem is not None:
            error = f"url {problem}"
        else:
            try:
                async with asyncio.timeout(schedule.TIMEOUT_SECONDS):
                    async with client.stream(
                        "POST", claimed.url, content=claimed.body, headers=headers
                    ) as answer:
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
        return outbox.Outcome(succeeded, status, elapsed, kept, error)


class _Recorder:
    """Group commit of attempts: each `record` waits until its attempt is committed, together
    with every attempt that came in while the previous commit ran (outbox.record)."""

    def __init__(
        self, write: Callable[[list[outbox.Attempt]], None], executor: concurrent.futures.Executor
    ) -> None:
        self._write = write
        self._executor = executor
        self._waiting: list[tuple[outbox.Attempt, asyncio.Future[None]]] = []
        self._writing = False
        self._task: asyncio.Task[None] | None = None

    async def record(self, attempt: outbox.Attempt) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiting.append((attempt, done))
        if not self._writing:
            self._writing = True
            self._task = loop.create_task(self._drain())
        await done

    async def finish(self) -> None:
        """Wait for the attempts being recorded (a worker stopping)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                try:
                    await loop.run_in_executor(self._executor, self._write, [a for a, _ in group])
                except Exception:
                    ids = ", ".join(a.claimed.delivery_id for a, _ in group)
                    log.exception("could not record attempts of %s (they are sent again later)", ids)
                for _, done in group:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._writing = False


def _by_endpoint(claimed: list[outbox.Claimed]) -> dict[str, list[outbox.Claimed]]:
    groups: dict[str, list[outbox.Claimed]] = {}
    for c in claimed:
        groups.setdefault(c.endpoint_id, []).append(c)
    return groups
