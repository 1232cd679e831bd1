"""bench/pgreconcile: the reconcile job on PostgreSQL beside the DuckDB default, same logs, same run.

For each size in `BENCH_PG_RECONCILE_SIZES` (default `1000000,10000000`):

1. generate the log (bench/rawgen.py, as bench/reconcile does: `size` events in a DuckDB file,
   1 % held back) and copy the same rows into a fresh PostgreSQL database (ADBC, binary COPY:
   `raw_events`, programs, partners, the log head at the last seq);
2. DuckDB: the first run on the file (it writes the log's column mirror), then a full run
   (`full=True`: what a settings change or an engineer action causes);
3. PostgreSQL: a replica with an empty working copy runs (it pulls the whole log below the
   watermark into its copy, reconciles, publishes every table in one transaction), then a full
   run with its copy warm (`full=True`: only the new rows pulled, none here; it reconciles
   everything again and publishes only the rows that differ from the published ones, which on
   the same log at the same `now` are none: its `publish` stage is the comparison; the first
   run's is a whole publish);
4. the held-back 1 % appended to both; a run on each: the PostgreSQL replica's is incremental
   (its copy pulls the new rows, publishes only the changes);
5. reconcile partitions (`BENCH_PG_PARTITIONS`, default 2; 1, or `BENCH_POSTGRES_URL` set, leaves
   this out), on a second
   database loaded with the same log: every partition's first run at once, a process each (what
   they cost sharing this machine's two cores), then each partition's first run one after the
   other, a fresh process each with an empty working copy (what one replica a partition costs);
   after the 1 % arrives there too, each partition's run again (incremental, sending changes).

Each run is a fresh process (`python -m bench.pgreconcile <step> ...`): wall, CPU, peak RSS
(VmHWM), and for PostgreSQL the time of each stage (pull, read, reconcile, write, publish).
Targets (2 cores): a PostgreSQL full run <= 2x the DuckDB default's (cold against cold, warm
against warm), peak RSS <= 6 GiB; the run after 1 % new events incremental. The database is
the tests' kind of cluster (tests/pg.py) with fsync on, or `BENCH_POSTGRES_URL` (a database
this bench may fill: it drops and recreates tally's tables there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import ROOT, save

GIB = 1024**3
TARGET_RATIO = 2.0
TARGET_RSS_GIB = 6.0


def _peak() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) * 1024 / GIB, 2)
    return 0.0


def step_load(db: str, url: str, tail: str | None = None) -> dict[str, Any]:
    """Copy the DuckDB file's log (or the parquet `tail`, appended after it) into PostgreSQL."""
    import adbc_driver_postgresql.dbapi as adbc
    import duckdb
    import polars as pl

    from bench import rawgen
    from ingest.storage.postgres.conn import conninfo

    started = time.perf_counter()
    rows = 0
    with adbc.connect(conninfo(url)) as pg, pg.cursor() as cur:
        if tail is None:
            con = duckdb.connect(db, read_only=True)
            for table in ("programs", "partners"):
                cur.adbc_ingest(table, con.sql(f"SELECT * FROM {table}").to_arrow_table(), mode="append")
            (high,) = con.sql("SELECT max(seq) FROM raw_events").fetchall()[0]
            for low in range(0, int(high), 500_000):
                batch = con.sql(
                    f"SELECT * FROM raw_events WHERE seq > {low} AND seq <= {low + 500_000}"
                ).to_arrow_table()
                cur.adbc_ingest("raw_events", batch, mode="append")
                rows += batch.num_rows
            con.close()
        else:
            cur.execute("SELECT seq FROM log_head")
            (high,) = cur.fetchone()
            events = pl.read_parquet(tail)
            events = events.with_columns(seq=pl.col("seq") - events.get_column("seq").min() + high + 1)
            for offset in range(0, events.height, 500_000):
                rendered = rawgen.render(events.slice(offset, 500_000))
                cur.adbc_ingest(
                    "raw_events", rendered.to_arrow(compat_level=pl.CompatLevel.oldest()), mode="append"
                )
                rows += min(500_000, events.height - offset)
        cur.execute("UPDATE log_head SET seq = (SELECT max(seq) FROM raw_events)")
        pg.commit()
    return {"rows": rows, "load_s": round(time.perf_counter() - started, 2)}


