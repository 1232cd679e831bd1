"""The reconcile job inside the server: on a schedule (APScheduler) and on demand.

One run at a time: journaled raw rows are first made visible to DuckDB (the writer flushes), then
the job reads the raw log on its own cursor and replaces the materialised tables atomically.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC
from typing import TYPE_CHECKING, Any

import duckdb
from apscheduler.schedulers.background import BackgroundScheduler

from ingest.clock import utcnow
from ingest.duckdb_store import DuckStore
from ingest.errors import DatabaseUnavailable
from ingest.writer import Writer
from reconcile import backfill, job
from reconcile.backfill import BackfillDiff

if TYPE_CHECKING:
    from api.observability import Observer

log = logging.getLogger("tally.reconcile")

Progress = Callable[[str, int, int], None]


class Reconciler:
    """Runs `reconcile.job.run` for the app; `interval_seconds` 0 means on demand only."""

    def __init__(
        self, store: DuckStore, writer: Writer, interval_seconds: int, observer: Observer | None = None
    ) -> None:
        self._store = store
        self._observer = observer
        self._writer = writer
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None

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

    def _scheduled(self) -> None:
        try:
            self.run()
        except Exception:  # a failed run leaves the previous results in place; the next run retries
            log.exception("scheduled reconcile failed")

    def run(self, on_progress: Progress | None = None) -> Any:
        """One run now; `DatabaseUnavailable` when the database cannot take its writes (disk
        full...), the previous results staying in place."""
        with self._lock:
            if on_progress:
                on_progress("flushing the journal", 0, 1)
            self._writer.sync_blocking()
            with self._store.snapshot() as cur:
                started = time.perf_counter()
                try:
                    summary = job.run(cur, utcnow(), on_progress)
                except job.ReconcileFailed as exc:
                    self._failed(exc)
                    if self._store.resource_fault(exc):
                        raise DatabaseUnavailable(f"reconcile could not write its results: {exc}") from exc
                    raise
                except Exception as exc:
                    self._failed(exc)
                    raise
                self._ran(cur, summary, time.perf_counter() - started)
                return summary

    def _ran(self, cur: duckdb.DuckDBPyConnection, summary: job.RunSummary, seconds: float) -> None:
        """Log a finished run (its id, mode, duration and rows) and record it in the metrics."""
        log.info(
            "reconcile run %s (%s) in %.0f ms: %d events read, %d sales, %d commissions",
            summary.run_id,
            summary.mode,
            seconds * 1000,
            summary.events_read,
            summary.sales,
            summary.commissions,
            extra={
                "run_id": summary.run_id,
                "mode": summary.mode,
                "duration_ms": round(seconds * 1000, 3),
                "events_read": summary.events_read,
                "sales": summary.sales,
                "commissions": summary.commissions,
            },
        )
        if self._observer is not None:
            try:
                row = cur.execute("SELECT count(*) FROM rc_unroutable").fetchone()
            except duckdb.Error:  # no such table (nothing reconciled yet)
                row = None
            self._observer.reconciled(summary, seconds, int(row[0]) if row else None)

    def _failed(self, exc: BaseException) -> None:
        log.error("reconcile run failed: %s", exc)
        if self._observer is not None:
            self._observer.reconcile_failed()

    def backfill(self, backfill_row: dict[str, Any], apply: bool) -> BackfillDiff:
        """Preview (and with `apply`, append and reconcile) a backfill. The diff is computed on
        the same snapshot the row is appended after, so the dry run is a true preview."""
        with self._lock:
            self._writer.sync_blocking()
            with self._store.snapshot() as cur:
                raw, programs, partners = job.read(cur, program_id=str(backfill_row["program_id"]))
            result = backfill.preview(raw, programs, partners, backfill_row, utcnow())
            if apply:
                self._writer.run_sync(lambda tx: tx.append(backfill_row), flush=True)
                with self._store.snapshot() as cur:
                    started = time.perf_counter()
                    self._ran(cur, job.run(cur, utcnow()), time.perf_counter() - started)
            return result
