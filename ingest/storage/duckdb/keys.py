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
the keys. The writer commits a group's keys after the group is durable (journal or DuckDB),
and they reach the file at most `FLUSH_SECONDS` later (`KeyIndex` says how), so after a crash
the file may lag the log but never lead it: start-up replays the rows after `last_seq`. An
index that leads the log, or whose anchor row differs (a database restored from a backup
beside a newer index), is rebuilt from the whole log (`tally migrate` does that offline, with
progress).

One connection writes (the writer thread); other threads read through their own connections
(WAL mode), after the committed writes not yet in the file.

What a row changes is the rule of ingest/domain/keys.py (`effects`); `KeyIndex._apply` is how
this index applies each effect.

Why one module of about 700 lines: `KeyIndex` is one state machine (a transaction's buffer, the
sealed writes, the rows read, the file and its position) whose lookups, writes, flushes and
catch-up each read and change all of it; split across modules, each part would reach into the
others' fields.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ingest.domain import keys as rule
from ingest.domain.keys import claims_of, effects
from ingest.domain.records import Binding, SaleLedger
from ingest.progress import RowsApplied
from ingest.storage.contract import Needs, gather
from ingest.storage.durable import fsync_path

log = logging.getLogger("tally.store")

FORMAT = "4"  # bump when the tables below change: an index of another format is rebuilt
# 2: claims are derived from the log when catching up or rebuilding (`claims_of`), as ingest made
# them, so a claim alone decides a duplicate (an index rebuilt by format 1 had none)
# 3: `invoice_payment.paid` links an invoice and its payment to one ledger, and a processor
# refund of a sale not known yet keeps its amount under the charge's ids (`_observe_processor`)
# 4: claims are tagged with their kind (`sale:<id>`), so no sale id takes a refund's or a promo
# code's claim (an index of format 3 holds sale ids untagged)
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

# The raw-log columns `observe` and `claims_of` read (what catch-up and rebuilds select).
OBSERVED = (
    "seq",
    "received_at",
    "kind",
    "program_id",
    "outcome",
    "event_id",
    "event_type",
    "object_id",  # a promo-code assignment's processor id (claimed)
    "promo_code",  # a promo-code assignment's code (claimed)
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


def _either(value: object, other: object) -> object:
    return other if value is None else value


def anchor_of(received_at: object) -> str:
    """How the index recognises the raw row it last applied (its received time, exactly)."""
    if isinstance(received_at, datetime):
        return received_at.astimezone(UTC).isoformat()
    return str(received_at)


# The index's tables as the buffer and `prefetch` see them: name -> (table, key columns, value
# columns); a row is its value columns (none: the key's presence is the row).
_LOOKUPS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "clicks": ("clicks", ("program_id", "click_id"), ("partner_code",)),
    "bindings": ("bindings", ("program_id", "customer"), ("lead_event_id", "click_id", "partner_code")),
    "provisional": ("provisional", ("program_id", "customer"), ("click_id",)),
    "ledgers": ("ledgers", ("id",), ("amount", "currency", "refunded")),
    "sale_keys": ("sale_keys", ("program_id", "key"), ("ledger",)),
    "refunds": ("refunds", ("program_id", "refund_id"), ()),
    "events": ("events", ("event_id",), ()),
    "claims": ("claims", ("program_id", "key"), ()),
}

_SELECT = {
    name: f"SELECT 1, {', '.join(values) or '1'} FROM {table} WHERE {' AND '.join(f'{k} = ?' for k in keys)}"
    for name, (table, keys, values) in _LOOKUPS.items()
}
_REPLACE = {
    name: f"INSERT OR REPLACE INTO {table} ({', '.join(keys + values)})"
    f" VALUES ({', '.join('?' for _ in keys + values)})"
    for name, (table, keys, values) in _LOOKUPS.items()
}
_IGNORE = {name: sql.replace("OR REPLACE", "OR IGNORE") for name, sql in _REPLACE.items()}
_DELETE = {
    name: f"DELETE FROM {table} WHERE {' AND '.join(f'{k} = ?' for k in keys)}"
    for name, (table, keys, values) in _LOOKUPS.items()
}


_PREFETCH_WIDTH = 6  # the widest part's columns: a sale key's two, its ledger and the ledger's three


