"""The embedded backend's key index: what ingest decides on the hot path, on disk.

Duplicate sales, refunds and processor events, refund ceilings, idempotency claims, clicks and
customer bindings are answered by keyed tables (primary keys, point lookups) in an SQLite file
beside the DuckDB file, `<database>.keys`, not by a copy of the log in memory: memory stays
bounded by the page cache (`TALLY_KEY_CACHE_MB`) and start-up does not replay the log.

Why SQLite and not DuckDB's own indexes: DuckDB is built for scans, and on the 2-core machine a
statement costs about 0.25 ms before it does anything (a point lookup on a 10M-row key 0.4 to
1.4 ms); the hot path makes several lookups per request at thousands of requests per second.
An SQLite B-tree lookup costs microseconds.

The index is derived from the raw log and records the last sequence number it holds
(`last_seq`, with that row's received time as an anchor), in the same SQLite transaction as
the keys. The writer commits it after the batch is durable (journal or DuckDB), so after a
crash it may lag the log but never lead it: `catch_up` replays the rows after `last_seq`. An
index that leads the log, or whose anchor row differs (a database restored from a backup
beside a newer index), is rebuilt from the whole log (`tally migrate` does that offline, with
progress).

One connection writes (the writer thread, inside `begin`..`commit`/`rollback`, with a
savepoint per operation); other threads read through their own connections and see what was
committed (WAL mode).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ingest.records import Binding, SaleLedger

log = logging.getLogger("tally.store")

FORMAT = "2"  # bump when the tables below change: an index of another format is rebuilt
# 2: claims are derived from the log when catching up or rebuilding (`claims_of`), as ingest made
# them, so a claim alone decides a duplicate (an index rebuilt by format 1 had none)
BUILD_CACHE_MB = 512  # page cache while rebuilding from the whole log (not while serving)

_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS clicks (program_id TEXT NOT NULL, click_id TEXT NOT NULL,"
    " partner_code TEXT NOT NULL, PRIMARY KEY (program_id, click_id)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS bindings (program_id TEXT NOT NULL, customer TEXT NOT NULL,"
    " lead_event_id TEXT NOT NULL, click_id TEXT, partner_code TEXT,"
    " PRIMARY KEY (program_id, customer)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS provisional (program_id TEXT NOT NULL, customer TEXT NOT NULL,"
    " click_id TEXT, PRIMARY KEY (program_id, customer)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS ledgers (id INTEGER PRIMARY KEY, amount INTEGER, currency TEXT,"
    " refunded INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sale_keys (program_id TEXT NOT NULL, key TEXT NOT NULL,"
    " ledger INTEGER NOT NULL, PRIMARY KEY (program_id, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS refunds (program_id TEXT NOT NULL, refund_id TEXT NOT NULL,"
    " PRIMARY KEY (program_id, refund_id)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS events (event_id TEXT PRIMARY KEY) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS claims (program_id TEXT NOT NULL, key TEXT NOT NULL,"
    " PRIMARY KEY (program_id, key)) WITHOUT ROWID",
)

# The raw-log columns `observe` reads (what catch-up and rebuilds select).
OBSERVED = (
    "seq",
    "received_at",
    "kind",
    "program_id",
    "outcome",
    "event_id",
    "event_type",
    "test_mode",
    "transaction_id",
    "invoice_id",
    "payment_intent_id",
    "checkout_session_id",
    "charge_id",
    "customer_key",
    "click_id",
    "partner_code",
    "amount",
    "currency",
    "refund_id",
    "lead_status",
)

PROCESSOR_SALE_TYPES = frozenset(
    {
        "checkout.session.completed",
        "checkout.session.async_payment_succeeded",
        "invoice.payment_succeeded",
        "invoice.paid",
    }
)

PROCESSOR_ID_FIELDS = ("invoice_id", "payment_intent_id", "checkout_session_id", "charge_id")


def processor_sale_keys(fields: Mapping[str, object]) -> list[str]:
    """The ids a live processor sale is known by: none for other events, test events or zero
    amounts. A self-hosted sale with any of these transaction ids is the same sale."""
    amount = fields.get("amount")
    if fields.get("test_mode") or fields.get("event_type") not in PROCESSOR_SALE_TYPES:
        return []
    if not isinstance(amount, int) or amount <= 0:
        return []
    return list(dict.fromkeys(v for name in PROCESSOR_ID_FIELDS if isinstance(v := fields.get(name), str)))


EVENT_KEY_SPACE = "*"  # program id under which processor event ids are claimed


def claims_of(row: Mapping[str, object]) -> list[tuple[str, str]]:
    """The (program, key) claims ingest made when it accepted `row` (ingest/tracking.py,
    ingest/deliveries.py): what a rebuilt index must hold for a claim alone to refuse a
    duplicate."""
    outcome, kind, program = row.get("outcome"), row.get("kind"), row.get("program_id")
    if kind == "stripe" and outcome in ("accepted", "unroutable"):
        event_id = row.get("event_id")
        claims = [(EVENT_KEY_SPACE, event_id)] if isinstance(event_id, str) else []
        if outcome == "accepted" and isinstance(program, str):
            claims += [(program, key) for key in processor_sale_keys(row)]
        return claims
    if outcome != "accepted" or not isinstance(program, str):
        return []
    if kind == "sale" and not row.get("test_mode") and isinstance(txn := row.get("transaction_id"), str):
        return [(program, txn)]
    if kind == "refund" and isinstance(refund := row.get("refund_id"), str):
        return [(program, f"refund:{refund}")]
    return []


def anchor_of(received_at: object) -> str:
    """How the index recognises the raw row it last applied (its received time, exactly)."""
    if isinstance(received_at, datetime):
        return received_at.astimezone(UTC).isoformat()
    return str(received_at)


Progress = Callable[[int, int], None]


class KeyIndex:
    """The key index of one DuckDB file (see the module docstring)."""

    def __init__(self, path: Path | None, cache_mb: int = 64) -> None:
        self._scratch: str | None = None
        if path is None:  # an in-memory database: the index lives in a scratch directory
            self._scratch = tempfile.mkdtemp(prefix="tally-keys-")
            path = Path(self._scratch) / "keys.sqlite"
        self.path = path
        self._cache_kib = cache_mb * 1024
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._tx_thread: int | None = None
        self._savepoints = 0
        self._w = self._open_writer()
        for ddl in _DDL:
            self._w.execute(ddl)
        self._checkpointer: sqlite3.Connection | None = None

    def _open_writer(self) -> sqlite3.Connection:
        con = self._connect()
        con.execute("PRAGMA journal_mode=WAL")
        # No checkpoint inside the writer's commits (it would fsync on the hot path): the
        # copier thread checkpoints (`checkpoint`), as it copies the journal into DuckDB.
        con.execute("PRAGMA wal_autocheckpoint=0")
        return con

    def checkpoint(self) -> None:
        """Move committed pages from the WAL into the index file, without blocking the writer
        (a passive checkpoint); called from the copier thread."""
        if self._checkpointer is None:
            self._checkpointer = self._connect()
        self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute(f"PRAGMA cache_size=-{self._cache_kib}")
        con.execute("PRAGMA busy_timeout=10000")
        return con

    # -- connections -----------------------------------------------------------------------
    def _con(self) -> sqlite3.Connection:
        """The writer's connection on the thread inside a transaction; elsewhere this thread's
        reader, which sees what was committed."""
        if self._tx_thread == threading.get_ident():
            return self._w
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is None:
            con = self._connect()
            con.execute("PRAGMA query_only=1")
            self._local.con = con
            with self._readers_lock:
                self._readers.append(con)
        return con

    def _close_readers(self) -> None:
        with self._readers_lock:
            for con in self._readers:
                con.close()
            self._readers.clear()
            self._local = threading.local()

    def close(self) -> None:
        self._close_readers()
        if self._checkpointer is not None:
            self._checkpointer.close()
        self._w.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    # -- the position in the log -----------------------------------------------------------
    def _meta(self, name: str) -> str | None:
        row = self._con().execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return str(row[0]) if row else None

    def position(self) -> tuple[int, str, str | None]:
        """The last raw sequence number applied, its row's anchor, and the index's format."""
        seq = self._meta("last_seq")
        return int(seq) if seq else 0, self._meta("anchor") or "", self._meta("format")

    def rebuild(
        self, rows: Iterable[Mapping[str, Any]], total: int = 0, on_progress: Progress | None = None
    ) -> int:
        """Replace the index with one built from `rows` (the whole raw log, in order). Built in
        a file of its own without a journal and with a large cache (a rebuild of 10M rows is
        I/O-bound otherwise), then renamed over the index in one step: a crash half-way leaves
        the old index (or none), never a torn one. Returns the rows applied."""
        build = self.path.with_name(self.path.name + ".build")
        build.unlink(missing_ok=True)
        con = sqlite3.connect(build, isolation_level=None, check_same_thread=False)
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute(f"PRAGMA cache_size=-{BUILD_CACHE_MB * 1024}")
        con.execute("PRAGMA locking_mode=EXCLUSIVE")
        for ddl in _DDL:
            con.execute(ddl)
        live, self._w = self._w, con
        try:
            self.begin()
            self._set_position(0, "")
            self.commit(None, "")
            applied = self.apply(rows, total, on_progress, commit_every=1_000_000)
        except BaseException:
            self._w = live
            con.close()
            build.unlink(missing_ok=True)
            raise
        self._w = live
        con.close()
        fd = os.open(build, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._close_readers()
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        self._w.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        os.replace(build, self.path)
        self._w = self._open_writer()
        return applied

    def _set_position(self, seq: int, anchor: str) -> None:
        self._w.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            (("last_seq", str(seq)), ("anchor", anchor), ("format", FORMAT)),
        )

    # -- transactions (writer thread) --------------------------------------------------------
    def begin(self) -> None:
        if self._w.in_transaction:  # a transaction left open by a failure: nothing of it counts
            log.warning("the key index had a transaction left open; rolling it back")
            self._w.execute("ROLLBACK")
        self._w.execute("BEGIN")
        self._tx_thread = threading.get_ident()
        self._savepoints = 0

    @property
    def in_transaction(self) -> bool:
        return self._tx_thread is not None

    def mark(self) -> int:
        self._savepoints += 1
        self._w.execute(f"SAVEPOINT op{self._savepoints}")
        return self._savepoints

    def release(self, mark: int) -> None:
        """Drop what was written since `mark`."""
        self._w.execute(f"ROLLBACK TO op{mark}")

    def commit(self, last_seq: int | None, anchor: str) -> None:
        """Commit, recording `last_seq` (the newest raw row the transaction applied) if any."""
        try:
            if last_seq is not None:
                self._set_position(last_seq, anchor)
            self._w.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        self._tx_thread = None

    def rollback(self) -> None:
        self._tx_thread = None
        with contextlib.suppress(sqlite3.Error):
            self._w.execute("ROLLBACK")

    # -- lookups -------------------------------------------------------------------------------
    def _one(self, sql: str, *params: object) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._con().execute(sql, params).fetchone()
        return row

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        sql = "SELECT partner_code FROM clicks WHERE program_id = ? AND click_id = ?"
        row = self._one(sql, program_id, click_id)
        return str(row[0]) if row else None

    def binding(self, program_id: str, customer: str) -> Binding | None:
        sql = "SELECT lead_event_id, click_id, partner_code FROM bindings"
        sql += " WHERE program_id = ? AND customer = ?"
        row = self._one(sql, program_id, customer)
        return Binding(row[0], row[1], row[2]) if row else None

    def provisional_click(self, program_id: str, customer: str) -> tuple[bool, str | None]:
        sql = "SELECT click_id FROM provisional WHERE program_id = ? AND customer = ?"
        row = self._one(sql, program_id, customer)
        return (True, row[0]) if row else (False, None)

    def _ledger_id(self, program_id: str, keys: Iterable[str]) -> int | None:
        for key in keys:
            row = self._one("SELECT ledger FROM sale_keys WHERE program_id = ? AND key = ?", program_id, key)
            if row:
                return int(row[0])
        return None

    def sale(self, program_id: str, keys: Iterable[str]) -> SaleLedger | None:
        ledger = self._ledger_id(program_id, keys)
        sql = "SELECT amount, currency, refunded FROM ledgers WHERE id = ?"
        row = self._one(sql, ledger) if ledger is not None else None
        return SaleLedger(row[0], row[1], int(row[2])) if row else None

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        sql = "SELECT 1 FROM refunds WHERE program_id = ? AND refund_id = ?"
        return self._one(sql, program_id, refund_id) is not None

    def event_seen(self, event_id: str) -> bool:
        return self._one("SELECT 1 FROM events WHERE event_id = ?", event_id) is not None

    def claimed(self, program_id: str, key: str) -> bool:
        return self._one("SELECT 1 FROM claims WHERE program_id = ? AND key = ?", program_id, key) is not None

    def counts(self) -> dict[str, int]:
        """Rows per table (for tests and `tally migrate`)."""
        con = self._con()
        names = ("clicks", "bindings", "provisional", "ledgers", "sale_keys", "refunds", "events", "claims")
        return {n: int(con.execute(f"SELECT count(*) FROM {n}").fetchone()[0]) for n in names}

    # -- writes (writer thread, inside a transaction) -----------------------------------------
    def claim(self, program_id: str, key: str) -> bool:
        """Claim an idempotency key; True when this write claimed it (False: already taken)."""
        cur = self._w.execute("INSERT OR IGNORE INTO claims VALUES (?, ?)", (program_id, key))
        return cur.rowcount == 1

    def observe(self, row: Mapping[str, object]) -> None:
        """Apply one accepted raw-log row: one code path for live ingest and for catching up."""
        if row.get("outcome") in ("duplicate", "unusable"):
            return
        kind = row["kind"]
        program_id = row.get("program_id")
        w = self._w
        if kind == "stripe":
            event_id = row.get("event_id")
            if isinstance(event_id, str):
                w.execute("INSERT OR IGNORE INTO events VALUES (?)", (event_id,))
        if not isinstance(program_id, str):
            return
        if kind == "click":
            w.execute(
                "INSERT OR REPLACE INTO clicks VALUES (?, ?, ?)",
                (program_id, str(row["click_id"]), str(row["partner_code"])),
            )
        elif kind == "lead":
            self._observe_lead(program_id, row)
        elif kind == "sale" and not row.get("test_mode"):
            self._observe_sale(program_id, row, [row.get("transaction_id")])
        elif kind == "refund":
            refund_id = str(row["refund_id"])
            w.execute("INSERT OR IGNORE INTO refunds VALUES (?, ?)", (program_id, refund_id))
            ledger = self._ledger_id(program_id, [str(row.get("transaction_id"))])
            amount = row.get("amount")
            if ledger is not None and isinstance(amount, int):
                w.execute("UPDATE ledgers SET refunded = refunded + ? WHERE id = ?", (amount, ledger))
        elif kind == "stripe" and not row.get("test_mode"):
            self._observe_processor(program_id, row)

    def _observe_lead(self, program_id: str, row: Mapping[str, object]) -> None:
        customer = str(row["customer_key"])
        click_id = row.get("click_id")
        click = click_id if isinstance(click_id, str) else None
        w = self._w
        if row.get("lead_status") == "settled":
            if self.binding(program_id, customer) is None:
                partner = self.click_partner(program_id, click) if click else None
                w.execute(
                    "INSERT INTO bindings VALUES (?, ?, ?, ?, ?)",
                    (program_id, customer, str(row["event_id"]), click, partner),
                )
            w.execute("DELETE FROM provisional WHERE program_id = ? AND customer = ?", (program_id, customer))
        elif self.binding(program_id, customer) is None:
            w.execute("INSERT OR IGNORE INTO provisional VALUES (?, ?, ?)", (program_id, customer, click))

    def _observe_sale(self, program_id: str, row: Mapping[str, object], ids: list[object]) -> None:
        keys = [k for k in ids if isinstance(k, str) and k]
        if not keys:
            return
        ledger = self._ledger_id(program_id, keys)
        if ledger is None:
            amount, currency = row.get("amount"), row.get("currency")
            values = (
                amount if isinstance(amount, int) else None,
                currency if isinstance(currency, str) else None,
            )
            cur = self._w.execute("INSERT INTO ledgers (amount, currency, refunded) VALUES (?, ?, 0)", values)
            ledger = cur.lastrowid
        self._w.executemany(
            "INSERT OR IGNORE INTO sale_keys VALUES (?, ?, ?)", [(program_id, key, ledger) for key in keys]
        )

    def _observe_processor(self, program_id: str, row: Mapping[str, object]) -> None:
        keys = processor_sale_keys(row)
        if keys:
            self._observe_sale(program_id, row, list(keys))
        elif row.get("event_type") == "charge.refunded" and isinstance(amount := row.get("amount"), int):
            ids = [row.get(name) for name in (*PROCESSOR_ID_FIELDS, "transaction_id")]
            ledger = self._ledger_id(program_id, [k for k in ids if isinstance(k, str)])
            if ledger is not None:
                sql = "UPDATE ledgers SET refunded = max(refunded, ?) WHERE id = ?"
                self._w.execute(sql, (amount, ledger))

    # -- catching up with the log ----------------------------------------------------------------
    def apply(
        self,
        rows: Iterable[Mapping[str, Any]],
        total: int = 0,
        on_progress: Progress | None = None,
        commit_every: int = 200_000,
    ) -> int:
        """Apply raw-log rows (in `seq` order, after `position()`), committing every
        `commit_every` rows with the position, so an interrupted rebuild resumes where it
        stopped. Returns how many rows were applied."""
        done = 0
        last: Mapping[str, Any] | None = None
        self.begin()
        try:
            for row in rows:
                self.observe(row)
                for program_id, key in claims_of(row):
                    self.claim(program_id, key)
                last = row
                done += 1
                if done % commit_every == 0:
                    self.commit(int(row["seq"]), anchor_of(row["received_at"]))
                    if on_progress:
                        on_progress(done, total)
                    self.begin()
            self.commit(int(last["seq"]) if last else None, anchor_of(last["received_at"]) if last else "")
        except BaseException:
            self.rollback()
            raise
        if on_progress:
            on_progress(done, total)
        return done
