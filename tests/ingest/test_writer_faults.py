"""Seeded fault injection into the embedded backend's group commit: at each step (the read-ahead,
a claim, the journal append, the copy into DuckDB, the key index's flush) an exception, or a
kill, while concurrent track sales (new ones and re-posts) go through the real writer; then a
restart on the same files. Every acknowledged sale is in the log exactly once, every refused one
is absent, a re-post is refused after the restart, and the store starts every time.

A kill is an injected `Killed` in the thread that reaches the step (the thread ends on it),
after which every thread dies at its next step and the test abandons the store: the writer and
copier stop where they are, and the key index, journal and DuckDB file are closed without a
flush or a copy, as a killed process leaves them. Calls still waiting then had no answer: each
may be in the log, at most once. The read-ahead's exception comes from its own statement, half
way through it. `TALLY_FAULT_SEED` replays another seed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest

from ingest import tracking
from ingest import writer as writer_module
from ingest.domain.errors import DatabaseUnavailable, DuplicateTransaction, TallyError
from ingest.domain.inputs import SaleIn
from ingest.domain.records import Program, ProgramSettings
from ingest.storage.duckdb import keys as hotkeys
from ingest.storage.duckdb.copier import Copier
from ingest.storage.duckdb.journal import Journal
from ingest.storage.duckdb.keys import KeyIndex
from ingest.storage.duckdb.store import DuckStore
from ingest.writer import _STOP, Writer
from tests.helpers import sql_rows

SEED = int(os.environ.get("TALLY_FAULT_SEED", "2"))
AT = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
PROGRAM = Program("prog_f", "ws_f", "Faults", ProgramSettings(), AT, AT)
WAVES, WIDTH = 10, 8  # waves of concurrent calls, so groups of several form
MORE_WAVES = 200  # at most this many more, until the fault has fired (a copy or flush comes later)

# step -> (where it is: class, method), the exceptions it may raise there (as a fault gives)
STEPS: dict[str, tuple[type, str, tuple[Callable[[], Exception], ...]]] = {
    "prefetch": (KeyIndex, "prefetch", (lambda: sqlite3.OperationalError("disk I/O error"), RuntimeError)),
    "claim": (KeyIndex, "claim", (lambda: sqlite3.OperationalError("disk I/O error"), RuntimeError)),
    "journal": (Journal, "append", (lambda: OSError(28, "No space left on device"), RuntimeError)),
    "copy": (Copier, "_copy_in_transaction", (lambda: duckdb.IOException("I/O error"), OSError)),
    "index flush": (KeyIndex, "_flush", (lambda: sqlite3.OperationalError("disk I/O error"), RuntimeError)),
}


class _FailingReads:
    """A key index's writer connection whose read-ahead statements raise `error`."""

    def __init__(self, con: sqlite3.Connection, error: Exception) -> None:
        self._con, self._error = con, error

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if any(part in sql for part in hotkeys._PREFETCH.values()):  # (one statement, of parts)
            raise self._error
        return self._con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


class Killed(BaseException):
    """What ends a thread of a killed store (no `except Exception` stops it)."""


class Faults:
    """The injected fault: at the `nth` arrival at `step` (before it runs, or for a kill also
    just after), once, while armed."""

    def __init__(self, step: str, action: str, rng: random.Random) -> None:
        self.step, self.action = step, action
        self.nth = rng.randint(1, 3)
        self.after = action == "kill" and rng.random() < 0.5
        self.error = rng.choice(STEPS[step][2])
        self.armed = False
        self.arrivals = 0
        self.fired = threading.Event()
        self.dead = threading.Event()  # killed: every thread dies at its next step
        self._lock = threading.Lock()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, (owner, method, _) in STEPS.items():
            monkeypatch.setattr(owner, method, self._hook(name, getattr(owner, method)))

    def _hook(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            if self.dead.is_set():
                raise Killed  # this thread dies with the process
            with self._lock:
                fire = self.armed and name == self.step and not self.fired.is_set()
                if fire:
                    self.arrivals += 1
                    fire = self.arrivals == self.nth
                    if fire:
                        self.fired.set()
            if fire and name == "prefetch" and self.action == "exception":
                return self._failing_read(real, *args, **kwargs)
            if fire and not self.after:
                self._fire()
            result = real(*args, **kwargs)
            if fire:
                self._fire()
            return result

        return hooked

    def _failing_read(self, real: Callable[..., Any], index: KeyIndex, *args: Any) -> Any:
        """The read-ahead itself fails: its statement raises, half-way through the method."""
        live = index._w
        index._w = _FailingReads(live, self.error())  # type: ignore[assignment]
        try:
            return real(index, *args)
        finally:
            index._w = live

    def _fire(self) -> None:
        if self.action == "kill":
            self.dead.set()
            raise Killed
        raise self.error()


@dataclass
class Ledger:
    """What each call was answered, by transaction id."""

    acked: set[str] = field(default_factory=set)  # 200: recorded now
    duplicate: set[str] = field(default_factory=set)  # 409: recorded before
    refused: set[str] = field(default_factory=set)  # any other refusal: nothing stored
    unanswered: set[str] = field(default_factory=set)  # killed while waiting

    def sent(self) -> set[str]:
        return self.acked | self.duplicate | self.refused | self.unanswered


def _call(txn: str) -> tracking.Call:
    body = f'{{"transaction_id": "{txn}", "customer_external_id": "c", "amount": 100}}'
    return tracking.Call("track/sale", AT, body, "{}", None)


async def _sale(store: DuckStore, writer: Writer, txn: str) -> None:
    inp = SaleIn.model_validate({"transaction_id": txn, "customer_external_id": "c", "amount": 100})
    await tracking.record_sale(store, writer, _call(txn), inp, PROGRAM)


async def _traffic(
    store: DuckStore, writer: Writer, faults: Faults, rng: random.Random, ledger: Ledger
) -> None:
    """Waves of concurrent sales, new ones and re-posts of any sent before; stops when killed."""
    fresh = iter(f"in_{n}" for n in range(100_000))
    for n in range(WAVES + MORE_WAVES):
        if faults.dead.is_set() or (n >= WAVES and faults.fired.is_set()):
            return
        faults.armed = n > 0  # the first wave is acknowledged before anything fails
        recorded = sorted(ledger.acked | ledger.duplicate)  # re-posts: mostly of recorded sales
        sent = sorted(ledger.sent())
        wave = [
            rng.choice(recorded if recorded and rng.random() < 0.8 else sent)
            if sent and rng.random() < 0.5
            else next(fresh)
            for _ in range(WIDTH)
        ]
        tasks = {asyncio.ensure_future(_sale(store, writer, txn)): txn for txn in wave}
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.05)
            if pending and faults.dead.is_set() and not writer_alive(writer):
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
        for task, txn in tasks.items():
            if task.cancelled():
                ledger.unanswered.add(txn)
            elif (error := task.exception()) is None:
                ledger.acked.add(txn)
            elif isinstance(error, DuplicateTransaction):
                ledger.duplicate.add(txn)
            else:
                assert isinstance(error, (TallyError, RuntimeError, OSError, sqlite3.Error)), error
                ledger.refused.add(txn)


