"""A SIGKILL while the reconciler works leaves the last published results readable and the next
run correct, on both backends.

A generated log (bench/rawgen.py: clicks, leads, checkout sessions, invoices, refunds,
self-hosted sales, double counts, metadata fixes, backfills) is reconciled in part; then, kill
after kill, more of it arrives and a run in a process of its own (tests/reconcile_process.py,
opening the store as the server does) is killed with SIGKILL at a pause point (ingest/pause.py):
in the middle of a full run (its first chunk in the staging tables), inside a run's final
transaction (full and incremental), while a full run writes the column mirror (embedded),
inside a replica's publishing transaction (PostgreSQL, full and incremental), and while a
replica's working copy pulls the log (its first pull into an empty copy, which the next run
resumes after the windows it committed, and a later one), while a run rebuilds the
component store (its format changed), a batch in the rebuild's own tables, and while a run adds
rows to the row store (reconcile/run/rowstore.py: an incremental run's new rows, and a file made
anew because it was lost), rows in the file the database does not trust yet.
Small chunks, mirror segments, pull windows and row store batches make the small log take
several of each.

After each kill the published tables (what the API reads, through the store's reader) are
exactly the last published run's: on PostgreSQL a replica killed after its publish committed
but before its working copy did leaves the new run published, whole. The next run (a process of
its own again, in the same engine directory) then publishes exactly what reconciling the whole
log gives (reconcile/pipeline.py on the log as the store holds it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import duckdb
import polars as pl
import pytest

from bench import rawgen
from ingest.pause import PAUSE_ENV
from ingest.storage.factory import open_store
from ingest.storage.partitions import part_of
from ingest.storage.postgres.conn import conninfo
from reconcile.pipeline import reconcile
from reconcile.run import components, rowstore
from reconcile.run.engine import books
from tests.conftest import ROOT
from tests.pg import Server
from tests.processes import wait_until
from tests.reconcile.apps import SCHEMAS, Tables, assert_same, published

pytestmark = pytest.mark.slow

EVENTS = 4_000
FIRST = 1_600  # reconciled before the first kill; the rest arrives in slices, one before each kill
NOW = rawgen.NOW.isoformat()
SMALL = (  # so that the small log takes several chunks, mirror segments and pull windows
    "reconcile.run.job.CHUNK_EVENTS=700",
    "reconcile.run.mirror.MIN_ROWS=200",
    "reconcile.run.mirror.SEGMENT_ROWS=400",
    "ingest.storage.postgres.source.PULL_WINDOW=600",
    "ingest.storage.postgres.copy.COMMIT_ROWS=600",
    "reconcile.run.components.BUILD_SEQS=500",
    "reconcile.run.rowstore.BATCH_SEQS=500",
    "reconcile.run.rowstore.SHARE=1",  # every closure of the small log read from the row store
)


@dataclass(frozen=True)
class Kill:
    point: str
    full: bool = True  # the killed run: full, or incremental where it can be
    fresh_copy: bool = False  # PostgreSQL: the killed run's working copy is empty (its first pull)
    rebuild: bool = False  # the killed run rebuilds the component store (its format changed)
    remake_rows: bool = False  # the killed run makes the row store anew (its file was lost)


KILLS = {
    "duckdb": [
        Kill("reconcile.chunk"),
        Kill("mirror.segment"),
        Kill("reconcile.commit"),
        Kill("reconcile.commit", full=False),
        Kill("components.batch", rebuild=True),
        Kill("rows.batch", full=False),
        Kill("rows.batch", remake_rows=True),
    ],
    "postgresql": [
        Kill("reconcile.chunk"),
        Kill("reconcile.commit"),
        Kill("reconcile.commit", full=False),
        Kill("publish.commit"),
        Kill("publish.commit", full=False),
        Kill("pull.window", full=False),
        Kill("pull.window", fresh_copy=True),
        Kill("components.batch", rebuild=True),
        Kill("rows.batch", full=False),
    ],
}


def _append(database: str, events: pl.DataFrame) -> None:
    """Raw rows appended as ingest would have (rendered bodies; on PostgreSQL the log head moved
    past them)."""
    if not database.startswith("postgresql://"):
        con = duckdb.connect(database)
        try:
            rawgen.append(con, events)
        finally:
            con.close()
        return
    with adbc.connect(conninfo(database)) as pg, pg.cursor() as cur:
        rendered = rawgen.render(events)
        cur.adbc_ingest("raw_events", rendered.to_arrow(compat_level=pl.CompatLevel.oldest()), mode="append")
        cur.execute("UPDATE log_head SET seq = (SELECT max(seq) FROM raw_events)")
        pg.commit()


def _database(backend: str, tmp_path: Path, pg_server: Server | None, log: rawgen.Log) -> str:
    """A database holding the log's first FIRST rows and its control plane."""
    head = rawgen.Log(log.events.head(FIRST), log.programs, log.partners)
    if backend == "duckdb":
        path = tmp_path / "tally.duckdb"
        rawgen.write_db(path, head)
        return str(path)
    assert pg_server is not None
    database = pg_server.fresh_database()
    with adbc.connect(conninfo(database)) as pg, pg.cursor() as cur:
        for table, frame in (("programs", log.programs), ("partners", log.partners)):
            cur.adbc_ingest(table, frame.to_arrow(compat_level=pl.CompatLevel.oldest()), mode="append")
        pg.commit()
    _append(database, head.events)
    return database