def _prefetch_sql(name: str) -> str:
    """Rows of table `name` for a JSON array of keys: the table's name, then its key columns and
    value columns (sale keys bring their ledger's values too), padded with NULLs to one width,
    so a group's tables are read in one statement (`UNION ALL` of these parts)."""
    table, keys, values = _LOOKUPS[name]
    on = " AND ".join(f"t.{c} = j.value ->> {i}" for i, c in enumerate(keys))
    if name == "sale_keys":
        return (
            "SELECT 'sale_keys', t.program_id, t.key, t.ledger, l.amount, l.currency, l.refunded"
            f" FROM json_each(?) AS j CROSS JOIN sale_keys AS t ON {on}"
            " LEFT JOIN ledgers AS l ON l.id = t.ledger"
        )
    picked = ", ".join([f"'{name}'", *(f"t.{c}" for c in keys + values)])
    padding = ", NULL" * (_PREFETCH_WIDTH - len(keys) - len(values))
    return f"SELECT {picked}{padding} FROM json_each(?) AS j CROSS JOIN {table} AS t ON {on}"


_PREFETCH = {name: _prefetch_sql(name) for name in _LOOKUPS}
Key = tuple[Any, ...]
Row = tuple[Any, ...]
_MISSING: Any = object()  # not in the buffer (or not looked up yet)
_GONE: Any = object()  # deleted in the buffer (provisional leads that settled)
# Committed writes wait in memory until this many rows or this long (or until the writer stops),
# then go to SQLite in one transaction: a crash loses only what the log replays at start. Small
# enough that a flush holds the writer a few milliseconds (at 1 s, p99 went from 15 to 50 ms).
FLUSH_ROWS = 2_000
FLUSH_SECONDS = 0.1
SEEN_ROWS = 20_000  # rows read from SQLite kept for later transactions (cleared at each flush too)