def writer_alive(writer: Writer) -> bool:
    return writer._thread.is_alive()


def _abandon(store: DuckStore, writer: Writer) -> None:
    """What a kill leaves: the threads stop where they are (each dies at its next step), and
    the files are closed as they are: no copy, no key index flush, no checkpoint of anything
    uncommitted."""
    writer._running = False
    writer._stopping.set()
    writer._queue.put(_STOP)
    writer._thread.join(30)
    writer._copier.join(30)
    assert not writer._thread.is_alive() and not writer._copier.is_alive()
    keys = store.keys
    keys._close_readers()
    if keys._checkpointer is not None:
        keys._checkpointer.close()
    keys._w.close()  # the sealed writes not in the file are lost, as in a crash
    if store._journal is not None:
        store._journal.close()
    store._con.close()  # committed transactions stand; one under way is not committed
    store._unclaim()


def _accepted(store: DuckStore) -> dict[str, int]:
    rows = sql_rows(
        store,
        "SELECT transaction_id, count(*) FROM raw_events"
        " WHERE kind = 'sale' AND outcome = 'accepted' GROUP BY 1",
    )
    return {str(txn): int(n) for txn, n in rows}


@pytest.mark.parametrize("action", ["exception", "kill"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_fault_at_any_step_of_a_group_commit_keeps_every_acknowledged_sale_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, action: str
) -> None:
    rng = random.Random(f"{SEED}:{step}:{action}")
    faults = Faults(step, action, rng)
    faults.install(monkeypatch)
    previous = threading.excepthook

    def excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not Killed:
            previous(args)

    monkeypatch.setattr(threading, "excepthook", excepthook)
    monkeypatch.setattr(writer_module, "COPY_EVERY_SECONDS", 0.05)  # copies and flushes come
    monkeypatch.setattr(hotkeys, "FLUSH_SECONDS", 0.02)  # often enough for a short run
    db = tmp_path / "f.duckdb"
    ledger = Ledger()
    store = DuckStore(db)
    writer = Writer(store)
    writer.start()
    try:
        asyncio.run(_traffic(store, writer, faults, rng, ledger))
    finally:
        faults.armed = False
        if faults.dead.is_set():
            _abandon(store, writer)
        else:
            writer.stop()
            with contextlib.suppress(DatabaseUnavailable):
                store.close()
    assert faults.fired.is_set(), f"the fault at {step} never fired (nth={faults.nth})"
    assert ledger.acked, "nothing was acknowledged"
    faults.dead.clear()

    restarted = DuckStore(db)  # start-up never fails
    try:
        assert restarted.set_aside == 0 and restarted.readiness() is None
        accepted = _accepted(restarted)
        assert {txn: n for txn, n in accepted.items() if n > 1} == {}  # nothing twice
        assert sorted(ledger.acked - set(accepted)) == []  # every acknowledged sale kept
        assert sorted(ledger.duplicate - set(accepted)) == []  # a 409 named a sale that is there
        refused_only = ledger.refused - ledger.acked - ledger.duplicate - ledger.unanswered
        assert sorted(refused_only & set(accepted)) == []  # every refused call absent
        assert set(accepted) <= ledger.sent()
        claims = sql_rows(restarted, "SELECT key, count(*) FROM idempotency_keys GROUP BY 1")
        assert {str(k): int(n) for k, n in claims} == {f"sale:{txn}": 1 for txn in accepted}
        writer = Writer(restarted)
        writer.start()
        try:  # the key index agrees with the log: every recorded sale is a duplicate now
            again = Ledger()

            async def repost() -> None:
                for txn in sorted(accepted):
                    try:
                        await _sale(restarted, writer, txn)
                        again.acked.add(txn)
                    except DuplicateTransaction:
                        again.duplicate.add(txn)

            asyncio.run(repost())
            assert again.acked == set() and again.duplicate == set(accepted)
        finally:
            writer.stop()
    finally:
        restarted.close()