def _run(
    database: str,
    engine: Path,
    *,
    full: bool = False,
    pause: tuple[str, Path] | None = None,
    part: tuple[int, int] | None = None,
) -> subprocess.Popen[bytes]:
    env = {**os.environ}
    env.pop(PAUSE_ENV, None)
    if pause is not None:
        env[PAUSE_ENV] = f"{pause[0]}:{pause[1]}"
    scope = [] if part is None else [f"part={part[0]}/{part[1]}"]
    argv = [database, str(engine), NOW, *(["full"] if full else []), *scope, *SMALL]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reconcile_process", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()[-3000:]
    summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return summary


def _published(database: str, engine: Path) -> Tables:
    store = open_store(database, engine_dir=str(engine))
    try:
        with store.reader() as db:
            return published(db)
    finally:
        store.close()


def _reconciled(database: str, engine: Path) -> Tables:
    """The tables reconciling the whole log (as the store holds it) gives, as `published`
    returns them."""
    store = open_store(database, engine_dir=str(engine))
    try:
        with store.reader() as db:
            raw, programs, partners = books(db, None, None)
    finally:
        store.close()
    result = reconcile(raw, programs, partners, rawgen.NOW).sorted()
    out = {name: getattr(result, attribute) for name, (attribute, _) in SCHEMAS.items()}
    out["rc_explain"] = result.explain.sort("program_id", "sale_id", "step")
    return out


def _kill_at(
    database: str, engine: Path, point: str, marker: Path, *, full: bool, part: tuple[int, int] | None = None
) -> None:
    marker.unlink(missing_ok=True)
    process = _run(database, engine, full=full, pause=(point, marker), part=part)
    try:
        wait_until(lambda: marker.exists() or process.poll() is not None, f"the run to reach {point}", 300)
        assert process.poll() is None, process.communicate()[1].decode()[-3000:]
        assert int(marker.read_text()) == process.pid
    finally:
        process.kill()
        process.communicate(timeout=30)


def _engine_file(database: str, engine: Path) -> str:
    """The DuckDB file the reconciler runs in: the embedded database, or a replica's working copy."""
    return str(engine / "reconcile.duckdb") if database.startswith("postgresql://") else database


def _store_format(database: str, engine: Path, change: str | None = None) -> str:
    """The component store's format (reconcile/run/components.py), first set to `change` if given
    (another format: the next run rebuilds the store)."""
    with duckdb.connect(_engine_file(database, engine)) as con:
        if change is not None:
            con.execute("UPDATE rc_link_state SET format = ?", [change])
        return str(con.execute("SELECT format FROM rc_link_state").fetchall()[0][0])


def _rows_trusted(database: str, engine: Path) -> int:
    """The seq up to which the database trusts its row store (reconcile/run/rowstore.py)."""
    with duckdb.connect(_engine_file(database, engine), read_only=True) as con:
        ((upto,),) = con.execute("SELECT upto_seq FROM rc_row_state").fetchall()
    return int(upto)


def _leftovers(database: str, engine: Path) -> list[str]:
    """Tables a run keeps only while it runs (named `<table>__rcr_<run id>`)."""
    with duckdb.connect(_engine_file(database, engine), read_only=True) as con:
        names = con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    return [str(name) for (name,) in names if "__rcr_" in str(name)]


def _same_as(left: Tables, right: Tables) -> bool:
    try:
        assert_same(left, right)
    except AssertionError:
        return False
    return True


