"""The raw log's column mirror: what the reconciler reads of `raw_events`, in Parquet segments.

A full run reads every row of the log. Out of DuckDB that costs far more than the
reconcile itself: 2M events take 2 s and 3.7 CPU-s to decompress and export (DuckDB's string
decompression and Arrow conversion, then Polars' string view conversion), where the same rows
read back from a Parquet file take 0.2 s and 0.4 CPU-s. So a full run keeps a copy of the
columns it reads (schema.READ_COLUMNS, as source.read_rows gives them), in segments of
consecutive `seq` (every row, routed or not) beside the database file (`<database>.mirror/`),
and reads each program chunk, and the unroutable rows, from the segments plus, from DuckDB, the
few rows received after the last one. Incremental runs add whole segments only, so the mirror
keeps up with the log between full runs.

Why a copy can be trusted:

- the raw log is append-only (nothing in it is ever updated or deleted) and ingest commits rows
  in `seq` order, so the rows with `after < seq <= upto` are the same in every snapshot whose
  high water is at least `upto` (the incremental runs rely on the same);
- a segment is written to a temporary name, flushed to disk, then renamed, and is only used once
  the run that wrote it has committed its row in `rc_mirror` (segment file, `after_seq`,
  `upto_seq`, rows, format) in the same transaction as its results. A run that fails leaves a
  file no registry row names; the next full run deletes it;
- only a chain of registered segments starting at seq 0 is used, each checked against its file
  (present, readable, the registered row count); the chain stops at the first that is not;
- a full run (the only one that reads the segments' rows) first checks each segment's bytes
  against the BLAKE2b digest its registry row holds (taken as the file was written): a segment
  damaged, altered (even into other valid rows: an amount changed) or of another database fails
  it, is set aside (reconcile/run/derived.py: renamed, logged, counted), and the chain stops
  there; the run reads the rows after it from the log and writes them anew. Hashing a segment
  costs a fraction of reading it (two at a time, `VERIFY_THREADS`);
  A database copied elsewhere, or restored, finds no files or its own; a change to what the
  reconciler reads changes `FORMAT`, which retires every segment of the old one;
- tests/reconcile/test_mirror.py checks the job gives exactly the pure pipeline's tables with
  segments, without them, and with a segment lost or damaged.

Rows after the chain's end are written as new segments once there are at least `MIN_ROWS` of
them, at most `SEGMENT_ROWS` a segment; fewer are read from DuckDB on every chunk. Within a
segment rows are ordered by program and seq, in row groups of `ROW_GROUP` rows with statistics,
so reading one chunk's programs skips most row groups. An in-memory database has no mirror.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl
import polars.selectors as cs

from ingest.pause import pause
from ingest.progress import Progress
from ingest.storage.durable import fsync_path
from reconcile.run import derived
from reconcile.run.source import (
    ENGINEER_KINDS,
    raw_chunk,
    read_rows,
    registered,
    stray_rows,
    unroutable_table,
)
from reconcile.schema import ENGINE, RAW_SCHEMA, READ_COLUMNS

# A segment is read into memory, sorted and written whole: at 2.5M rows the first run of a 10M-event
# log peaked at 4.5 GiB writing them, at 1M rows about 2.5 GiB (job.CHUNK_EVENTS bounds the rest).
SEGMENT_ROWS = 1_000_000
MIN_ROWS = 250_000
ROW_GROUP = 50_000
# Bump the version when segments must be rewritten for another reason than the columns read.
FORMAT = hashlib.sha256(f"3|{sorted(READ_COLUMNS.items())}|{sorted(RAW_SCHEMA)}".encode()).hexdigest()[:16]
SUFFIX = ".parquet"
# The rows of a part of a program read from DuckDB: its seqs (registered as `_rc_keep`) and the
# program-wide engineer actions.
KEEP = f"(seq IN (SELECT seq FROM _rc_keep) OR kind IN ({', '.join(repr(k) for k in ENGINEER_KINDS)}))"

REGISTRY_DDL = """CREATE TABLE IF NOT EXISTS rc_mirror (
    segment VARCHAR PRIMARY KEY,
    format VARCHAR NOT NULL,
    after_seq BIGINT NOT NULL,
    upto_seq BIGINT NOT NULL,
    rows BIGINT NOT NULL,
    digest VARCHAR)"""
# A registry an older release made (format 2, no digests) gains the column.
DIGEST_COLUMN = "ALTER TABLE rc_mirror ADD COLUMN IF NOT EXISTS digest VARCHAR"
# Segments are hashed this many at a time (hashlib lets go of the interpreter lock).
VERIFY_THREADS = 2
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class Segment:
    """The routed rows with `after < seq <= upto`, in file `name`."""

    name: str
    after: int
    upto: int
    rows: int
    digest: str | None = None  # BLAKE2b of the file's bytes (`digest`)


def directory(con: duckdb.DuckDBPyConnection) -> Path | None:
    """Where the mirror of `con`'s database lives; None for an in-memory database."""
    rows = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchall()
    path = rows[0][0] if rows else None
    return Path(f"{path}.mirror") if path else None


