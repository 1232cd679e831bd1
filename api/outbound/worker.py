"""The delivery worker: sends the outbox's due deliveries to brand servers (CONTRACT section 13).

It runs inside `tally serve` on a thread of its own with its own event loop (never on the loop
that answers requests, so ingest does not wait on it), unless `TALLY_WEBHOOKS_DELIVERY=0`, and
makes its HTTP requests through a child process at a lower CPU priority
(api/outbound/sending.py), so the sending does not take the interpreter or the cores from
ingest. Every replica may run one: what each sends is decided in the database.

- Claim: due deliveries are leased in the database (ingest/webhooks_out/outbox.py `claim`), up
  to `PER_ENDPOINT` per endpoint in event order, for long enough to send them all
  (`lease_for`); no two workers hold one delivery at once.
- Send: each endpoint's claimed deliveries one after the other (so an endpoint gets its events
  in order, as far as retries allow), endpoints side by side. A delivery is the event's stored
  body, signed with the endpoint's secret (and the previous one during a rotation) with the
  attempt's timestamp; a 2xx within 10 s succeeds; anything else (another status, a redirect,
  which is never followed, a refused address, a timeout) fails and is retried on the schedule
  of ingest/webhooks_out/schedule.py, and the answer's first 4 KiB are kept.
- Record: each attempt before the endpoint's next delivery is sent. On PostgreSQL in the
  database at once: the attempt, the delivery's new status and the endpoint's failing streak,
  in one transaction with the other endpoints' attempts that finished meanwhile (a group commit,
  on a thread of its own while the sending goes on); the lease ends with it. On the embedded
  database in a file first (ingest/webhooks_out/journal.py: microseconds where a DuckDB
  transaction takes milliseconds), recorded in the database a group at a time: before the
  worker claims again, at least once a second, and when it stops.
- A worker that dies (SIGKILL) leaves its leases (and, embedded, its file): its process no longer
  runs, so any worker of this host records the file and frees them when it starts, and any other
  when they run out. Only a delivery that was being sent at that moment can be sent twice (at
  least once, never lost).

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

from api.outbound import transport
from api.outbound.sending import InlineSender, ProcessSender, SenderLost, headers_at, next_at
from ingest.domain.clock import utcnow
from ingest.storage import lockfile
from ingest.storage.contract import Store
from ingest.webhooks_out import outbox, schedule
from ingest.webhooks_out.journal import AttemptJournal

log = logging.getLogger("tally.webhooks")
T = TypeVar("T")
Sender = InlineSender | ProcessSender

# Deliveries of one endpoint claimed at once (then sent one after another): a claim is one
# statement whatever its size (about 20 ms of CPU on the embedded database), so a claim is made
# for many; the lease lasts long enough to send them all (`lease_for`: 10.5 min for 50).
PER_ENDPOINT = 50
BATCH = 500  # deliveries claimed at once, in all
POLL_SECONDS = 1.0  # how often a worker looks for due deliveries (it is also woken at once)
HOUSEKEEPING_SECONDS = 10.0  # how often it frees dead workers' leases and runs `every_so_often`
APPLY_AT = 200  # attempts kept in the file (embedded) that are recorded in the database at once


def lease_for(per_endpoint: int) -> timedelta:
    """Long enough to send `per_endpoint` deliveries one after another, each timing out."""
    return timedelta(seconds=per_endpoint * (schedule.TIMEOUT_SECONDS + 2) + 30)


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
        own_process: bool = False,
    ) -> None:
        self._store = store
        self._allow_private = allow_private
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not a secret
        self._resolver = resolver
        self._per_endpoint = per_endpoint
        self._poll = poll_seconds
        self.every_so_often = every_so_often
        self._own_process = own_process  # the background thread sends through a child process
        self.holder = f"{lockfile.identity()}:{uuid.uuid4().hex[:8]}"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._stopping = False
        self._failing: str | None = None  # the database error the loop last logged
        self.sent = 0  # attempts made by this worker (bench, tests)
        # where attempts are recorded: one thread, so one database connection, whatever the load
        self._db = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tally-webhooks-db")
        # on the embedded database, attempts go to a file first (ingest/webhooks_out/journal.py);
        # opened on the database thread when first needed
        self._journal_path = store.attempt_journal()
        self._journal: AttemptJournal | None = None
        self._appended = 0  # attempts this worker put in the file since it was last recorded
        self.sender: Sender | None = None  # what the background thread sends with (tests)

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
        if self._journal is not None:
            self._journal.close()
            self._journal = None

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
        await loop.run_in_executor(self._db, self._opened)  # the attempt file, when there is one
        sender = self._sender(self._own_process)
        self.sender = sender
        async with sender:
            try:
                while not self._stopping:
                    if time.monotonic() - housekept >= HOUSEKEEPING_SECONDS:
                        housekept = time.monotonic()
                        self._guarded(self._housekeeping)
                    if self._journal is not None and self._journal.has_any():
                        await loop.run_in_executor(self._db, self._guarded, self._apply)
                    claimed = self._guarded(lambda: self._claim(list(running))) or []
                    for endpoint_id, group in _by_endpoint(claimed).items():
                        held[endpoint_id] = [c.delivery_id for c in group]
                        task = asyncio.create_task(
                            self._send_group(sender, recorder, group, held[endpoint_id])
                        )
                        running[endpoint_id] = task
                        task.add_done_callback(functools.partial(self._finished, running, held, endpoint_id))
                    if len(claimed) >= BATCH:
                        continue  # more may be due: look again before waiting (an endpoint that
                        # finishes its group wakes the loop, and is claimed for again)
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._poll):
                            await self._wakeup.wait()
            finally:
                for task in running.values():
                    task.cancel()
                await asyncio.gather(*running.values(), return_exceptions=True)
                if isinstance(sender, ProcessSender):
                    await sender.close()  # it finishes the attempts under way and records them
                await recorder.finish()
                await loop.run_in_executor(self._db, self._guarded, self._apply)
                unsent = [d for ids in held.values() for d in ids]
                self._guarded(functools.partial(self._release, unsent))

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
        async with self._sender(False) as sender:
            self._housekeeping()
            while True:
                claimed = self._claim([])
                if not claimed:
                    return made
                groups = _by_endpoint(claimed)
                await asyncio.gather(*(self._send_group(sender, recorder, g, []) for g in groups.values()))
                await recorder.finish()
                await asyncio.get_running_loop().run_in_executor(self._db, self._apply)
                made += len(claimed)

    # -- the steps ----------------------------------------------------------------------------------
    def _housekeeping(self) -> None:
        """Record the attempts a worker that died left in the file (embedded), free the leases
        of workers of this host that died; then `every_so_often`."""
        self._db.submit(self._apply).result()
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
        self, sender: Sender, recorder: _Recorder, group: list[outbox.Claimed], held: list[str]
    ) -> None:
        if isinstance(sender, ProcessSender) and self._journal_path is not None:
            done = await sender.send_group(group, self._journal_path)
            self.sent += done.sent
            for f in done.failed:
                self._log_failure(f.delivery_id, f.type, f.endpoint_id, f.why, f.next_at)
            if done.sent < len(group) and not self._stopping:
                # the sending process died: what it sent is in the file; the rest is due again
                await asyncio.get_running_loop().run_in_executor(self._db, self._guarded, self._apply)
                if self._journal is not None and not self._journal.has_any():
                    self._guarded(lambda: self._release([c.delivery_id for c in group]))
            return
        for claimed in group:
            if self._stopping:
                return
            try:
                await self.attempt(sender, recorder, claimed)
            except SenderLost as lost:
                # nothing recorded for this one: it and the rest of the group are due again
                log.warning("webhook deliveries to endpoint %s paused: %s", claimed.endpoint_id, lost)
                unsent = list(held) or [c.delivery_id for c in group[group.index(claimed) :]]
                self._guarded(functools.partial(self._release, unsent))
                held.clear()
                return
            with contextlib.suppress(ValueError):
                held.remove(claimed.delivery_id)

    def _write(self, attempts: list[outbox.Attempt]) -> None:
        """Record attempts (on the database thread): in the file on the embedded database (in
        the database a group at a time: `_apply`), in the database on PostgreSQL."""
        journal = self._opened()
        if journal is None:
            self._record(attempts)
            return
        journal.append(attempts)
        self._appended += len(attempts)
        if self._appended >= APPLY_AT:
            self._guarded(self._apply)  # kept in the file: a database that fails loses none

    def _apply(self) -> None:
        """Record the attempts in the file in the database, then empty it (database thread)."""
        journal = self._opened()
        if journal is not None and journal.has_any():
            journal.take(self._record)
            self._appended = 0

    def _opened(self) -> AttemptJournal | None:
        if self._journal is None and self._journal_path is not None:
            self._journal = AttemptJournal(self._journal_path)
        return self._journal

    def _record(self, attempts: list[outbox.Attempt]) -> None:
        now = self._clock()
        with self._store.outbox() as db:
            disabled = outbox.record(db, attempts, now - schedule.DISABLE_AFTER)
        for endpoint_id, reason in disabled.items():
            log.warning("webhook endpoint %s disabled: %s", endpoint_id, reason)

    async def attempt(self, sender: Sender, recorder: _Recorder, claimed: outbox.Claimed) -> outbox.Outcome:
        """Sign and send one delivery, and record the attempt (this returns once it is committed)."""
        now = self._clock()
        outcome = await sender.send(claimed.url, claimed.body, headers_at(claimed, now))
        self.sent += 1
        retry = next_at(claimed, outcome, now, self._rng)
        await recorder.record(outbox.Attempt.of(claimed, outcome, now, retry))
        if not outcome.succeeded:
            why = outcome.error or f"HTTP {outcome.response_status}"
            self._log_failure(claimed.delivery_id, claimed.type, claimed.endpoint_id, why, retry)
        return outcome

    @staticmethod
    def _log_failure(delivery_id: str, kind: str, endpoint_id: str, why: str, retry: datetime | None) -> None:
        log.info(
            "webhook delivery %s (%s) to endpoint %s failed: %s; %s",
            delivery_id,
            kind,
            endpoint_id,
            why,
            f"next attempt at {retry:%Y-%m-%dT%H:%M:%SZ}" if retry else "no more attempts",
        )

    def _sender(self, own_process: bool) -> Sender:
        if own_process:
            return ProcessSender(self._allow_private)
        return InlineSender(self._allow_private, self._resolver)


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
                    ids = ", ".join(a.delivery_id for a, _ in group)
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
