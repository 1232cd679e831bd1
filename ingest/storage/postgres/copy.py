"""The working copy of a shared log, on this machine: what a PostgreSQL replica reconciles in.

The reconciler runs on DuckDB (reconcile/run/job.py): its chunked reads, its column mirror and
its incremental runs are DuckDB's. On the embedded backend the database is that engine. A
replica of a shared database keeps a DuckDB file of its own instead (`WorkingCopy`, in
`TALLY_ENGINE_DIR`, by default a temporary directory of the process): a copy of the log's rows,
derived and disposable, which every run first brings up to the source's watermark (`LogSource`:
the rows after the last one copied, a window of sequence numbers at a time, as Arrow; the
control plane whole). The reconciler then runs on the copy exactly as on an embedded database
and publishes through the store's `ResultSink` (reconcile/run/engine.py).

A pull commits as it goes (every `COMMIT_ROWS` rows, with the position it reached): one
interrupted by a crash or a kill resumes after the rows it committed. A working copy of another
database (or of one restored to an earlier point) is thrown away and rebuilt from the start.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ingest.pause import pause
from ingest.storage import lockfile, migrations, private
from ingest.storage.contract import LogSource
from ingest.storage.partitions import Scope
from ingest.storage.schema import CONTROL_PLANE_DDL, raw_events_ddl
from ingest.storage.sql import unordered_inserts

log = logging.getLogger("tally.reconcile")

STATE_DDL = "CREATE TABLE IF NOT EXISTS engine_state (identity VARCHAR NOT NULL, pulled_seq BIGINT NOT NULL)"
# A pull commits every this many rows: an interrupted pull (a first one of a large log takes
# minutes) resumes after what it committed instead of starting again.
COMMIT_ROWS = 2_000_000


def _state(con: duckdb.DuckDBPyConnection, identity: str, pulled: int) -> None:
    """Inside a pull's transaction: the copy holds every row of log `identity` up to `pulled`."""
    con.execute("DELETE FROM engine_state")
    con.execute("INSERT INTO engine_state VALUES (?, ?)", [identity, pulled])


class IncompleteCopy(Exception):
    """Raised by `WorkingCopy.pull` when the log source gave fewer rows than its watermark says
    exist below it."""


class EngineInUse(Exception):
    """Another process works in the same engine directory (each replica needs its own)."""