def _registered(con: duckdb.DuckDBPyConnection) -> list[Segment]:
    ((exists,),) = con.execute(
        "SELECT count(*) FROM information_schema.columns"
        " WHERE table_schema = 'main' AND table_name = 'rc_mirror' AND column_name = 'digest'"
    ).fetchall()
    if not exists:  # no registry, or an older release's (another format)
        return []
    rows = con.execute(
        "SELECT segment, after_seq, upto_seq, rows, digest FROM rc_mirror"
        " WHERE format = ? ORDER BY after_seq, upto_seq",
        [FORMAT],
    ).fetchall()
    return [
        Segment(str(name), int(after), int(upto), int(count), None if sum_ is None else str(sum_))
        for name, after, upto, count, sum_ in rows
    ]


def digest(path: Path) -> str | None:
    """BLAKE2b of the bytes of the file at `path`, in hex; None when it cannot be read."""
    summed = hashlib.blake2b()
    try:
        with path.open("rb") as file:
            while block := file.read(_READ_BYTES):
                summed.update(block)
    except OSError:
        return None
    return summed.hexdigest()


def _intact(path: Path, rows: int) -> bool:
    try:
        counted = pl.scan_parquet(path).select(pl.len()).collect(engine=ENGINE).item()
    except (OSError, pl.exceptions.PolarsError):
        return False
    return bool(counted == rows)


def _utc(rows: pl.DataFrame) -> pl.DataFrame:
    """Times in UTC: DuckDB hands them over in the session's time zone, which may differ from
    one run to the next (and frames in two time zones do not concatenate)."""
    return rows.with_columns(cs.datetime().dt.convert_time_zone("UTC"))


def _write(path: Path, rows: pl.DataFrame) -> str:
    """Write `rows` to `path` so that the name only ever holds a complete, flushed file; its
    digest, of the bytes written."""
    partial = path.with_name(f"{path.name}.partial")
    rows.write_parquet(partial, compression="lz4", statistics=True, row_group_size=ROW_GROUP)
    fsync_path(partial)
    summed = digest(partial)
    if summed is None:
        raise OSError(f"mirror segment {partial} cannot be read back")
    partial.rename(path)
    fsync_path(path.parent, directory=True)
    return summed