def test_sigkill_while_reconciling_leaves_the_last_results_and_the_next_run_correct(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """For each kill in turn: new rows arrive, a run is killed at the point, the published tables
    are still the last run's, and the next run publishes the whole log's books."""
    pg_server = request.getfixturevalue("pg_server") if backend == "postgresql" else None
    log = rawgen.generate(EVENTS)
    database = _database(backend, tmp_path, pg_server, log)
    engine = tmp_path / "engine-0"
    assert _finish(_run(database, engine))["high_water_seq"] == FIRST
    last = _published(database, engine)
    assert last["rc_sales"].height > 100
    kills = KILLS[backend]
    step = (EVENTS - FIRST) // len(kills)
    for n, kill in enumerate(kills):
        upto = EVENTS if n == len(kills) - 1 else FIRST + step * (n + 1)
        _append(database, log.events.slice(FIRST + step * n, upto - FIRST - step * n))
        if kill.fresh_copy:
            engine = tmp_path / f"engine-{n + 1}"
        if kill.rebuild:
            _store_format(database, engine, "another")
        if kill.remake_rows:
            Path(f"{_engine_file(database, engine)}{rowstore.SUFFIX}").unlink()
        _kill_at(database, engine, kill.point, tmp_path / "paused", full=kill.full)
        if kill.fresh_copy:  # a first pull commits as it goes: the next run resumes after that
            with duckdb.connect(str(engine / "reconcile.duckdb"), read_only=True) as copy:
                assert 0 < copy.execute("SELECT pulled_seq FROM engine_state").fetchall()[0][0] < upto
        expected = _reconciled(database, tmp_path / "engine-check")
        after_kill = _published(database, engine)
        if backend == "postgresql" and kill.point == "reconcile.commit":
            # published (committed on PostgreSQL) before the working copy committed: the new run, whole
            assert _same_as(after_kill, last) or _same_as(after_kill, expected), kill
        else:
            assert_same(after_kill, last)
        summary = _finish(_run(database, engine))
        assert summary["high_water_seq"] == upto, (kill, summary)
        last = _published(database, engine)
        assert_same(last, expected)
        if kill.rebuild:  # rebuilt whole by the next run, the killed run's tables dropped
            assert _store_format(database, engine) == components.FORMAT
            assert not _leftovers(database, engine), kill
        if kill.point == "rows.batch":  # the row store trusted up to the log's end
            assert _rows_trusted(database, engine) == upto, kill


def _of_partition(tables: Tables, part: int) -> Tables:
    """The rows of `tables` that partition `part` of two publishes (the unroutable list: the first's)."""
    out = {}
    for name, frame in tables.items():
        if name == "rc_unroutable":
            out[name] = frame if part == 0 else frame.clear()
        else:
            mine = [p for p in frame.get_column("program_id").unique().to_list() if part_of(p, 2) == part]
            out[name] = frame.filter(pl.col("program_id").is_in(mine))
    return out


PARTITION_KILLS = [
    Kill("publish.commit"),
    Kill("publish.commit", full=False),
    Kill("reconcile.chunk"),
    Kill("pull.window", full=False),
]


def test_sigkill_of_one_partitions_run_leaves_its_rows_and_its_next_run_correct(
    pg_server: Server, tmp_path: Path
) -> None:
    """Two reconcile partitions (ingest/storage/partitions.py), each run in a process of its own:
    for each kill in turn, new rows arrive, one partition's run is killed at the point, and its
    programs' published rows are still its last run's; the other partition's run then
    completes, and the killed one's next run leaves the whole log's books published."""
    log = rawgen.generate(EVENTS)
    database = _database("postgresql", tmp_path, pg_server, log)
    engine = tmp_path / "engine"
    for part in (0, 1):
        _finish(_run(database, engine, part=(part, 2)))
    last = _published(database, engine)
    assert_same(last, _reconciled(database, tmp_path / "engine-check"))
    assert all(_of_partition(last, part)["rc_sales"].height for part in (0, 1))
    step = (EVENTS - FIRST) // len(PARTITION_KILLS)
    for n, kill in enumerate(PARTITION_KILLS):
        victim = n % 2
        upto = EVENTS if n == len(PARTITION_KILLS) - 1 else FIRST + step * (n + 1)
        _append(database, log.events.slice(FIRST + step * n, upto - FIRST - step * n))
        _kill_at(database, engine, kill.point, tmp_path / "paused", full=kill.full, part=(victim, 2))
        assert_same(_of_partition(_published(database, engine), victim), _of_partition(last, victim))
        assert _finish(_run(database, engine, part=(1 - victim, 2)))["high_water_seq"] <= upto
        assert _finish(_run(database, engine, part=(victim, 2)))["high_water_seq"] <= upto
        last = _published(database, engine)
        assert_same(last, _reconciled(database, tmp_path / "engine-check"))
