"""Logs and metrics (docs/observability.md).

Logs: `configure_logging` hands every record (through a deque: no lock, no thread wake-up per
record) to one writer thread that formats what queued up (text or JSON) and writes it in one write
every 50 ms: the event loop never waits on a write, and an access record's message is only
formatted there. One access line per request, the
same from both lanes (`api.hotpath` calls `Observer.request` itself; `ObserveMiddleware` does it for
the full stack). Only the route template is logged, never the raw path, query or headers.

Metrics: `Observer` owns one `CollectorRegistry` per app (tests create many apps), with
prometheus_client's `process_*` collector and `tally_build_info`; no `_created` series. Request counts
and latency histograms are plain dicts updated on the event loop (`_RequestStats`), read when
`/metrics` is scraped (on the loop as well). What the store and the
reconciler already know (journal backlog, set-aside batches, events ingested, unroutable events)
is read when `/metrics` is scraped, by `_StoreCollector`, not counted on the hot path.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from typing import IO, TYPE_CHECKING, Any

import orjson
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reconcile.run import derived

if TYPE_CHECKING:
    from api.settings import Settings
    from api.state import State
    from ingest.storage.contract import Store
    from reconcile.run.job import RunSummary

access_log = logging.getLogger("tally.access")

# -- logs ------------------------------------------------------------------------------------------
# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _utc(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """`2026-11-23T22:55:45.123Z INFO tally.access POST /api/v1/track/sale 200 1.27ms request_id=req_...`"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_utc(record.created)} {record.levelname} {record.name} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            line += "\n" + record.exc_text
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the record's fields, and `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return orjson.dumps(entry, default=str).decode()