def step_pg_run(url: str, engine_dir: str, full: bool, part: int = 0, parts: int = 1) -> dict[str, Any]:
    """One run on a replica of `url` whose working copy is in `engine_dir` (of partition `part`
    of `parts`, when more than one)."""
    from bench import rawgen
    from ingest.storage.partitions import Scope
    from ingest.storage.postgres.store import PgStore
    from reconcile.run import job
    from reconcile.run.engine import open_engine

    stages: dict[str, float] = {}
    last = [time.perf_counter(), "pull"]

    def progress(stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        stages[str(last[1])] = stages.get(str(last[1]), 0.0) + now - float(last[0])
        last[:] = [now, stage]

    store = PgStore(
        url,
        memory_mb=int(os.environ.get("BENCH_ENGINE_MEMORY_MB", "512")),
        engine_dir=engine_dir,
        partitions=parts,
    )
    try:
        cpu, started = time.process_time(), time.perf_counter()
        with open_engine(store, Scope(part, parts) if parts > 1 else None) as engine:
            assert engine.publish is not None
            summary = job.run(engine.cursor, rawgen.NOW, progress, full=full, publish=engine.publish)
            published = engine.publish.mode
        wall = time.perf_counter() - started
        progress("done", 1, 1)
        cpu = time.process_time() - cpu
    finally:
        store.close()
    return {
        "mode": summary.mode,
        "published": published,
        "events": summary.events_read,
        "sales": summary.sales,
        "commissions": summary.commissions,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "stages_s": {k: round(v, 2) for k, v in stages.items() if k != "done"},
        "peak_rss_gib": _peak(),
    }


def _step_of(module: str, *args: str) -> dict[str, Any]:
    """A step in a fresh process (`python -m <module> <step> ...`): its JSON summary."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} {args[0]} failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _child(*args: str) -> dict[str, Any]:
    return _step_of("bench.pgreconcile", *args)


def _duck(*args: str) -> dict[str, Any]:
    return _step_of("bench.reconcile", *args)


def _partitions(url: str, engine: Path, parts: int, mode: str) -> dict[str, Any]:
    """With `mode` cold, every partition's run at once (a process each, empty copies), then each
    partition's one after the other (a fresh process each, empty copies again: what one replica
    a partition costs, the last to publish); otherwise each partition's run again."""
    out: dict[str, Any] = {}
    if mode == "cold":
        started = time.perf_counter()
        step = [sys.executable, "-m", "bench.pgreconcile", "pg-run", url, str(engine / "together"), mode]
        args = [[*step, str(p), str(parts)] for p in range(parts)]
        running = [subprocess.Popen(a, cwd=ROOT, stdout=subprocess.PIPE, text=True) for a in args]
        together = [json.loads(r.communicate()[0].strip().splitlines()[-1]) for r in running]
        out["together"] = together
        out["together_wall_s"] = round(time.perf_counter() - started, 2)
    alone = [
        _child("pg-run", url, str(engine / "alone"), mode, str(part), str(parts)) for part in range(parts)
    ]
    out["alone"] = alone
    out["slowest_alone_s"] = max(r["wall_s"] for r in alone)
    return out


def _database() -> tuple[str, Any]:
    """A fresh database: `BENCH_POSTGRES_URL`'s, or one of a durable cluster of the bench's own."""
    from ingest.storage import migrations
    from ingest.storage.sql import PgExecutor

    given = os.environ.get("BENCH_POSTGRES_URL")
    if given:
        import psycopg

        with psycopg.connect(given, autocommit=True) as con:
            con.execute(b"DROP SCHEMA public CASCADE")
            con.execute(b"CREATE SCHEMA public")
            migrations.apply(PgExecutor(con))
        return given, None
    from tests.pg import Cluster

    cluster = Cluster(durable=True)
    url = cluster.url(cluster.create_database())
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        migrations.apply(PgExecutor(con))
    return url, cluster


