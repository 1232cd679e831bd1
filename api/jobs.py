"""The reconcile job inside the server: on a schedule (APScheduler) and on demand.

One run at a time: journaled raw rows are first made visible to DuckDB (the writer flushes), then
the job reads the raw log on its own cursor and replaces the materialised tables atomically.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from ingest.clock import utcnow
from ingest.duckdb_store import DuckStore
from ingest.errors import DatabaseUnavailable
from ingest.writer import Writer
from reconcile import backfill, job
from reconcile.backfill import BackfillDiff

log = logging.getLogger("tally.reconcile")

Progress = Callable[[str, int, int], None]


class Reconciler:
    """Runs `reconcile.job.run` for the app; `interval_seconds` 0 means on demand only."""

    def __init__(self, store: DuckStore, writer: Writer, interval_seconds: int) -> None:
        self._store = store
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
            summary = self.run()
            log.info(
                "reconcile run %s: %d events, %d sales", summary.run_id, summary.events_read, summary.sales
            )
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
                try:
                    return job.run(cur, utcnow(), on_progress)
                except job.ReconcileFailed as exc:
                    if self._store.resource_fault(exc):
                        raise DatabaseUnavailable(f"reconcile could not write its results: {exc}") from exc
                    raise

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
                    job.run(cur, utcnow())
            return result