class _BatchingHandler(logging.Handler):
    """Hands records to `_LogWriter` through a deque: no lock, no wake-up of another thread per
    record. Records whose arguments might change later (anything but an access line, whose
    arguments are strings and numbers) have their message fixed now; access lines are formatted
    only by the writer thread."""

    def __init__(self, pending: deque[logging.LogRecord]) -> None:
        super().__init__()
        self._pending = pending

    def handle(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != "tally.access" and record.args:
            record.msg, record.args = record.getMessage(), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self._pending.append(record)


class _LogWriter(threading.Thread):
    """Every `every` seconds, formats what queued up and writes it in one write."""

    def __init__(
        self,
        pending: deque[logging.LogRecord],
        access: deque[AccessEntry],
        formatter: logging.Formatter,
        stream: IO[str],
        every: float,
    ) -> None:
        super().__init__(name="tally-log-writer", daemon=True)
        self._pending = pending
        self._access = access
        self._json = isinstance(formatter, JsonFormatter)
        self._formatter = formatter
        self._stream = stream
        self._every = every
        self._stop_event = threading.Event()
        self.held = False  # while set, lines wait (tally serve holds them until it has started)

    def run(self) -> None:
        while not self._stop_event.wait(self._every):
            if not self.held:
                self.drain()
        self.drain()

    def discard(self) -> None:
        self._pending.clear()
        self._access.clear()

    def drain(self) -> None:
        entries: list[tuple[float, str]] = []
        pending, fmt = self._pending, self._formatter.format
        while pending:
            record = pending.popleft()
            try:
                entries.append((record.created, fmt(record)))
            except Exception:  # a record that cannot be formatted must not stop the log
                entries.append(
                    (record.created, f"unformattable log record from {record.name}: {record.msg!r}")
                )
        access, line = self._access, self._access_line
        while access:
            entry = access.popleft()
            entries.append((entry[0], line(entry)))
        entries.sort(key=lambda e: e[0])  # access lines and other records in time order
        lines = [text for _, text in entries]
        if lines:
            try:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # stderr gone: nothing better to do with the lines
                pass

    def _access_line(self, entry: AccessEntry) -> str:
        """An access line as the formatter would write its record (docs/observability.md)."""
        created, method, route, status, ms, request_id = entry
        message = f"{method} {route} {status} {ms:.2f}ms request_id={request_id}"
        if not self._json:
            return f"{_utc(created)} INFO tally.access {message}"
        fields = {
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": ms,
            "request_id": request_id,
        }
        return orjson.dumps(
            {"time": _utc(created), "level": "INFO", "logger": "tally.access", "message": message, **fields}
        ).decode()

    def stop(self, timeout: float | None = None) -> None:
        """Write what is queued and end; give up after `timeout` seconds (a write blocked on a
        full pipe nobody reads; the thread is a daemon)."""
        self._stop_event.set()
        self.join(timeout)


# What configure_logging put in place, and the root level it found.
_installed: list[tuple[_BatchingHandler, _LogWriter, int]] = []
# Libraries whose INFO records are chatter beside tally's own lines (APScheduler: three lines at
# start, two per scheduled run, which tally.reconcile already reports): WARNING and above only,
# unless TALLY_LOG_LEVEL is DEBUG. Their levels before, restored by stop_logging.
QUIET_LOGGERS = ("apscheduler",)
_quieted: dict[str, int] = {}
# Access lines while configure_logging's writer runs: (time, method, route, status, ms, request id),
# appended by the event loop and made into lines by the writer thread (no LogRecord per request).
AccessEntry = tuple[float, str, str, int, float, "str | None"]
_access_sink: list[deque[AccessEntry]] = []
FLUSH_EVERY_SECONDS = 0.05


def configure_logging(settings: Settings, stream: IO[str] | None = None, hold: bool = False) -> None:
    """Route every log record (tally's, uvicorn's, libraries') to one writer thread that writes
    `settings.log_format` lines to `stream` (stderr) at `settings.log_level` and above, every
    `FLUSH_EVERY_SECONDS`. Replaces a previous configuration; `stop_logging` flushes at exit. With
    `hold`, nothing is written until `release_logging` (a failed start stays one line)."""
    stop_logging()
    root = logging.getLogger()
    formatter = JsonFormatter() if settings.log_format == "json" else TextFormatter()
    pending: deque[logging.LogRecord] = deque()
    access: deque[AccessEntry] = deque()
    handler = _BatchingHandler(pending)
    out = stream if stream is not None else sys.stderr
    writer = _LogWriter(pending, access, formatter, out, FLUSH_EVERY_SECONDS)
    writer.held = hold
    _installed.append((handler, writer, root.level))
    _access_sink.append(access)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    if settings.log_level != "DEBUG":
        for name in QUIET_LOGGERS:
            library = logging.getLogger(name)
            _quieted[name] = library.level
            library.setLevel(max(logging.WARNING, logging.getLevelName(settings.log_level)))
    writer.start()


def release_logging() -> None:
    """Let lines held back by `configure_logging(hold=True)` be written."""
    for _, writer, _ in _installed:
        writer.held = False


def stop_logging(discard: bool = False, timeout: float | None = None) -> None:
    """Flush (or with `discard`, drop what is still queued) and remove what `configure_logging`
    installed; with `timeout`, wait at most that long for the last write."""
    _access_sink.clear()
    while _quieted:
        name, level = _quieted.popitem()
        logging.getLogger(name).setLevel(level)
    while _installed:
        handler, writer, level = _installed.pop()
        if discard:
            writer.discard()
        root = logging.getLogger()
        root.removeHandler(handler)
        root.setLevel(level)
        writer.stop(timeout)


# -- metrics ---------------------------------------------------------------------------------------
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COMMIT_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
COMMIT_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
RECONCILE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # the route label of a request no route matched (404)
DISCONNECTED = 499  # the status label of a request whose client left before it was answered
RECONCILE_MODES = ("full", "incremental")


class _StoreCollector(Collector):
    """Gauges and counters read from the store and reconciler when `/metrics` is scraped."""

    def __init__(self, state: Callable[[], State | None], observer: Observer) -> None:
        self._state = state
        self._observer = observer

    @staticmethod
    def _families() -> list[GaugeMetricFamily | CounterMetricFamily]:
        return [
            GaugeMetricFamily(
                "tally_journal_backlog_rows", "Rows journaled (durable) but not yet copied into DuckDB."
            ),
            GaugeMetricFamily(
                "tally_journal_backlog_batches", "Group commits journaled but not yet copied into DuckDB."
            ),
            GaugeMetricFamily(
                "tally_journal_backlog_age_seconds",
                "How long the oldest journaled batch not yet in DuckDB has waited (0 when none waits).",
            ),
            CounterMetricFamily(
                "tally_journal_set_aside_batches",
                "Journal batches the database refused, set aside in <database>.journal/set-aside/ "
                "since the process started.",
            ),
            CounterMetricFamily(
                "tally_events_ingested",
                "Raw events appended to the log since the process started, by kind and outcome.",
                labels=["kind", "outcome"],
            ),
            GaugeMetricFamily(
                "tally_unroutable_events",
                "Processor events routed to no program (rc_unroutable) as of the last reconcile run.",
            ),
        ]

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> list[Metric]:
        families = self._families()
        st = self._state()
        if st is None:  # not started (or stopped): nothing to say
            return []
        backlog_rows, backlog_batches, backlog_age, set_aside, ingested, unroutable = families
        rows, batches, age = st.store.journal_backlog()
        backlog_rows.add_metric([], rows)
        backlog_batches.add_metric([], batches)
        backlog_age.add_metric([], age)
        set_aside.add_metric([], st.store.set_aside)
        for (kind, outcome), count in sorted(dict(st.store.ingested).items()):
            ingested.add_metric([str(kind), str(outcome)], count)
        if self._observer.unroutable is not None:
            unroutable.add_metric([], self._observer.unroutable)
        return list(families)


class _DerivedFiles(Collector):
    """`tally_derived_file_rejected_total`: derived files beside the database (the row store,
    mirror segments) the reconciler did not believe and set aside, counted by
    reconcile/run/derived.py in this process."""

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "tally_derived_file_rejected",
            "Derived files beside the database (the row store, column mirror segments) that failed "
            "their checks, set aside in <database>.rejected/ and rebuilt from the log, since the "
            "process started, by file.",
            labels=["file"],
        )

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        family = self._family()
        for kind, count in sorted(derived.rejected().items()):
            family.add_metric([kind], count)
        return [family]


