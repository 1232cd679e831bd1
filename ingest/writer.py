"""The group-commit writer: the one thread that writes to the database.

Callers hand it an operation (a function of a `Tx`); the writer runs every operation that queued
up while the previous commit was in flight inside one transaction, commits once, and only then
resolves each caller's future. So a request is answered only after its event is durable, and many
concurrent requests share one commit.

An operation that raises `TallyError` has its own writes dropped (`Tx.mark`/`Tx.release`) and
the rest of the group commits; when its writes cannot be dropped alone (database statements ran),
the group is rolled back and replayed one by one. An unexpected failure rolls the whole batch
back and replays its operations one by one, so a bad operation fails alone. A resource fault at
commit (`DatabaseUnavailable`: disk full, database unreachable) fails the whole group at once:
nothing of it was stored. The copier retries a failing copy with a growing pause, up to
`COPY_BACKOFF_MAX_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ingest.domain.errors import DatabaseUnavailable, ServiceUnavailable, TallyError
from ingest.storage.contract import Needs, Store, Tx

T = TypeVar("T")
log = logging.getLogger("tally.writer")

MAX_BATCH = 256
# The copier moves journaled rows into the database once this many have waited, or once the
# oldest has waited this long: small, frequent copies keep each copy's share of the GIL short,
# so the requests around it are not held up.
COPY_ROWS = 4_000
COPY_EVERY_SECONDS = 1.0
COPY_POLL_SECONDS = 0.02
COPY_BACKOFF_MAX_SECONDS = 5.0


@dataclass
class _Job(Generic[T]):
    """One operation and whoever waits for it: a thread (`future`) or an event loop (`waiter`)."""

    op: Callable[[Tx], T]
    future: Future[T] | None
    flush: bool = False
    waiter: asyncio.Future[T] | None = None
    queued: float = 0.0  # time.perf_counter() when handed to the writer (for the wait metric)
    needs: Needs | None = None  # what it will claim and look up (read ahead for the whole group)


Outcome = tuple[_Job[Any], bool, Any]


class KeyChanged(ServiceUnavailable):
    """Handed back by the writer when the program key an operation was let in with changed
    since it was read (a replica's cached copy; `Tx.outdated`): the endpoint decides the request
    again with the key as it is now. A client sees it (503) only if that keeps happening. Not
    in the error catalogue: its code is `service_unavailable`'s."""


def _settle_async(outcomes: list[Outcome]) -> None:
    """On the event loop: resolve every waiter of one commit (one wake-up for the whole batch)."""
    for job, ok, value in outcomes:
        waiter = job.waiter
        if waiter is None or waiter.done():
            continue
        if ok:
            waiter.set_result(value)
        else:
            waiter.set_exception(value)


_STOP = object()


class _Unclean(Exception):
    """Raised inside `_commit` when an operation failed after database statements ran, so its
    writes can only be dropped by rolling the whole transaction back."""

    def __init__(self, error: TallyError) -> None:
        super().__init__(error.message)
        self.error = error


def _nothing(tx: Tx) -> None:
    return None


class Writer:
    """Owns the write side of a `Store` on a dedicated thread."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="tally-writer", daemon=True)
        self._copier = threading.Thread(target=self._copy_loop, name="tally-copier", daemon=True)
        self._stopping = threading.Event()
        self._local = threading.local()  # per event-loop thread: jobs not yet handed over
        self._running = False
        self.commits = 0
        self.operations = 0
        # Called after each successful group commit with (operations, seconds the oldest waited);
        # the app's metrics (api.observability) set it.
        self.on_commit: Callable[[int, float], None] | None = None

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        self._running = True
        self._thread.start()
        self._copier.start()

    def stop(self) -> None:
        if self._running:
            self._running = False
            self._queue.put(_STOP)
            self._thread.join()
            self._stopping.set()
            self._copier.join()
            self._flush()

    def submit(self, op: Callable[[Tx], T], flush: bool = False, needs: Needs | None = None) -> Future[T]:
        future: Future[T] = Future()
        if not self._running:
            future.set_exception(ServiceUnavailable("tally is not accepting writes right now"))
            return future
        self._queue.put(_Job(op, future, flush, None, time.perf_counter(), needs))
        return future

    async def run(self, op: Callable[[Tx], T], flush: bool = False, needs: Needs | None = None) -> T:
        """Run `op` in the writer and wait (without blocking the event loop) until it is durable.
        With `flush`, also wait until the store's reads (`Store.reader()`) see it. `needs` says what it
        will claim and look up: the group commit reads that for all its operations at once.

        Jobs from one turn of the event loop are handed to the writer together (one queue put,
        one wake-up of the writer thread) by a callback that runs right after that turn."""
        if not self._running:
            raise ServiceUnavailable("tally is not accepting writes right now")
        local = self._local
        loop: asyncio.AbstractEventLoop | None = getattr(local, "loop", None)
        if loop is None or not loop.is_running():  # (asking the running loop costs a getpid call)
            loop = local.loop = asyncio.get_running_loop()
            local.outbox = []
        waiter: asyncio.Future[T] = loop.create_future()
        outbox: list[_Job[Any]] = local.outbox
        if not outbox:
            loop.call_soon(self._hand_over, outbox)
        outbox.append(_Job(op, None, flush, waiter, time.perf_counter(), needs))
        return await waiter

    def _hand_over(self, outbox: list[_Job[Any]]) -> None:
        jobs = outbox[:]
        outbox.clear()
        if self._running:
            self._queue.put(jobs)
            return
        stopped = ServiceUnavailable("tally is not accepting writes right now")
        _settle_async([(job, False, stopped) for job in jobs])

    def run_sync(self, op: Callable[[Tx], T], flush: bool = False) -> T:
        return self.submit(op, flush).result()

    async def sync(self) -> None:
        """Wait until everything committed so far is visible to the store's reads."""
        await self.run(_nothing, flush=True)

    def sync_blocking(self) -> None:
        self.run_sync(_nothing, flush=True)

    # -- the writer thread ----------------------------------------------------------------------
    def _copy_loop(self) -> None:
        pause, next_try = 0.0, 0.0
        while not self._stopping.wait(COPY_POLL_SECONDS):
            rows, waited = self._store.backlog()
            if (rows >= COPY_ROWS or waited >= COPY_EVERY_SECONDS) and time.monotonic() >= next_try:
                if self._flush():
                    pause = 0.0
                else:
                    pause = min(COPY_BACKOFF_MAX_SECONDS, max(0.1, pause * 2))
                    next_try = time.monotonic() + pause

    def _loop(self) -> None:
        """Commit whatever queued up meanwhile as one group (at least `MAX_BATCH` jobs when that
        many are waiting; a hand-over from the event loop is never split)."""
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch: list[_Job[Any]] = item if isinstance(item, list) else [item]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                if isinstance(nxt, list):
                    batch.extend(nxt)
                else:
                    batch.append(nxt)
            self._commit(batch)
            if stop:
                return

    def _flush(self) -> bool:
        try:
            self._store.flush()
        except DatabaseUnavailable as exc:  # the journal still holds everything; retried later
            log.error("%s; will retry", exc.message)
            return False
        except Exception:
            log.exception("copying the journal into the database failed; will retry")
            return False
        return True

    def _commit(self, batch: list[_Job[Any]]) -> None:
        outcomes: list[Outcome] = []
        try:
            tx = self._store.begin()
        except DatabaseUnavailable as exc:
            self._settle([(job, False, exc) for job in batch])
            return
        except Exception as exc:  # never let the writer thread die: every waiter would hang
            log.exception("opening a group commit failed")
            self._settle([(job, False, exc) for job in batch])
            return
        try:
            needs = [job.needs for job in batch if job.needs is not None]
            if needs:
                tx.prefetch(needs)
            for job in batch:
                if job.needs is not None and job.needs.key is not None and tx.outdated(job.needs):
                    changed = KeyChanged("the program key changed while this request was decided; retry")
                    outcomes.append((job, False, changed))
                    continue
                mark = tx.mark()
                try:
                    outcomes.append((job, True, job.op(tx)))
                except TallyError as exc:
                    if not tx.release(mark):
                        raise _Unclean(exc) from exc
                    outcomes.append((job, False, exc))
            tx.commit()
        except DatabaseUnavailable as exc:
            tx.rollback()
            self._settle([(job, False, exc) for job in batch])
            return
        except Exception as exc:
            tx.rollback()
            if self._store.resource_fault(exc):  # the database went away under the operations
                log.error("a group commit failed for want of the database: %s", exc)
                unavailable = DatabaseUnavailable(
                    "tally cannot reach its database right now; nothing of this request was stored"
                )
                self._settle([(job, False, unavailable) for job in batch])
                return
            if isinstance(exc, _Unclean) and len(batch) == 1:
                self._settle([(batch[0], False, exc.error)])
            elif len(batch) > 1:
                log.warning("batch of %d failed (%s); replaying one by one", len(batch), exc)
                for job in batch:
                    self._commit([job])
            else:
                log.exception("write operation failed")
                self._settle([(batch[0], False, exc)])
            return
        self.commits += 1
        self.operations += len(batch)
        if self.on_commit is not None:
            self.on_commit(len(batch), time.perf_counter() - batch[0].queued)
        if any(job.flush for job in batch):
            try:
                self._store.flush()
            except Exception as exc:
                outcomes = [(job, False, exc) if job.flush else (job, ok, v) for job, ok, v in outcomes]
        self._settle(outcomes)

    @staticmethod
    def _settle(outcomes: list[Outcome]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
        for outcome in outcomes:
            job, ok, value = outcome
            if job.waiter is not None:
                by_loop.setdefault(job.waiter.get_loop(), []).append(outcome)
            elif job.future is not None:
                if ok:
                    job.future.set_result(value)
                else:
                    job.future.set_exception(value)
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_settle_async, items)