class KeyIndex:
    """The key index of one DuckDB file (see the module docstring).

    Writes are not sent to SQLite a statement at a time. Inside a transaction (the writer
    thread, `begin` .. `commit`/`rollback`) they wait in a buffer (per table, key -> row; an undo
    list gives each operation its own `mark`/`release`). `commit` seals the buffer: its rows join
    the committed writes not yet in SQLite, which every thread's lookups see, and which go to
    SQLite with one statement per table every `FLUSH_ROWS` rows or `FLUSH_SECONDS` (and at
    `close`), with the position of the last raw row they hold. Lookups read the transaction's
    buffer, then the sealed writes, then what was read from SQLite before (`prefetch` reads a
    whole group's keys with one statement per table), then SQLite.

    This is what the embedded backend's single writer allows (the lock file admits one store per
    database): its buffers plus the index file are the whole truth. A crash loses the sealed
    writes and nothing else: the index file's position is older, and start-up replays the raw
    rows after it (as after any crash between the journal and the index). Why: on this machine a
    statement costs little inside SQLite but hands the interpreter lock to the event loop and
    waits to get it back; one track call took eight, and each commit wrote its pages to the WAL.
    """

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
        self._buffer: dict[str, dict[Key, Any]] = {name: {} for name in _LOOKUPS}  # this tx's
        self._undo: list[tuple[dict[Key, Any], Key, Any]] = []
        self._undo_base = 0  # marks below this were committed and can no longer be released
        self._sealed: dict[str, dict[Key, Any]] = {name: {} for name in _LOOKUPS}  # committed
        self._sealed_rows = 0
        self._sealed_at: tuple[int, str] | None = None  # (last_seq, anchor) the sealed rows reach
        self._flushed_at = time.monotonic()
        self._seen: dict[str, dict[Key, Any]] = {name: {} for name in _LOOKUPS}  # read from SQLite
        self._next_ledger: int | None = None
        self._direct = False  # catching up: reads and writes go to SQLite at once (`apply`)
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
    def _in_tx(self) -> bool:
        return self._tx_thread == threading.get_ident()

    def _con(self) -> sqlite3.Connection:
        """The writer's connection on the thread inside a transaction; elsewhere this thread's
        reader, which sees what was committed."""
        if self._in_tx():
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
        self._tx_thread = None  # a transaction still open now was abandoned: its writes go
        self._clear_buffer()
        try:
            self.flush()
        except sqlite3.Error as exc:  # the log still has it: the next start catches up
            log.error("the key index could not write its last rows (%s); the next start replays them", exc)
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
        self, rows: Iterable[Mapping[str, Any]], total: int = 0, on_progress: RowsApplied | None = None
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
        self.discard()
        try:
            self.begin()
            self.commit(0, "", force=True)
            applied = self.apply(rows, total, on_progress, commit_every=50_000)
        except BaseException:
            self._w = live
            self._next_ledger = None
            con.close()
            build.unlink(missing_ok=True)
            raise
        self._w = live
        self._next_ledger = None
        con.close()
        fsync_path(build)
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

    # -- transactions (writer thread) --------------------------------------------------------
    def begin(self) -> None:
        self._tx_thread = threading.get_ident()

    @property
    def in_transaction(self) -> bool:
        return self._tx_thread is not None

    def mark(self) -> int:
        return self._undo_base + len(self._undo)

    def release(self, mark: int) -> None:
        """Drop what was written since `mark`."""
        if mark < self._undo_base:
            raise RuntimeError("the key index's writes since this mark were committed already")
        undo = self._undo
        while self._undo_base + len(undo) > mark:
            table, key, before = undo.pop()
            if before is _MISSING:
                del table[key]
            else:
                table[key] = before

    def _clear_buffer(self) -> None:
        for table in self._buffer.values():
            table.clear()
        self._undo_base += len(self._undo)
        self._undo.clear()

    def commit(self, last_seq: int | None, anchor: str, force: bool = False) -> None:
        """Commit the transaction's writes (`last_seq`: the newest raw row it applied, if any):
        they join the sealed writes, which go to SQLite now when `force`, or when there are
        `FLUSH_ROWS` of them or the last went `FLUSH_SECONDS` ago."""
        sealed = self._sealed
        for name, rows in self._buffer.items():
            if rows:
                sealed[name].update(rows)
                self._sealed_rows += len(rows)
        if last_seq is not None:
            self._sealed_at = (last_seq, anchor)
        self._clear_buffer()
        self._tx_thread = None
        if force or self._sealed_rows >= FLUSH_ROWS or time.monotonic() - self._flushed_at >= FLUSH_SECONDS:
            try:
                self._flush()
            except BaseException:
                self.discard()
                raise
        if sum(map(len, self._seen.values())) > SEEN_ROWS:
            for seen in self._seen.values():
                seen.clear()

    def rollback(self) -> None:
        """Drop the transaction's writes (the sealed ones stand)."""
        self._tx_thread = None  # (ids the dropped writes took stay unused: sealed ones may follow them)
        self.release(self._undo_base)
        self._clear_buffer()

    def discard(self) -> None:
        """Forget every write not in SQLite yet (sealed ones too) and everything read from it:
        the index is then exactly the file, at the file's position, to be caught up from the
        log (after a failed flush, or before catching up)."""
        self._tx_thread = None
        self._clear_buffer()
        for name in _LOOKUPS:
            self._sealed[name].clear()
            self._seen[name].clear()
        self._sealed_rows = 0
        self._sealed_at = None
        self._next_ledger = None
        with contextlib.suppress(sqlite3.Error):
            if self._w.in_transaction:
                self._w.execute("ROLLBACK")

    def flush(self) -> None:
        """Write the sealed writes to SQLite now (the writer thread, or no writer running)."""
        if self._tx_thread is not None and not self._in_tx():
            raise RuntimeError("the key index is flushed by its writer")
        self._flush()

    def _flush(self) -> None:
        """Send the sealed writes to SQLite with their position, one statement per table, in
        one transaction; then every thread reads them there."""
        self._flushed_at = time.monotonic()
        sealed, position = self._sealed, self._sealed_at
        if not self._sealed_rows and position is None:
            return
        w = self._w
        w.execute("BEGIN")
        try:
            for name, rows in sealed.items():
                if not rows:
                    continue
                table, keys, values = _LOOKUPS[name]
                if name == "provisional":  # settled leads delete theirs
                    w.execute(
                        "DELETE FROM provisional WHERE (program_id, customer) IN"
                        " (SELECT value ->> 0, value ->> 1 FROM json_each(?))",
                        (orjson.dumps(list(rows)),),
                    )
                kept = [[*key, *row] for key, row in rows.items() if row is not _GONE]
                if kept:
                    columns = ", ".join(f"value ->> {i}" for i in range(len(keys) + len(values)))
                    w.execute(
                        f"INSERT OR REPLACE INTO {table} ({', '.join(keys + values)})"
                        f" SELECT {columns} FROM json_each(?)",
                        (orjson.dumps(kept),),
                    )
            if position is not None:
                self._set_position(*position)
            w.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                w.execute("ROLLBACK")
            raise
        # Committed: SQLite holds them now (other threads read it after the sealed rows are gone).
        for name in _LOOKUPS:
            sealed[name].clear()
            self._seen[name].clear()
        self._sealed_rows = 0
        self._sealed_at = None

    # -- the buffer ----------------------------------------------------------------------------
    def _get(self, name: str, key: Key) -> Row | None:
        """The row of `key` in table `name` (its value columns), None when there is none: the
        transaction's own writes first, then the sealed ones, then SQLite (read once)."""
        if self._in_tx():
            if self._direct:
                return self._read(self._w, name, key)
            row = self._buffer[name].get(key, _MISSING)
            if row is _MISSING:
                row = self._sealed[name].get(key, _MISSING)
        else:
            row = self._sealed[name].get(key, _MISSING)
            if row is _MISSING:
                return self._read(self._con(), name, key)
        if row is not _MISSING:
            return None if row is _GONE else row
        seen = self._seen[name]
        row = seen.get(key, _MISSING)
        if row is _MISSING:
            row = seen[key] = self._read(self._w, name, key)
        return row  # type: ignore[no-any-return]

    @staticmethod
    def _read(con: sqlite3.Connection, name: str, key: Key) -> Row | None:
        found = con.execute(_SELECT[name], key).fetchone()
        if found is None:
            return None
        return tuple(found[1:]) if _LOOKUPS[name][2] else ()

    def _put(self, name: str, key: Key, row: Row | None) -> None:
        """Write `row` for `key` (None deletes it) in the buffer, undoably (while catching up:
        in SQLite at once)."""
        if self._direct:
            if row is None:
                self._w.execute(_DELETE[name], key)
            else:
                self._w.execute(_REPLACE[name], (*key, *row))
            return
        table = self._buffer[name]
        self._undo.append((table, key, table.get(key, _MISSING)))
        table[key] = _GONE if row is None else row

    def prefetch(self, needs: Sequence[Needs]) -> None:
        """Read the rows the operations of a group will claim and look up (`Needs`) at once,
        one statement per table, so their lookups find them without a statement each. Sale
        keys bring their ledgers. A key is noted (found, or absent) only once its statement
        has answered: a lookup that raises, or keys that cannot be encoded for it, leave nothing
        noted, so no key ever reads as absent that was not looked up."""
        if not self._in_tx():
            return
        parts: list[str] = []
        todos: list[tuple[str, list[Key]]] = []
        for field, keys in gather(needs).items():
            name = "sale_keys" if field == "sales" else field
            buffer, sealed, seen = self._buffer[name], self._sealed[name], self._seen[name]
            todo = list(
                dict.fromkeys(k for k in keys if k not in buffer and k not in sealed and k not in seen)
            )
            if todo:
                parts.append(_PREFETCH[name])
                todos.append((name, todo))
        if not parts:
            return
        # One statement for the group's tables: each statement hands the interpreter lock to the
        # event loop and waits to get it back.
        params = [orjson.dumps(todo) for _, todo in todos]
        rows = self._w.execute(" UNION ALL ".join(parts), params).fetchall()
        for name, todo in todos:
            seen = self._seen[name]
            for k in todo:
                seen[k] = None
        for name, *found in rows:
            _, key_columns, values = _LOOKUPS[name]
            width = len(key_columns)
            self._seen[name][tuple(found[:width])] = tuple(found[width : width + len(values)])
            if name == "sale_keys" and found[3:] != [None, None, None]:
                self._seen["ledgers"].setdefault((found[2],), tuple(found[3:]))

    # -- lookups -------------------------------------------------------------------------------
    def click_partner(self, program_id: str, click_id: str) -> str | None:
        row = self._get("clicks", (program_id, click_id))
        return str(row[0]) if row else None

    def binding(self, program_id: str, customer: str) -> Binding | None:
        row = self._get("bindings", (program_id, customer))
        return Binding(row[0], row[1], row[2]) if row else None

    def provisional_click(self, program_id: str, customer: str) -> tuple[bool, str | None]:
        row = self._get("provisional", (program_id, customer))
        return (True, row[0]) if row is not None else (False, None)

    def _ledger_id(self, program_id: str, keys: Iterable[str]) -> int | None:
        for key in keys:
            row = self._get("sale_keys", (program_id, key))
            if row:
                return int(row[0])
        return None

    def sale(self, program_id: str, keys: Iterable[str]) -> SaleLedger | None:
        ledger = self._ledger_id(program_id, keys)
        row = self._get("ledgers", (ledger,)) if ledger is not None else None
        return SaleLedger(row[0], row[1], int(row[2])) if row else None

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        return self._get("refunds", (program_id, refund_id)) is not None

    def event_seen(self, event_id: str) -> bool:
        return self._get("events", (event_id,)) is not None

    def claimed(self, program_id: str, key: str) -> bool:
        return self._get("claims", (program_id, key)) is not None

    def counts(self) -> dict[str, int]:
        """Rows per table (for tests and `tally migrate`), the sealed writes flushed first."""
        self.flush()
        con = self._con()
        names = ("clicks", "bindings", "provisional", "ledgers", "sale_keys", "refunds", "events", "claims")
        return {n: int(con.execute(f"SELECT count(*) FROM {n}").fetchone()[0]) for n in names}

    # -- writes (writer thread, inside a transaction) -----------------------------------------
    def claim(self, program_id: str, key: str) -> bool:
        """Claim an idempotency key; True when this write claimed it (False: already taken)."""
        if self._get("claims", (program_id, key)) is not None:
            return False
        self._put("claims", (program_id, key), ())
        return True

    def _insert_absent(self, name: str, key: Key, row: Row) -> None:
        """Insert `row` unless `key` has one (a row of no values, a key's mere presence, is
        written as it is: the same either way, and no read)."""
        if self._direct:
            self._w.execute(_IGNORE[name], (*key, *row))
        elif not row or self._get(name, key) is None:
            self._put(name, key, row)

    def observe(self, row: Mapping[str, object]) -> None:
        """Apply one raw-log row (its `effects`): one code path for live ingest and for
        catching up."""
        for effect in effects(row):
            self._apply(effect)

    def _apply(self, effect: rule.Effect) -> None:
        """One effect, as ingest/domain/keys.py says it changes the tables."""
        match effect:
            case rule.SeeEvent(event_id):
                self._insert_absent("events", (event_id,), ())
            case rule.PutClick(program_id, click_id, partner_code):
                self._put("clicks", (program_id, click_id), (partner_code,))
            case rule.Bind(program_id, customer, lead_event_id, click):
                if self.binding(program_id, customer) is None:
                    partner = self.click_partner(program_id, click) if click else None
                    self._put("bindings", (program_id, customer), (lead_event_id, click, partner))
                if self._get("provisional", (program_id, customer)) is not None:
                    self._put("provisional", (program_id, customer), None)
            case rule.Provisional(program_id, customer, click):
                if self.binding(program_id, customer) is None:
                    self._insert_absent("provisional", (program_id, customer), (click,))
            case rule.SeeRefund(program_id, refund_id):
                self._insert_absent("refunds", (program_id, refund_id), ())
            case rule.AddRefunded(program_id, key, added):
                if (ledger := self._ledger_id(program_id, [key])) is not None:
                    self._refunded(ledger, lambda refunded: refunded + added)
            case rule.Sale(program_id, keys, amount, currency):
                self._sale(program_id, keys, amount, currency)
            case rule.ProcessorRefund(program_id, keys, total, currency):
                if (ledger := self._ledger_id(program_id, keys)) is not None:
                    self._refunded(ledger, lambda refunded: max(refunded, total))
                else:
                    self._sale(program_id, keys, None, currency, refunded=total)
            case rule.Link(program_id, invoice, payment):
                self._link(program_id, invoice, payment)

    def _refunded(self, ledger: int, change: Callable[[int], int]) -> None:
        found = self._get("ledgers", (ledger,))
        if found is not None:
            amount, currency, refunded = found
            self._put("ledgers", (ledger,), (amount, currency, change(int(refunded))))

    def _new_ledger(self) -> int:
        if self._next_ledger is None:
            found = self._w.execute("SELECT coalesce(max(id), 0) FROM ledgers").fetchone()
            self._next_ledger = int(found[0]) + 1
        ledger = self._next_ledger
        self._next_ledger += 1
        return ledger

    def _sale(
        self,
        program_id: str,
        keys: Sequence[str],
        amount: int | None,
        currency: str | None,
        refunded: int = 0,
    ) -> None:
        ledger = self._ledger_id(program_id, keys)
        if ledger is None:
            ledger = self._new_ledger()
            self._put("ledgers", (ledger,), (amount, currency, refunded))
        elif amount is not None and (found := self._get("ledgers", (ledger,))) and found[0] is None:
            self._put("ledgers", (ledger,), (amount, found[1] or currency, found[2]))
        for key in keys:
            self._insert_absent("sale_keys", (program_id, key), (ledger,))

    def _link(self, program_id: str, invoice: str, payment: str) -> None:
        by_invoice = self._ledger_id(program_id, [invoice])
        by_payment = self._ledger_id(program_id, [payment])
        if by_invoice is None or by_payment is None or by_invoice == by_payment:
            self._sale(program_id, (invoice, payment), None, None)
            return
        kept, gone = self._get("ledgers", (by_invoice,)), self._get("ledgers", (by_payment,))
        if kept is not None and gone is not None:
            merged = (_either(kept[0], gone[0]), _either(kept[1], gone[1]), max(int(kept[2]), int(gone[2])))
            self._put("ledgers", (by_invoice,), merged)
        self._put("sale_keys", (program_id, payment), (by_invoice,))

    # -- catching up with the log ----------------------------------------------------------------
    def apply(
        self,
        rows: Iterable[Mapping[str, Any]],
        total: int = 0,
        on_progress: RowsApplied | None = None,
        commit_every: int = 20_000,
    ) -> int:
        """Apply raw-log rows (in `seq` order, after `position()`), committing them with the
        position every `commit_every` rows, so an interrupted rebuild resumes where it stopped.
        Nothing else writes meanwhile (start-up, `tally migrate`, or the writer catching up
        before its next group), so each lookup and write is a statement at once, on one
        thread: no buffer to keep. Returns how many rows were applied."""
        self.discard()
        done = 0
        last: Mapping[str, Any] | None = None
        w = self._w
        self._direct = True
        self._tx_thread = threading.get_ident()
        try:
            w.execute("BEGIN")
            for row in rows:
                self.observe(row)
                for claim in claims_of(row):  # (what a claim took is known: the log says)
                    self._put("claims", claim, ())
                last = row
                done += 1
                if done % commit_every == 0:
                    self._commit_direct(int(row["seq"]), anchor_of(row["received_at"]))
                    if on_progress:
                        on_progress(done, total)
                    w.execute("BEGIN")
            self._commit_direct(
                int(last["seq"]) if last else None, anchor_of(last["received_at"]) if last else ""
            )
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                if w.in_transaction:
                    w.execute("ROLLBACK")
            raise
        finally:
            self._direct = False
            self._tx_thread = None
            self._next_ledger = None
        if on_progress:
            on_progress(done, total)
        return done

    def _commit_direct(self, last_seq: int | None, anchor: str) -> None:
        if last_seq is not None:
            self._set_position(last_seq, anchor)
        self._w.execute("COMMIT")

    def _set_position(self, seq: int, anchor: str) -> None:
        """Record the last raw row the index holds (inside the writer's open transaction)."""
        self._w.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            (("last_seq", str(seq)), ("anchor", anchor), ("format", FORMAT)),
        )


class KeyLookups:
    """What the key index answers, as `Store` and `Tx` ask it (`keys`: the index): on the
    writer's thread inside a transaction the answers include the transaction's own writes."""

    keys: KeyIndex

    def sale(self, program_id: str, keys: Sequence[str]) -> SaleLedger | None:
        return self.keys.sale(program_id, keys)

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        return self.keys.refund_seen(program_id, refund_id)

    def event_seen(self, event_id: str) -> bool:
        return self.keys.event_seen(event_id)

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        return self.keys.click_partner(program_id, click_id)

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        return self.keys.binding(program_id, customer_key)

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        return self.keys.provisional_click(program_id, customer_key)