class _RequestStats(Collector):
    """`tally_http_requests_total` and `tally_http_request_duration_seconds`, kept in plain dicts.
    Requests are observed on the event loop and `/metrics` is collected there too (its endpoint
    runs on the loop), so no lock is needed: a request costs two dict updates and a bisect, where
    prometheus_client's Counter and Histogram take a lock per value (about 5 µs a request)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, int], int] = {}
        # (method, route) -> per-bucket counts (the last one +Inf), then the sum of durations
        self.latency: dict[tuple[str, str], list[float]] = {}

    def observe(self, method: str, route: str, status: int, elapsed: float) -> None:
        key = (method, route, status)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        hist = self.latency.get((method, route))
        if hist is None:
            hist = self.latency[(method, route)] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        hist[bisect_left(LATENCY_BUCKETS, elapsed)] += 1
        hist[-1] += elapsed

    def _families(self) -> tuple[CounterMetricFamily, HistogramMetricFamily]:
        return (
            CounterMetricFamily(
                "tally_http_requests",
                "HTTP requests answered, by method, route template and status.",
                labels=["method", "route", "status"],
            ),
            HistogramMetricFamily(
                "tally_http_request_duration_seconds",
                "Time from receiving a request to sending the last byte of its answer.",
                labels=["method", "route"],
            ),
        )

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> list[Metric]:
        requests, latency = self._families()
        for (method, route, status), count in sorted(self.counts.items()):
            requests.add_metric([method, route, str(status)], count)
        for (method, route), hist in sorted(self.latency.items()):
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip((*map(str, LATENCY_BUCKETS), "+Inf"), hist[:-1], strict=True):
                cumulative += in_bucket
                buckets.append((bound, cumulative))
            latency.add_metric([method, route], buckets, hist[-1])
        return [requests, latency]


def tally_version() -> str:
    """The installed tally's version (`tally --version`), or `unknown` when not installed."""
    try:
        return metadata.version("tally")
    except metadata.PackageNotFoundError:
        return "unknown"


def engine_version(store: Store) -> str:
    """The database engine's version (`1.4.1` for DuckDB, `17.6` for a PostgreSQL server), from
    `SELECT version()`, which both speak; `unknown` when it cannot be read."""
    try:
        with store.reader() as db:
            row = db.one("SELECT version()")
    except Exception:  # a label is not worth failing a start for
        return "unknown"
    found = re.search(r"\d+(?:\.\d+)+", str(row[0])) if row else None
    return found.group(0) if found else "unknown"


