"""The reconcile job inside the server: on a schedule (APScheduler) and on demand.

One run at a time, among every process that shares the database: a run holds the `reconcile`
lease (ingest/storage/contract.py), renewed while it lasts; a holder that dies frees it at once (its
connection's advisory lock on PostgreSQL; on the embedded file the lease names its process,
`ingest.storage.lockfile.identity()`, and a process that no longer runs holds nothing). A call that
needs the lock while a run holds it is answered at once, 409 `reconcile_running` with
`Retry-After` (`ReconcileRunning`): no thread ever waits for the lock, so a long run cannot use
up the threads the reads and `/readyz` need. Journaled raw rows are first made visible (the
writer flushes), then the job reads the raw log on its own cursor and replaces the materialised
tables atomically.

On a shared database with `TALLY_RECONCILE_PARTITIONS` above 1 the programs are split into
that many partitions (ingest/storage/partitions.py), each with a lease of its own
(`reconcile/<n>-of-<parts>`): a scheduled run takes every partition it can without waiting,
starting at one that depends on the process, and reconciles them one after the other, so that
replicas share the work; the operator's run and a backfill take them all; a period close and
an action on one program's money (`act`: payout batches, their payment, cancel and failed rows,
finance actions, manual entries) take their program's only, so other partitions' programs go on
meanwhile (each partition has a lock of its own in the process too). A partition's run pulls,
reconciles, books and publishes that partition's programs only.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, date, timedelta
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.background import BackgroundScheduler

import reconcile.run
from ingest import actions
from ingest.domain.clock import utcnow
from ingest.domain.errors import DatabaseUnavailable, ReconcileRunning
from ingest.pause import pause
from ingest.progress import Progress
from ingest.storage import lockfile
from ingest.storage.contract import Store, Tx
from ingest.storage.partitions import Scope, part_of, scopes
from ingest.writer import Writer
from reconcile import backfill, unroutable
from reconcile.backfill import BackfillDiff

if TYPE_CHECKING:
    from api.observability import Observer

log = logging.getLogger("tally.reconcile")


LEASE = "reconcile"
DERIVE_LEASE = "reconcile/webhook-events"  # in partitions: who derives webhook events after a run
LEASE_TTL = timedelta(minutes=10)  # renewed at each progress step of a run
BOOKING_GROUP = 2_000  # booking rows appended in one group commit


def lease_name(scope: Scope | None) -> str:
    """The lease a run of `scope` (None: the whole log) holds."""
    return LEASE if scope is None else f"{LEASE}/{scope.part + 1}-of-{scope.parts}"


def combined(summaries: Sequence[reconcile.run.RunSummary]) -> reconcile.run.RunSummary:
    """One summary of the runs of several partitions (in order; the last one's id): counts
    added up, the highest high water, `full` when any was full, the unroutable events of the
    first partition's run when it is among them (the others hold none: their count is 0)."""
    last = summaries[-1]
    if len(summaries) == 1:
        return last
    return replace(
        last,
        events_read=sum(s.events_read for s in summaries),
        sales=sum(s.sales for s in summaries),
        commissions=sum(s.commissions for s in summaries),
        duration_ms=sum(s.duration_ms for s in summaries),
        high_water_seq=max(s.high_water_seq for s in summaries),
        mode="full" if any(s.mode == "full" for s in summaries) else last.mode,
        unroutable=max(s.unroutable for s in summaries),
        unbooked_closes=tuple(sorted({p for s in summaries for p in s.unbooked_closes})),
    )


def _appending(rows: list[dict[str, Any]]) -> Callable[[Tx], None]:
    """A writer operation appending `rows` to the raw log."""

    def op(tx: Tx) -> None:
        for row in rows:
            tx.append(row)

    return op


class Reconciler:
    """Runs `reconcile.run.run` for the app; `interval_seconds` 0 means on demand only."""

    def __init__(
        self, store: Store, writer: Writer, interval_seconds: int, observer: Observer | None = None
    ) -> None:
        self._store = store
        self._observer = observer
        self._writer = writer
        self._interval = interval_seconds
        self._holder = f"{lockfile.identity()}:{uuid.uuid4().hex[:8]}"
        self._scopes = scopes(store.partitions)
        # One lock per partition: an action on one program holds its partition only, so the
        # programs of other partitions are not kept waiting (one partition: one lock for all).
        self._locks = {scope: threading.Lock() for scope in self._scopes}
        self._last_seconds = 1.0  # how long the last run took: the Retry-After of a busy answer
        self._scheduler: BackgroundScheduler | None = None
        # Done after every run, the run lock still held, with the run's tables published: the
        # webhook events of what changed (api/outbound/derive.py). It must not raise.
        self.after_run: Callable[[], None] | None = None

    def start(self) -> None:
        if self._interval <= 0:
            return
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._scheduler.add_job(
            self._scheduled,
            "interval",
            seconds=self._interval,
            id="reconcile",
            max_instances=1,
            coalesce=True,
        )
        self._scheduler.start()

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None

    def scope_of(self, program_id: str) -> Scope | None:
        """The partition `program_id` is reconciled in (None: a single one)."""
        parts = len(self._scopes)
        return self._scopes[0] if parts == 1 else Scope(part_of(program_id, parts), parts)

    @contextmanager
    def _run_lock(self, wanted: Sequence[Scope | None] | None = None) -> Iterator[list[Scope | None]]:
        """This process's locks, then the database's `reconcile` leases, of every partition (or
        of those `wanted`), all taken without waiting: `ReconcileRunning` at once when a run
        (here or in another process) holds one. The scopes held, in order."""
        chosen = list(self._scopes if wanted is None else wanted)
        locked: list[threading.Lock] = []
        held: list[Scope | None] = []
        try:
            for scope in chosen:
                lock = self._locks[scope]
                if not lock.acquire(blocking=False):
                    raise self._busy("a reconcile run is in progress")
                locked.append(lock)
            self._check_agreed()
            for scope in chosen:
                if not self._store.acquire_lease(lease_name(scope), self._holder, utcnow(), LEASE_TTL):
                    raise self._busy("another process is running a reconcile")
                held.append(scope)
            yield list(held)
        finally:
            for scope in held:
                self._store.release_lease(lease_name(scope), self._holder)
            for lock in locked:
                lock.release()

    def _check_agreed(self) -> None:
        """`ReconcileRunning` (saying what to do) when this replica's partitions are not the
        database's: those of the replica started last (`Store.reconcile_partitions`)."""
        agreed = self._store.reconcile_partitions()
        if agreed == len(self._scopes):
            return
        log.error(
            "this replica reconciles in %d partitions, the database in %d (TALLY_RECONCILE_PARTITIONS"
            " of the replica started last): restart it with the same setting",
            len(self._scopes),
            agreed,
        )
        raise ReconcileRunning(
            f"this replica reconciles in {len(self._scopes)} partitions and the database in {agreed};"
            " restart it with the same TALLY_RECONCILE_PARTITIONS",
            retry_after=60,
        )

    def _order(self) -> list[Scope | None]:
        """The partitions in the order this process asks for them: from one that depends on the
        process, so that replicas starting together begin with different ones."""
        start = int(self._holder.rsplit(":", 1)[-1], 16) % len(self._scopes)
        return self._scopes[start:] + self._scopes[:start]

    def _busy(self, why: str) -> ReconcileRunning:
        wait = min(60, max(1, math.ceil(self._last_seconds)))
        return ReconcileRunning(f"{why}; try again in {wait} s", retry_after=wait)

    def check_free(self) -> None:
        """`ReconcileRunning` when a run of this process holds the lock now (a cheap check before
        a streamed answer starts; the run itself still takes the lock)."""
        if any(lock.locked() for lock in self._locks.values()):
            raise self._busy("a reconcile run is in progress")

    def _renewing(self, on_progress: Progress | None, held: Sequence[Scope | None]) -> Progress:
        """`on_progress`, renewing the leases `held` on the way when a third of their time has
        passed."""
        renewed = [time.monotonic()]

        def progress(stage: str, done: int, total: int) -> None:
            if time.monotonic() - renewed[0] > LEASE_TTL.total_seconds() / 3:
                for scope in held:
                    self._store.acquire_lease(lease_name(scope), self._holder, utcnow(), LEASE_TTL)
                renewed[0] = time.monotonic()
            if on_progress:
                on_progress(stage, done, total)

        return progress

    def _scheduled(self) -> None:
        try:
            self.run() if len(self._scopes) == 1 else self.run_free()
        except ReconcileRunning:
            log.info("scheduled reconcile skipped: a run holds the run lease")
        except Exception:  # a failed run leaves the previous results in place; the next run retries
            log.exception("scheduled reconcile failed")

    def run(
        self,
        on_progress: Progress | None = None,
        before: Callable[[], object] | None = None,
        program_id: str | None = None,
    ) -> Any:
        """One run now (of every partition, or of `program_id`'s only); `ReconcileRunning` at
        once when a run holds the lock, `DatabaseUnavailable` when the database cannot take its
        writes (disk full...), the previous results staying in place. `before`: done first under
        the lock (a period close's append), so that it is never done when the run cannot be."""
        with self._run_lock(None if program_id is None else [self.scope_of(program_id)]) as held:
            if before is not None:
                before()
            return self._run_held(self._renewing(on_progress, held), held)

    def run_free(self, on_progress: Progress | None = None) -> reconcile.run.RunSummary:
        """In partitions (the scheduled runs): each partition no other process is running, one
        after the other, its lease held while it runs, from the one `_order` gives first; so
        replicas on the same schedule take different partitions. `ReconcileRunning` when this
        process runs already, or other processes ran or are running every partition."""
        self.check_free()
        self._check_agreed()
        summaries = []
        for scope in self._order():
            try:
                with self._run_lock([scope]) as held:
                    summaries.append(self._run_partition(self._renewing(on_progress, held), scope))
            except ReconcileRunning:
                continue  # another process runs it (or this one does: an operator's run)
        if not summaries:
            raise self._busy("other processes are running every reconcile partition")
        self._derive()
        return combined(summaries)

    def _run_held(self, report: Progress, held: Sequence[Scope | None]) -> reconcile.run.RunSummary:
        """One run of each partition `held` (the run lock and their leases held): the journal
        flushed, then reconcile.run.run (the engine brought up to the log; publishing where it
        is not the database itself); then the lines it shows approved that no booking holds are
        booked in the log, and the run is made again on the log with those bookings
        (reconcile/bookings.py)."""
        summaries = [self._run_partition(report, scope) for scope in held]
        self._derive()
        return combined(summaries)

    def _run_partition(self, report: Progress, scope: Scope | None) -> reconcile.run.RunSummary:
        summary = self._run_once(report, scope)
        if self._book(summary, report, scope):
            summary = self._run_once(report, scope)
        return summary

    def _derive(self) -> None:
        """`after_run`, one process at a time: under the run lease; in partitions, under a lease
        of its own (`DERIVE_LEASE`), skipped when another process holds it (what it has not seen
        yet is found by the next one: the deriver compares the published tables with its marks)."""
        if self.after_run is None:
            return
        if len(self._scopes) == 1:
            self.after_run()
            return
        if not self._store.acquire_lease(DERIVE_LEASE, self._holder, utcnow(), LEASE_TTL):
            log.info("webhook events not derived after this run: another process derives them")
            return
        try:
            self.after_run()
        finally:
            self._store.release_lease(DERIVE_LEASE, self._holder)

    def _run_once(self, report: Progress, scope: Scope | None = None) -> reconcile.run.RunSummary:
        report("flushing the journal", 0, 1)
        self._writer.sync_blocking()
        report("catching up with the log", 0, 1)
        started = time.perf_counter()
        try:
            summary = reconcile.run.run(self._store, utcnow(), report, scope=scope)
        except reconcile.run.ReconcileFailed as exc:
            self._failed(exc)
            if self._store.resource_fault(exc):
                raise DatabaseUnavailable(f"reconcile could not write its results: {exc}") from exc
            raise
        except Exception as exc:
            self._failed(exc)
            raise
        self._ran(summary, time.perf_counter() - started, scope)
        return summary

    def _book(self, summary: reconcile.run.RunSummary, report: Progress, scope: Scope | None = None) -> int:
        """Append the bookings of every line (of the programs of partition `scope`) shown
        approved that no booking holds yet (as of the run's high water), and those of the period
        closes no booking holds yet (reconcile/periods.py); the number of rows appended."""
        with self._store.reader() as db:
            if not db.table_exists("rc_commissions"):
                return 0
            lines = db.dicts(actions.DUE_LINES_SQL)
        if scope is not None:
            lines = [line for line in lines if scope.owns(str(line["program_id"]))]
        rows = actions.booking_rows(lines, summary.high_water_seq)
        for start in range(0, len(rows), BOOKING_GROUP):
            report("booking approved lines", start, len(rows))
            self._writer.run_sync(_appending(rows[start : start + BOOKING_GROUP]), flush=True)
        return len(rows) + self._book_closes(summary.unbooked_closes, report, scope)

    def _book_closes(self, programs: Sequence[str], report: Progress, scope: Scope | None) -> int:
        """Book the period closes of `programs` that no booking holds yet: once, their snapshots
        valued on the log and appended (a booking's rows, then its marker: cut short, it is
        never read back, and the next run books the close again)."""
        if scope is not None:
            programs = [program for program in programs if scope.owns(program)]
        if not programs:
            return 0
        report("booking period closes", 0, len(programs))
        changes = reconcile.run.close_bookings(self._store, programs, utcnow(), scope)
        rows = actions.close_booking_rows(changes.to_dicts())
        for start in range(0, len(rows), BOOKING_GROUP):
            report("booking period closes", start, len(rows))
            self._writer.run_sync(_appending(rows[start : start + BOOKING_GROUP]), flush=True)
        log.info("booked %d period close rows of %d programs", len(rows), len(programs))
        return len(rows)

    def act(
        self, decide: Callable[[], dict[str, Any] | None], program_id: str | None = None
    ) -> dict[str, Any] | None:
        """An engineer action decided on up-to-date tables, one at a time: under the run lock
        (of `program_id`'s partition only, when given: the programs of the others go on),
        reconcile; `decide()` (reading the fresh tables) gives the raw-log row to append, or
        None; an appended row is reconciled at once. The row appended, or None."""
        with self._run_lock(None if program_id is None else [self.scope_of(program_id)]) as held:
            report = self._renewing(None, held)
            self._run_held(report, held)
            row = decide()
            if row is None:
                return None
            pause("act.decided")  # the crash tests: decided, nothing appended
            self._writer.run_sync(lambda tx: tx.append(row), flush=True)
            pause("act.appended")  # the row durable, not reconciled yet
            self._run_held(report, held)
            pause("act.reconciled")  # reconciled, the caller not answered yet
            return row

    def _ran(self, summary: reconcile.run.RunSummary, seconds: float, scope: Scope | None = None) -> None:
        """Log a finished run (its id, partition, mode, duration and rows) and record it in the
        metrics (the unroutable events from the run that holds them: the whole log's, or the
        first partition's)."""
        self._last_seconds = seconds
        log.info(
            "reconcile run %s (%s%s) in %.0f ms: %d events read, %d sales, %d commissions, %d unroutable",
            summary.run_id,
            summary.mode,
            "" if scope is None else f", partition {scope.label}",
            seconds * 1000,
            summary.events_read,
            summary.sales,
            summary.commissions,
            summary.unroutable,
            extra={
                "run_id": summary.run_id,
                "mode": summary.mode,
                "duration_ms": round(seconds * 1000, 3),
                "events_read": summary.events_read,
                "sales": summary.sales,
                "commissions": summary.commissions,
                "unroutable": summary.unroutable,
                **({} if scope is None else {"partition": scope.label}),
            },
        )
        if self._observer is not None:
            self._observer.reconciled(summary, seconds, unroutable=scope is None or scope.part == 0)

    def _failed(self, exc: BaseException) -> None:
        log.error("reconcile run failed: %s", exc)
        if self._observer is not None:
            self._observer.reconcile_failed()

    def backfill(
        self, backfill_row: dict[str, Any], apply: bool, start: date | None = None, end: date | None = None
    ) -> tuple[BackfillDiff, list[dict[str, Any]]]:
        """Preview (and with `apply`, append and reconcile) a backfill over [start, end], with the
        unroutable events it picks up (reconcile/unroutable.py; returned as their raw rows). The
        diff is computed on the same snapshot the rows are appended after, so the dry run is a
        true preview."""
        program_id = str(backfill_row["program_id"])
        with self._run_lock() as held:
            self._writer.sync_blocking()
            raw, programs, partners, stray = reconcile.run.backfill_inputs(self._store, program_id)
            chosen = unroutable.pickup(stray, programs, program_id, start, end)
            # The events whole, from the log itself (a working copy keeps no bodies).
            with self._store.reader() as db:
                found = db.raw_rows([int(seq) for seq in chosen.get_column("seq")]) if chosen.height else []
            picked = actions.picked_up(backfill_row, found)
            result = backfill.preview(raw, programs, partners, backfill_row, utcnow(), picked)
            if apply:
                self._writer.run_sync(lambda tx: actions.apply_backfill(tx, backfill_row, picked), flush=True)
                self._run_held(self._renewing(None, held), held)  # reconciled and booked, as every run
            return result, found