def measure(size: int, folder: Path) -> dict[str, Any]:
    db = folder / f"log-{size}.duckdb"
    generated = _duck("generate", str(db), str(size))
    url, cluster = _database()
    clusters = [cluster]
    try:
        loaded = _child("load", str(db), url)
        engine = folder / f"engine-{size}"
        duck_first = _duck("run", str(db))
        pg_first = _child("pg-run", url, str(engine), "cold")
        duck_full = _duck("run", str(db), "full")
        pg_full = _child("pg-run", url, str(engine), "full")
        # the partitions on a database of their own, so that neither side's runs publish over
        # the other's (each would then publish whole)
        # (not with BENCH_POSTGRES_URL: that one database is the bench's only one)
        parts = 1 if os.environ.get("BENCH_POSTGRES_URL") else int(os.environ.get("BENCH_PG_PARTITIONS", "2"))
        split_url, split_cluster = _database() if parts > 1 else ("", None)
        clusters.append(split_cluster)
        if parts > 1:
            _child("load", str(db), split_url)
        split = _partitions(split_url, engine / "parts", parts, "cold") if parts > 1 else None
        _duck("append", str(db))
        appended = _child("load", str(db), url, str(db.with_suffix(".tail.parquet")))
        duck_next = _duck("run", str(db))
        pg_next = _child("pg-run", url, str(engine), "next")
        if parts > 1:
            _child("load", str(db), split_url, str(db.with_suffix(".tail.parquet")))
        split_next = _partitions(split_url, engine / "parts", parts, "next") if parts > 1 else None
    finally:
        for each in clusters:
            if each is not None:
                each.close()
        for path in folder.glob(f"log-{size}*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        shutil.rmtree(folder / f"engine-{size}", ignore_errors=True)
    cold = pg_first["wall_s"] / duck_first["wall_s"]
    warm = pg_full["wall_s"] / duck_full["wall_s"]
    return {
        "size": size,
        "generated": generated,
        "loaded_into_postgres": loaded,
        "appended_1pct": appended,
        "duckdb": {"first": duck_first, "full": duck_full, "after_1pct": duck_next},
        "postgres": {"first_empty_copy": pg_first, "full_warm_copy": pg_full, "after_1pct": pg_next},
        "partitions": None if split is None else {"first_empty_copy": split, "after_1pct": split_next},
        "ratio_first": round(cold, 2),
        "ratio_full": round(warm, 2),
        "target_ratio_met": max(cold, warm) <= TARGET_RATIO,
        "target_rss_met": max(r["peak_rss_gib"] for r in (pg_first, pg_full, pg_next)) <= TARGET_RSS_GIB,
        "incremental_after_1pct": pg_next["mode"] == "incremental" and pg_next["published"] == "patch",
    }


def main() -> dict[str, object]:
    sizes = [int(s) for s in os.environ.get("BENCH_PG_RECONCILE_SIZES", "1000000,10000000").split(",") if s]
    base = Path(os.environ.get("BENCH_RECONCILE_DIR", tempfile.gettempdir()))
    folder = Path(tempfile.mkdtemp(prefix="tally-pgreconcile-", dir=base))
    results = []
    try:
        for size in sizes:
            result = measure(size, folder)
            results.append(result)
            d, p = result["duckdb"], result["postgres"]
            print(
                f"{size:>10} events: duckdb first {d['first']['wall_s']} s, full {d['full']['wall_s']} s,"
                f" +1% {d['after_1pct']['wall_s']} s | postgres first {p['first_empty_copy']['wall_s']} s"
                f" ({p['first_empty_copy']['stages_s']}), full {p['full_warm_copy']['wall_s']} s"
                f" ({p['full_warm_copy']['stages_s']}, {p['full_warm_copy']['published']}),"
                f" +1% {p['after_1pct']['wall_s']} s"
                f" ({p['after_1pct']['mode']}, {p['after_1pct']['published']})"
                f" | ratios {result['ratio_first']} / {result['ratio_full']},"
                f" peak {max(r['peak_rss_gib'] for r in p.values())} GiB",
                flush=True,
            )
            split = result["partitions"]
            if split is not None:
                first, later = split["first_empty_copy"], split["after_1pct"]
                print(
                    f"{'':>10} partitions: first, one at a time {[r['wall_s'] for r in first['alone']]} s"
                    f" (peak {[r['peak_rss_gib'] for r in first['alone']]} GiB), all at once"
                    f" {first['together_wall_s']} s; +1% {[r['wall_s'] for r in later['alone']]} s"
                    f" ({[r['mode'] for r in later['alone']]}, {[r['published'] for r in later['alone']]})",
                    flush=True,
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    payload: dict[str, object] = {"runs": results, "machine_load": list(os.getloadavg())}
    save("pgreconcile", payload)
    return payload


def _step(argv: list[str]) -> dict[str, Any]:
    name, *args = argv
    if name == "load":
        return step_load(args[0], args[1], args[2] if len(args) > 2 else None)
    if name == "pg-run":
        from reconcile import allocator

        allocator.tune()  # as the `tally` command does, before Polars is imported
        part, parts = (int(args[3]), int(args[4])) if len(args) > 4 else (0, 1)
        return step_pg_run(args[0], args[1], full=args[2] == "full", part=part, parts=parts)
    raise SystemExit(f"unknown step {name}")


if __name__ == "__main__":
    print(json.dumps(_step(sys.argv[1:])))