@dataclass
class Mirror:
    """The usable segments of one run (read through its snapshot `reader`), and those it wrote,
    to be registered in its final transaction (`register`)."""

    root: Path | None
    segments: list[Segment] = field(default_factory=list)
    written: list[Segment] = field(default_factory=list)
    retired: list[Segment] = field(default_factory=list)

    @classmethod
    def open(cls, reader: duckdb.DuckDBPyConnection, verify: bool = False) -> Mirror:
        """The chain of intact registered segments from seq 0 (the others are retired: `prune`
        deletes them once the run has committed). `verify` (a run that will read the
        segments' rows): each segment's bytes are checked against its digest too. A segment
        file that fails a check is set aside (reconcile/run/derived.py). Files no registry row
        names (left by a failed run) are deleted."""
        root = directory(reader)
        if root is None:
            return cls(None)
        registered = _registered(reader)
        sums: list[str | None] = []
        if verify and registered:
            with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="rc-verify") as pool:
                sums = list(pool.map(digest, [root / segment.name for segment in registered]))
        chain: list[Segment] = []
        for index, segment in enumerate(registered):
            end = chain[-1].upto if chain else 0
            if segment.after != end:
                break
            path = root / segment.name
            if verify:
                why = None if sums[index] == segment.digest else "its bytes differ from their digest"
            else:
                why = None if _intact(path, segment.rows) else "Parquet cannot read it as written"
            if why is not None:
                if path.is_file():
                    derived.set_aside("mirror", root.with_suffix(""), [path], why)
                break
            chain.append(segment)
        if root.is_dir():
            known = {segment.name for segment in registered}
            for path in root.iterdir():
                if path.name not in known:
                    path.unlink(missing_ok=True)
        return cls(root, chain, retired=[segment for segment in registered if segment not in chain])

    @property
    def covered(self) -> int:
        """The seq up to which the segments hold every row (0: none)."""
        return self.segments[-1].upto if self.segments else 0

    def extend(
        self, reader: duckdb.DuckDBPyConnection, high_water: int, report: Progress, least: int | None = None
    ) -> None:
        """Write the rows after `covered` up to `high_water` as new segments of at most
        SEGMENT_ROWS rows, when there are at least `least` (default MIN_ROWS) of them; with
        `least` = SEGMENT_ROWS (incremental runs), only whole segments."""
        if self.root is None:
            return
        floor = MIN_ROWS if least is None else least
        ((pending,),) = reader.execute(
            "SELECT count(*) FROM raw_events WHERE seq > ? AND seq <= ?", [self.covered, high_water]
        ).fetchall()
        if pending < floor:
            return
        total = -(-int(pending) // SEGMENT_ROWS) if floor < SEGMENT_ROWS else int(pending) // SEGMENT_ROWS
        self.root.mkdir(parents=True, exist_ok=True)
        for done in range(total):
            report("mirror", done, total)
            after = self.covered
            last = reader.execute(
                "SELECT seq FROM raw_events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT 1 OFFSET ?",
                [after, high_water, SEGMENT_ROWS - 1],
            ).fetchall()
            upto = int(last[0][0]) if last else high_water
            rows = read_rows(reader, "seq > ? AND seq <= ?", [after, upto])
            name = f"{uuid.uuid4().hex}{SUFFIX}"
            summed = _write(self.root / name, _utc(rows).sort("program_id", "seq", nulls_last=True))
            segment = Segment(name, after, upto, rows.height, summed)
            del rows
            self.segments.append(segment)
            self.written.append(segment)
            pause("mirror.segment")

    def chunk(
        self, reader: duckdb.DuckDBPyConnection, programs: Sequence[str], keep: pl.Series | None = None
    ) -> pl.DataFrame:
        """The rows of `programs` as `source.raw_chunk` gives them: from the segments, plus
        those received after them from DuckDB. `keep`: only the rows of these seqs and the
        engineer actions (a part of a program, reconcile/run/job.py), filtered as they are read."""
        if keep is None:
            after = raw_chunk(reader, programs, after_seq=self.covered)
        else:
            with registered(reader, "_rc_keep", keep.to_frame("seq")):
                after = raw_chunk(reader, programs, after_seq=self.covered, where=KEEP)
        if self.root is None or not self.segments:
            return after
        wanted = pl.col("program_id").is_in(list(programs))
        if keep is not None:
            wanted &= pl.col("seq").is_in(keep.implode()) | pl.col("kind").is_in(ENGINEER_KINDS)
        mirrored = pl.scan_parquet(self._files()).filter(wanted).collect(engine=ENGINE)
        return pl.concat([mirrored, _utc(after)], how="diagonal_relaxed")

    def kinds(self, reader: duckdb.DuckDBPyConnection, program: str) -> pl.DataFrame:
        """`seq` and `kind` of every row of `program` (what a run splits it by)."""
        after: pl.DataFrame = reader.sql(
            "SELECT seq, kind FROM raw_events WHERE program_id = ? AND seq > ?",
            params=[program, self.covered],
        ).pl()
        if self.root is None or not self.segments:
            return after
        mirrored = (
            pl.scan_parquet(self._files())
            .filter(pl.col("program_id") == program)
            .select("seq", "kind")
            .collect(engine=ENGINE)
        )
        return pl.concat([mirrored, after], how="vertical_relaxed")

    def unroutable(self, reader: duckdb.DuckDBPyConnection, programs: pl.DataFrame) -> pl.DataFrame:
        """The rc_unroutable rows, as `source.unroutable_rows` gives them."""
        after = stray_rows(reader, self.covered)
        if self.root is None or not self.segments:
            return unroutable_table(after, programs)
        stray = pl.col("program_id").is_null() | (
            (pl.col("kind") == "stripe") & (pl.col("source") == "backfill")
        )
        mirrored = pl.scan_parquet(self._files()).filter(stray).select(after.columns).collect(engine=ENGINE)
        return unroutable_table(pl.concat([mirrored, _utc(after)], how="diagonal_relaxed"), programs)

    def _files(self) -> list[Path]:
        assert self.root is not None
        return [self.root / segment.name for segment in self.segments]

    def register(self, con: duckdb.DuckDBPyConnection) -> None:
        """Inside the run's final transaction: the registry becomes exactly this chain."""
        if self.root is None:
            return
        con.execute(REGISTRY_DDL)
        con.execute(DIGEST_COLUMN)
        keep = [segment.name for segment in self.segments]
        con.execute("DELETE FROM rc_mirror WHERE NOT list_contains(?::VARCHAR[], segment)", [keep])
        for segment in self.written:
            con.execute(
                "INSERT INTO rc_mirror (segment, format, after_seq, upto_seq, rows, digest)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [segment.name, FORMAT, segment.after, segment.upto, segment.rows, segment.digest],
            )

    def prune(self) -> None:
        """After the run has committed: delete the files of the segments it retired (best
        effort: a file left behind is no longer registered, so the next full run deletes it)."""
        if self.root is None:
            return
        for segment in self.retired:
            with contextlib.suppress(OSError):
                (self.root / segment.name).unlink(missing_ok=True)

    def discard(self) -> None:
        """After a failed run: delete the segments it wrote (never registered)."""
        if self.root is None:
            return
        for segment in self.written:
            (self.root / segment.name).unlink(missing_ok=True)
