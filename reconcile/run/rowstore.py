"""The row store: the rows incremental runs read, found by seq in SQLite beside the database.

An incremental run reconciles the components its new rows touch (reconcile/run/components.py),
and reads their rows by seq. In DuckDB's columnar tables those few thousand rows lie in nearly
every vector of the log (a customer's history spans it), so reading them is a scan whose cost
grows with the log: at 10M events the run after 1,000 new events spent 1.4 of its 2.6 s
reading 5,700 rows. Here each of those rows is one B-tree lookup, whatever the log's size.

Layout (`<database>.rows`, SQLite in WAL mode):

- `rows(seq INTEGER PRIMARY KEY, data TEXT, mac BLOB)`: every row the component store covers
  (components.COVERED: routed, not an engineer action), as `source.read_linked` gives it, in
  JSON: its non-null columns under short keys (their index in `COLUMNS`), times as
  microseconds since the epoch; `mac`, its keyed checksum (`_Sealer`: BLAKE2b of seq and data,
  keyed by a random key the database holds and the file never does);
- `meta(token)`: a random name the file was made with.

Which rows can be trusted is written in the database, not in the file: `rc_row_state(format,
token, upto_seq, secret)`, written in the run's final transaction (`apply`) like the component
store's state. The rows with `seq <= upto_seq` of the file named `token` are the log's:

- the raw log is append-only and ingest commits rows in `seq` order, so rows up to a run's
  high water are the same in every later snapshot (the column mirror relies on the same);
- rows are added to the file before the run commits; a run that fails or is killed leaves
  rows after `upto_seq`, which the next run deletes before it adds its own (`catch_up`), so a
  database restored from an older copy never reads rows of the future it lost;
- a database copied without its file, or a file of another database, or of another `FORMAT`,
  names another token or none: the file is made anew and filled from seq 0 (by the first run,
  full or incremental, that finds it so);
- a row asked for and not found (a file cut short by a power loss after the database
  committed) makes `read` answer None: the run reads the log instead, and the file is made anew
  by the next run;
- every row read is checked against its `mac` before it is believed: a row damaged or altered
  (even into another valid row: an amount changed, a row moved to another seq) fails it, as does
  a file SQLite finds corrupt. A file that fails is set aside (reconcile/run/derived.py: renamed,
  logged, counted), the run reads the log, and the file is made anew. The same happens to a file
  there that the database does not name (another database's, or one that failed before).

An in-memory database has no row store; incremental runs then scan the log, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from ingest.pause import pause
from ingest.progress import Progress
from ingest.storage.durable import fsync_path
from reconcile.run import derived, mirror
from reconcile.run.source import LEDGER_KINDS, LINKED_COLUMNS, LINKED_GROUPS, read_linked
from reconcile.schema import ENGINE, RAW_SCHEMA

log = logging.getLogger("tally.reconcile")

COLUMNS: tuple[str, ...] = LINKED_COLUMNS
KEYS = {name: format(index, "x") for index, name in enumerate(COLUMNS)}
TIMES = tuple(name for name in COLUMNS if isinstance(RAW_SCHEMA[name], pl.Datetime))
# Bump the first field when the encoding changes for another reason than the columns.
FORMAT = hashlib.sha256(f"2|{[(c, str(RAW_SCHEMA[c])) for c in COLUMNS]}".encode()).hexdigest()[:16]
SUFFIX = ".rows"
STATE_DDL = (
    "CREATE TABLE IF NOT EXISTS rc_row_state"
    " (format VARCHAR NOT NULL, token VARCHAR NOT NULL, upto_seq BIGINT NOT NULL, secret VARCHAR)"
)
# A database whose state table an older release made (format 1, no key) gains the column.
STATE_COLUMN = "ALTER TABLE rc_row_state ADD COLUMN IF NOT EXISTS secret VARCHAR"
# A row's checksum: BLAKE2b keyed by the file's key, of 16 bytes (2^-128 for a forged row).
MAC_BYTES = 16
_PERSON = b"tally.rows"
# SQLite's result codes for a file that is not (or no longer) a sound database.
_CORRUPT = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB (extended codes keep the low byte)
# The rows of a catch-up are read from the log this many seqs at a time, and inserted this many
# rows at a time (a batch's rows, JSON and Python strings are what a build holds in memory).
BATCH_SEQS = 250_000
INSERT_ROWS = 100_000
# SQLite's limit on a statement's variables is 32,766 since 3.32; stay well under it.
LOOKUP_KEYS = 5_000
# The row store serves a closure of at most this share of the log's rows; a larger one is read
# by a scan of the log, which costs about the same whatever it reads. At 10M events, a closure
# of 5,700 rows: 0.1 s from the store against 1.1 to 1.4 s by scan; of 400k rows (1 % new
# events): 3.5 to 7.1 s and 2.9 GiB from the store against 1.1 to 2.3 s and 1.3 GiB by scan.
SHARE = 0.005
# Key -> JSON type: times travel as integers.
_DECODED = pl.Struct({KEYS[c]: pl.Int64 if c in TIMES else RAW_SCHEMA[c] for c in COLUMNS})
# The order `read_linked` gives its rows in: stripe, other, ledger, click, each by seq.
_NAMES = tuple(LINKED_GROUPS)
_GROUP = (
    pl.when(pl.col("kind") == "stripe")
    .then(0)
    .when(pl.col("kind") == "click")
    .then(3)
    .when(pl.col("kind").is_in(LEDGER_KINDS))
    .then(2)
    .otherwise(1)
)


def brought_up(
    reader: duckdb.DuckDBPyConnection, high_water: int, report: Progress | None = None
) -> RowStore | None:
    """The row store of `reader`'s database, open and caught up to `high_water`; None for an
    in-memory database, or when the file cannot be made or written (a full disk, a path taken
    by something else): the run then reads its closure from the log, and the database keeps
    trusting what it trusted (a catch-up never changes the file's rows up to its `upto_seq`)."""
    store = None
    try:
        store = RowStore.open(reader, high_water)
        if store is not None:
            try:
                store.catch_up(reader, high_water, report)
            except sqlite3.DatabaseError as exc:
                if store.fresh or not _corrupt(exc):
                    raise
                store.reject(f"SQLite finds it {exc.sqlite_errorname}")
                store = RowStore.make(store.path)
                store.catch_up(reader, high_water, report)
    except (sqlite3.Error, OSError) as exc:
        log.warning("row store %s not usable (%s): this run reads the log", path_of(reader), exc)
        if store is not None:
            store.close()
        return None
    return store


def path_of(con: duckdb.DuckDBPyConnection) -> Path | None:
    """Where the row store of `con`'s database lives; None for an in-memory database."""
    folder = mirror.directory(con)  # `<database>.mirror`
    return None if folder is None else folder.with_suffix(SUFFIX)


def _corrupt(exc: sqlite3.Error) -> bool:
    """Whether SQLite says the file itself is damaged (not the disk full, a lock, ...)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _CORRUPT


@dataclass(frozen=True)
class Trust:
    """What the database says of its row store: the file named `token` holds the log's covered
    rows up to `upto`, each sealed with `key` (`Sealer`)."""

    token: str
    upto: int
    key: bytes


def _state(reader: duckdb.DuckDBPyConnection) -> Trust | None:
    """The row store the database trusts, in this format."""
    columns = {
        str(name)
        for (name,) in reader.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'main' AND table_name = 'rc_row_state'"
        ).fetchall()
    }
    if "secret" not in columns:  # none, or an older release's (format 1)
        return None
    rows = reader.execute("SELECT format, token, upto_seq, secret FROM rc_row_state").fetchall()
    if len(rows) != 1 or rows[0][0] != FORMAT or rows[0][3] is None:
        return None
    try:
        key = bytes.fromhex(str(rows[0][3]))
    except ValueError:
        return None
    return Trust(str(rows[0][1]), int(rows[0][2]), key)


class Sealer:
    """A row's checksum in the file: BLAKE2b of its seq and its data, keyed by the file's key
    (held by the database, never by the file), so that no change to a row, nor a row moved to
    another seq, nor a row of another file, passes for one of this file's."""

    def __init__(self, key: bytes) -> None:
        self._keyed = hashlib.blake2b(key=key, digest_size=MAC_BYTES, person=_PERSON)

    def seal(self, seq: int, data: str) -> bytes:
        mac = self._keyed.copy()
        mac.update(seq.to_bytes(8, "big", signed=True))
        mac.update(data.encode())
        return mac.digest()

    def seal_all(self, seqs: Iterable[int], data: Iterable[str]) -> list[bytes]:
        keyed = self._keyed
        macs = []
        for seq, text in zip(seqs, data, strict=True):
            mac = keyed.copy()
            mac.update(seq.to_bytes(8, "big", signed=True))
            mac.update(text.encode())
            macs.append(mac.digest())
        return macs


def encode(rows: pl.DataFrame) -> pl.DataFrame:
    """(seq, data), by seq: each row of `rows` (columns COLUMNS, as `read_linked` gives them) as
    the JSON of its non-null columns. Each group of rows is encoded with its own columns (the
    others are null: `read_linked`), the groups at once. A null is `,"<key>":null` in Polars'
    JSON: a string's own quotes are escaped (`\\"`), so that text never occurs inside one and
    can be dropped (the decoder reads a missing key as null)."""
    parts = []
    for (group,), some in rows.with_columns(_group=_GROUP).partition_by("_group", as_dict=True).items():
        fields = [
            (pl.col(c).dt.epoch("us") if c in TIMES else pl.col(c)).alias(KEYS[c])
            for c in LINKED_GROUPS[_NAMES[int(group)]]
            if c != "seq"
        ]
        data = pl.struct(fields).struct.json_encode().str.replace_all(r',"[0-9a-f]+":null', "")
        parts.append(some.lazy().select("seq", data.alias("data")))
    if not parts:
        return pl.DataFrame(schema={"seq": pl.Int64, "data": pl.String})
    return pl.concat(pl.collect_all(parts, engine=ENGINE)).sort("seq")


def decode(seqs: Sequence[int], data: Sequence[str], like: pl.DataFrame) -> pl.DataFrame:
    """The rows whose JSON (`encode`) is `data`, with the columns and types of `like` (an
    empty `read_linked` result: times in the session's time zone), in `read_linked`'s order."""
    values = pl.Series("data", data, pl.String).str.json_decode(_DECODED).struct.unnest()
    values = values.rename({KEYS[c]: c for c in COLUMNS if KEYS[c] in values.columns})
    frame = values.with_columns(
        pl.Series("seq", seqs, pl.Int64),
        *(
            pl.col(c).cast(pl.Datetime("us", "UTC")).dt.convert_time_zone(_zone(like.schema[c]))
            for c in TIMES
        ),
    )
    return frame.sort(_GROUP, "seq").select(pl.col(c).cast(like.schema[c]) for c in like.columns)


def _zone(dtype: pl.DataType) -> str:
    return (dtype.time_zone if isinstance(dtype, pl.Datetime) else None) or "UTC"


@dataclass
class RowStore:
    """The row store as one run sees it: `upto`, the seq up to which the file holds every
    covered row (what the database trusts, then what this run added)."""

    path: Path
    lite: sqlite3.Connection
    token: str
    upto: int
    key: bytes
    # Made by this run: filled without a journal (nothing to roll back to; a run that does not
    # finish leaves a file no database trusts), then journaled (`catch_up`).
    fresh: bool = False

    @classmethod
    def open(cls, reader: duckdb.DuckDBPyConnection, high_water: int) -> RowStore | None:
        """The row store of `reader`'s database, made anew (empty) when the database does not
        trust the file there (see the module docstring); None for an in-memory database."""
        path = path_of(reader)
        if path is None:
            return None
        state = _state(reader)
        if state is not None and state.upto <= high_water:
            store = cls._connect(path, state)
            if store is not None:
                return store
        return cls.make(path)

    @classmethod
    def _connect(cls, path: Path, state: Trust) -> RowStore | None:
        """The file the database trusts, open; None when there is none, or when the file there
        is not it (another database's, one SQLite cannot read): that one is set aside."""
        if not path.exists():
            return None
        lite: sqlite3.Connection | None = None
        why = "not a file"
        try:
            if path.is_file():
                lite = _connection(path)
                rows = lite.execute("SELECT token FROM meta").fetchall()
                if len(rows) == 1 and rows[0][0] == state.token:
                    return cls(path, lite, state.token, state.upto, state.key)
                why = "it is another database's (another token)"
        except sqlite3.Error as exc:
            why = f"SQLite cannot read it ({exc.sqlite_errorname})"
        if lite is not None:
            lite.close()
        if path.is_file():
            derived.set_aside("rows", path.with_suffix(""), _files(path), why)
        return None

    @classmethod
    def make(cls, path: Path) -> RowStore:
        """A new, empty file at `path` (whatever was there deleted: no database trusts it)."""
        for stale in _files(path):
            stale.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        lite = sqlite3.connect(path, check_same_thread=False)
        lite.execute("PRAGMA journal_mode=OFF")
        lite.execute("PRAGMA synchronous=OFF")
        token = uuid.uuid4().hex
        with lite:
            lite.execute("CREATE TABLE rows (seq INTEGER PRIMARY KEY, data TEXT NOT NULL, mac BLOB NOT NULL)")
            lite.execute("CREATE TABLE meta (token TEXT NOT NULL)")
            lite.execute("INSERT INTO meta VALUES (?)", [token])
        return cls(path, lite, token, 0, secrets.token_bytes(32), fresh=True)

    def reject(self, why: str) -> None:
        """The file is not to be believed: closed, set aside (reconcile/run/derived.py), never
        trusted again (`apply` writes a state no file has)."""
        self.upto = -1
        self.close()
        derived.set_aside("rows", self.path.with_suffix(""), _files(self.path), why)

    def catch_up(self, reader: duckdb.DuckDBPyConnection, upto: int, report: Progress | None = None) -> None:
        """Add every covered row with `self.upto < seq <= upto` (read through `reader`'s
        snapshot), `BATCH_SEQS` seqs at a time, each batch inserted by a second thread while the
        next is read and encoded (both release the interpreter lock); rows the file holds after
        `self.upto` (of a run that did not commit) are deleted first."""
        with self.lite:
            self.lite.execute("DELETE FROM rows WHERE seq > ?", [self.upto])
        total = max(-(-(upto - self.upto) // BATCH_SEQS), 0)
        with ThreadPoolExecutor(1, thread_name_prefix="rc-rows") as pool:
            inserted: Future[None] | None = None
            for done in range(total):
                if report is not None and total > 1:
                    report("rows", done, total)
                after = self.upto + done * BATCH_SEQS
                batch = read_linked(
                    reader,
                    "program_id IS NOT NULL AND seq > ? AND seq <= ?",
                    [after, min(after + BATCH_SEQS, upto)],
                )
                encoded = encode(batch)
                del batch
                if inserted is not None:
                    inserted.result()
                    pause("rows.batch")  # the crash tests: rows in the file the database does not trust yet
                inserted = pool.submit(self._insert, encoded)
            if inserted is not None:
                inserted.result()
                pause("rows.batch")
        self.upto = max(self.upto, upto)
        if self.fresh:  # on disk before the database trusts it, journaled from now on
            fsync_path(self.path)
            self.lite.execute("PRAGMA journal_mode=WAL")
            self.lite.execute("PRAGMA synchronous=NORMAL")
            self.fresh = False

    def _insert(self, encoded: pl.DataFrame) -> None:
        sealer = Sealer(self.key)
        with self.lite:
            for start in range(0, encoded.height, INSERT_ROWS):
                some = encoded.slice(start, INSERT_ROWS)
                seqs = some.get_column("seq").to_list()
                data = some.get_column("data").to_list()
                self.lite.executemany(
                    "INSERT OR REPLACE INTO rows VALUES (?, ?, ?)",
                    zip(seqs, data, sealer.seal_all(seqs, data), strict=True),
                )

    def suits(self, rows: int) -> bool:
        """Whether reading `rows` rows here beats a scan of the log (`SHARE`)."""
        return rows <= max(self.upto, 0) * SHARE

    def read(self, reader: duckdb.DuckDBPyConnection, seqs: pl.Series) -> pl.DataFrame | None:
        """The rows of `seqs` (all covered, none after `upto`) as `read_linked` gives them,
        each checked against its checksum; None when one is not in the file, fails its
        checksum, or the file cannot be read: the file is then set aside (`reject`) and made
        anew by the next run, and the caller reads the log."""
        like = read_linked(reader, "seq < 0")  # the columns and types, from no row
        wanted = seqs.cast(pl.Int64).unique().sort().to_list()
        if wanted and wanted[-1] > self.upto:
            self.upto = -1  # never trusted again: `apply` writes a state no file has
            return None
        found: list[tuple[int, str, bytes]] = []
        try:
            for start in range(0, len(wanted), LOOKUP_KEYS):
                keys = wanted[start : start + LOOKUP_KEYS]
                found += self.lite.execute(
                    f"SELECT seq, data, mac FROM rows WHERE seq IN ({', '.join('?' * len(keys))})", keys
                ).fetchall()
        except sqlite3.Error as exc:
            self.reject(f"SQLite cannot read it ({exc.sqlite_errorname})")
            return None
        if len(found) != len(wanted):
            self.reject(f"{len(wanted) - len(found)} of the {len(wanted)} rows asked for are missing")
            return None
        seals = Sealer(self.key).seal_all([s for s, _, _ in found], [d for _, d, _ in found])
        failed = sum(seal != mac for seal, (_, _, mac) in zip(seals, found, strict=True))
        if failed:
            self.reject(f"{failed} of the {len(wanted)} rows read fail their checksum")
            return None
        try:
            return decode([s for s, _, _ in found], [d for _, d, _ in found], like)
        except pl.exceptions.PolarsError as exc:  # sealed by this code: never, short of a bug
            self.reject(f"its rows cannot be decoded ({exc.__class__.__name__})")
            return None

    def apply(self, con: duckdb.DuckDBPyConnection) -> None:
        """Inside the run's final transaction: the database trusts the file up to `upto`."""
        con.execute(STATE_DDL)
        con.execute(STATE_COLUMN)
        con.execute("DELETE FROM rc_row_state")
        if self.upto >= 0:
            con.execute(
                "INSERT INTO rc_row_state (format, token, upto_seq, secret) VALUES (?, ?, ?, ?)",
                [FORMAT, self.token, self.upto, self.key.hex()],
            )

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.lite.close()


def _files(path: Path) -> list[Path]:
    """The row store at `path` and SQLite's companions of it."""
    return [path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")]


def _connection(path: Path) -> sqlite3.Connection:
    lite = sqlite3.connect(path, check_same_thread=False)
    lite.execute("PRAGMA journal_mode=WAL")
    # A commit the machine loses makes `read` miss a row, never read a wrong one.
    lite.execute("PRAGMA synchronous=NORMAL")
    return lite