class WorkingCopy:
    """The working copy (see the module docstring) in `directory`."""

    def __init__(self, directory: str | None, memory_mb: int = 512, scope: Scope | None = None) -> None:
        self._scratch = directory is None
        self.scope = scope  # the reconcile partition whose rows the copy holds (None: the whole log)
        private.restrict_umask()  # DuckDB creates the copy's files (and its WAL, again and again)
        self.directory = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="tally-engine-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        private.make_private(self.directory)  # a folder made by hand, or an older release's files
        self.path = self.directory / "reconcile.duckdb"
        self._memory_mb = memory_mb
        self._lock_fd = self._claim()
        self._con: duckdb.DuckDBPyConnection | None = None

    def _claim(self) -> int:
        try:
            return lockfile.hold(self.directory / "engine.lock")
        except lockfile.Held as held:
            raise EngineInUse(
                f"the reconcile working copy in {self.directory} is in use by process {held.holder};"
                " give each replica its own TALLY_ENGINE_DIR"
            ) from None

    def _open(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            con = duckdb.connect(str(self.path), config={"memory_limit": f"{self._memory_mb}MB"})
            con.execute("SET GLOBAL TimeZone = 'UTC'")
            migrations.apply(con)
            con.execute(STATE_DDL)
            self._con = con
        return self._con

    def _wipe(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        for path in (self.path, Path(f"{self.path}.wal")):
            path.unlink(missing_ok=True)
        shutil.rmtree(f"{self.path}.mirror", ignore_errors=True)
        for suffix in (".rows", ".rows-wal", ".rows-shm"):  # the row store (reconcile/run/rowstore.py)
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def pull(self, source: LogSource) -> tuple[int, int]:
        """Bring the copy up to the source's watermark; (rows copied, watermark)."""
        identity = source.identity()
        if self.scope is not None:  # a copy of another partition is another copy
            identity = f"{identity} partition {self.scope.label}"
        watermark = source.watermark()
        con = self._open()
        state = con.execute("SELECT identity, pulled_seq FROM engine_state").fetchone()
        if state is not None and (state[0] != identity or int(state[1]) > watermark):
            log.warning("the reconcile working copy is of another log (or one ahead of it); rebuilding it")
            self._wipe()
            con = self._open()
            state = None
        pulled = int(state[1]) if state else 0
        # The rows are stored in any order, so DuckDB writes each batch on every thread: a first
        # pull of 1M events 6.6 to 7.1 -> 5.5 to 5.8 s on 2 cores (alternating runs), with the
        # same reconciled tables (docs/scaling.md).
        with unordered_inserts(con):
            copied = self._copy(con, source, identity, pulled, watermark, self.scope)
        return copied, watermark

    @staticmethod
    def _copy(
        con: duckdb.DuckDBPyConnection,
        source: LogSource,
        identity: str,
        pulled: int,
        watermark: int,
        scope: Scope | None,
    ) -> int:
        """The rows after `pulled` up to `watermark` (of partition `scope`), committed (with the
        copy's state) every `COMMIT_ROWS` rows, so that a pull interrupted (a crash, a kill)
        resumes after the last rows it committed; then the control plane and the final state, in
        the last transaction. The number of rows copied."""
        copied = done = 0  # rows inserted; rows committed
        # A partition's rows have gaps between their seqs: how many there are is asked instead.
        total = watermark - pulled if scope is None else source.count(pulled, watermark, scope)
        con.execute("BEGIN TRANSACTION")
        # Sequence numbers are handed out without gaps (ingest/storage/postgres/tx.py): a copy
        # short of rows would reconcile a log with holes, so it is refused (the run fails,
        # results stay; what was committed is a prefix of the log without holes, checked).
        try:
            for batch in source.raw(pulled, watermark, scope=scope):
                con.register("_engine_pull", batch)
                try:
                    con.execute("INSERT INTO raw_events BY NAME SELECT * FROM _engine_pull")
                finally:
                    con.unregister("_engine_pull")
                copied += batch.num_rows
                if done * 2 < total <= copied * 2:  # the crash tests stop here (ingest/pause.py)
                    pause("pull.window")
                if batch.num_rows and copied - done >= COMMIT_ROWS:
                    last = batch.column("seq")[batch.num_rows - 1].as_py()
                    expected = last - pulled if scope is None else source.count(pulled, last, scope)
                    if copied != expected:
                        raise IncompleteCopy(
                            f"the log gave {copied} rows for seqs {pulled + 1}..{last}; the working"
                            " copy keeps what it had and this run stops"
                        )
                    _state(con, identity, last)
                    con.execute("COMMIT")
                    con.execute("BEGIN TRANSACTION")
                    done = copied
            if copied != total:
                raise IncompleteCopy(
                    f"the log gave {copied} rows for seqs {pulled + 1}..{watermark}; the working copy"
                    " keeps what it had and this run stops"
                )
            programs, partners = source.control()
            for name, table in (("programs", programs), ("partners", partners)):
                con.execute(f"DELETE FROM {name}")
                con.register("_engine_control", table)
                try:
                    con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _engine_control")
                finally:
                    con.unregister("_engine_control")
            _state(con, identity, watermark)
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        return copied

    @contextmanager
    def cursor(self, source: LogSource) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor on the copy, brought up to the watermark, for one run (or preview)."""
        self.pull(source)
        cur = self._open().cursor()
        try:
            yield cur
        finally:
            cur.close()

    def release(self) -> None:
        """Close the copy's database (its memory goes back); the next use opens it again."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def close(self) -> None:
        self.release()
        os.close(self._lock_fd)
        if self._scratch:
            shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def log_copy(
    source: LogSource, program_id: str | None, before_seq: int | None, later_kinds: Sequence[str]
) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB database of the source's raw rows (of one program, before a seq; after
    it, the rows of `later_kinds`) and its control plane: what the books as of a period close are
    read from on a replica of a shared log."""
    upto = source.watermark() if before_seq is None else min(before_seq - 1, source.watermark())
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(raw_events_ddl())
        for ddl in CONTROL_PLANE_DDL:
            con.execute(ddl)
        later = (
            source.raw(upto, source.watermark(), program_id, later_kinds)
            if before_seq and later_kinds
            else iter(())
        )
        for batch in itertools.chain(source.raw(0, upto, program_id), later):
            con.register("_log", batch)
            con.execute("INSERT INTO raw_events BY NAME SELECT * FROM _log")
            con.unregister("_log")
        for name, table in zip(("programs", "partners"), source.control(), strict=True):
            con.register("_control", table)
            con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _control")
            con.unregister("_control")
        yield con