class Observer:
    """One app's metrics registry and its request, commit and reconcile instruments."""

    def __init__(self, state: Callable[[], State | None]) -> None:
        # `_created` samples (when each series began) are noise beside the process start time;
        # prometheus_client reads this switch when it collects, for every registry.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        ProcessCollector(registry=reg)  # process_*: CPU seconds, memory, open fds, start time
        self.build = Info(
            "tally_build",
            "The running tally: its version, the database backend and engine version.",
            registry=reg,
        )
        self.http = _RequestStats()
        reg.register(self.http)
        self.commit_size = Histogram(
            "tally_group_commit_operations",
            "Operations committed together by the writer in one group commit.",
            buckets=COMMIT_SIZE_BUCKETS,
            registry=reg,
        )
        self.commit_wait = Histogram(
            "tally_group_commit_wait_seconds",
            "Per group commit: from the oldest operation's hand-over to the writer until the group "
            "is durable.",
            buckets=COMMIT_WAIT_BUCKETS,
            registry=reg,
        )
        self.reconcile_duration = Histogram(
            "tally_reconcile_duration_seconds",
            "Duration of successful reconcile runs, by mode.",
            ["mode"],
            buckets=RECONCILE_BUCKETS,
            registry=reg,
        )
        self.reconcile_failures = Counter(
            "tally_reconcile_failures", "Reconcile runs that failed (previous results kept).", registry=reg
        )
        self.reconcile_last_success = Gauge(
            "tally_reconcile_last_success_timestamp_seconds",
            "Unix time at which the last successful reconcile run finished.",
            registry=reg,
        )
        self.reconcile_last_mode = Gauge(
            "tally_reconcile_last_mode",
            "1 for the mode of the last successful reconcile run, 0 for the other.",
            ["mode"],
            registry=reg,
        )
        self.reconcile_last_rows = Gauge(
            "tally_reconcile_last_rows",
            "Rows of the last successful reconcile run: events read, sales and commissions materialised.",
            ["kind"],
            registry=reg,
        )
        self.unroutable: int | None = None
        reg.register(_StoreCollector(state, self))
        reg.register(_DerivedFiles())

    def started(self, backend: str, engine: str) -> None:
        """Label `tally_build_info` once the store is open: `backend` duckdb or postgresql."""
        self.build.info({"version": tally_version(), "backend": backend, "engine_version": engine})

    # -- requests: both lanes ----------------------------------------------------------------------
    def request(self, method: str, route: str, status: int, started: float, request_id: str | None) -> None:
        """Count one answered request and write its access line (when INFO is on)."""
        elapsed = time.perf_counter() - started
        self.http.observe(method if method in METHODS else "other", route, status, elapsed)
        if access_log.isEnabledFor(logging.INFO):
            ms = round(elapsed * 1000, 3)
            if _access_sink:  # tally serve's writer: one tuple here, the line in its thread
                _access_sink[0].append((time.time(), method, route, status, ms, request_id))
                return
            # otherwise (the app embedded without configure_logging) an ordinary record:
            # makeRecord + handle, what `info` does without walking the stack for the caller
            record = access_log.makeRecord(
                "tally.access",
                logging.INFO,
                __file__,
                0,
                "%s %s %d %.2fms request_id=%s",
                (method, route, status, ms, request_id),
                None,
                extra={
                    "method": method,
                    "route": route,
                    "status": status,
                    "duration_ms": ms,
                    "request_id": request_id,
                },
            )
            access_log.handle(record)

    # -- the writer ----------------------------------------------------------------------------------
    def commit(self, operations: int, waited: float) -> None:
        self.commit_size.observe(operations)
        self.commit_wait.observe(waited)

    # -- the reconciler ------------------------------------------------------------------------------
    def reconciled(self, summary: RunSummary, seconds: float, *, unroutable: bool = True) -> None:
        """A finished run in the metrics; `unroutable`: its count of unroutable events is the
        log's (a partition other than the first holds none of them)."""
        self.reconcile_duration.labels(summary.mode).observe(seconds)
        self.reconcile_last_success.set(time.time())
        for mode in RECONCILE_MODES:
            self.reconcile_last_mode.labels(mode).set(1 if mode == summary.mode else 0)
        self.reconcile_last_rows.labels("events_read").set(summary.events_read)
        self.reconcile_last_rows.labels("sales").set(summary.sales)
        self.reconcile_last_rows.labels("commissions").set(summary.commissions)
        if unroutable:
            self.unroutable = summary.unroutable

    def reconcile_failed(self) -> None:
        self.reconcile_failures.inc()


def route_template(scope: Scope) -> str:
    """The matched route's path template (`/api/v1/programs/{program_id}`), or `unmatched`."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class ObserveMiddleware:
    """The full stack's access line and request metrics (the fast lane does its own)."""

    def __init__(self, app: ASGIApp, observer: Observer) -> None:
        self.app = app
        self.observer = observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = DISCONNECTED

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            state = scope.get("state") or {}
            self.observer.request(
                scope["method"], route_template(scope), status, started, state.get("request_id")
            )
