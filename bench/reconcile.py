"""bench/reconcile: the full reconcile job on a realistic raw log of 1M and 10M events (30M on
request), side by side with the previous release in the same bench run, and beside the
pure-Python reference implementation.

For each size in `BENCH_RECONCILE_SIZES` (default `1000000,10000000`; add `30000000` for the
30M log, about 30 minutes more on a quiet 2-core machine, README "Benchmarks"):

1. generate the log (bench/rawgen.py) with 1 % + `BENCH_RECONCILE_NEW_EVENTS` (default 1,000)
   more events than the size and write the first `size` of them (arrival order) to a fresh
   DuckDB file with the schema of ingest/storage/schema.py. Logs above `ONE_DRAW` (10M) events
   are drawn as shards of `SHARD_EVENTS` (5M) and merged (`rawgen.write_sharded`: the generator
   holds about 1.3 KB an event at its peak, so 30M at once would not fit the machine);
2. copy the file for the baseline: the previous release (`BENCH_RECONCILE_BASELINE`, a git
   ref, default the commit this branch forked from `main` at; `none` skips it), exported with
   `git archive` into a temporary folder and run from there with the same interpreter, at the
   sizes in `BENCH_RECONCILE_BASELINE_SIZES` (default: those up to 10M). Each side has its own
   copy of the log (a run writes its tables, mirror and indexes into the database);
3. in a fresh subprocess per run, alternating the two sides (baseline, this tree, baseline...),
   time `reconcile.run.job.run(con, now)` on a connection whose DuckDB memory is bounded as the
   server bounds it (`BENCH_RECONCILE_MEMORY_MB`, default the server's `database_memory_mb`,
   512; without a bound DuckDB keeps every block a run writes, up to 80 % of the machine's
   memory, which the server never does): wall clock, CPU time, the time and resident memory
   of every step the job reports through `on_progress`, and the peak RSS of that process
   (VmHWM), so runs never share a peak: the first run (it also writes what later runs read
   instead of DuckDB's copy of the log), then `BENCH_RECONCILE_FULL_RUNS` (default 3) full runs
   (`full=True`, what a change of program settings or an engineer action causes): the one with
   the median wall time is the figure held to the target (every sample is kept in the JSON, and
   the table prints the spread);
4. append the first `BENCH_RECONCILE_NEW_EVENTS` held-back events to both copies and time a run
   on each, then the held-back 1 % and time another.

The reference (tests/reconcile/reference.py, `reconcile_reference`) runs on
`BENCH_RECONCILE_REFERENCE_SIZES` events (default `25000,100000`) of the same generator: it
looks leads up by scanning every lead for every sale, so its cost grows with the square of the
log and 1M events would take hours. Its throughput at the largest of those sizes is taken as its
throughput at 1M (linear extrapolation, which flatters it). The same frames (read back through
`job.read` from a DuckDB file) also go through `reconcile.pipeline.reconcile`, and the two
results are compared table by table.

Targets (2 cores, issue #31): at 10M events a full run <= 15 s wall, the first run <= 25 s,
the run after 1 % new events <= 0.10 of a full run, the run after 1,000 new events <= 1 s, peak
RSS <= 2 GiB and the same at 30M; >= 20x the reference's throughput. `BENCH_RECONCILE_DIR` puts
the database files somewhere else than the system temp dir (the 10M one takes about 6 GB, and
each side has one); a step is stopped should the machine's available memory fall under
`BENCH_RECONCILE_MIN_FREE_MIB` (1024).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import ROOT, save
from reconcile import allocator

TARGET_WALL_S = 15.0
TARGET_FIRST_S = 25.0
TARGET_RSS_GIB = 2.0
TARGET_RATIO = 20.0
TARGET_INCREMENT_SHARE = 0.10  # the run after 1 % new events, as a share of a full run
TARGET_NEW_EVENTS_S = 1.0  # the run after BENCH_RECONCILE_NEW_EVENTS (1,000) new events
GIB = 1024**3
HELD_BACK = 0.01
ONE_DRAW = 10_000_000  # logs of up to this many events are drawn at once (about 13 GiB at 10M)
SHARD_EVENTS = 5_000_000  # larger ones in shards of at most this many (rawgen.write_sharded)

INCREMENTAL_NOTE = (
    "incremental by affected customers (reconcile/run/incremental.py, reconcile/run/closure.py, "
    "reconcile/run/components.py): the run after new events builds on the previous run's high water seq. "
    "Every run (full or incremental) keeps a component store up to date in the database: each routed row's "
    "component (rows linked, directly or not, through any shared value: click id, customer key, normalised "
    "email, processor customer, subscription, transaction/invoice/payment intent/session/charge/object/event "
    "ids, by 64-bit value hashes; a collision only merges components) and each value's, joined by union-find "
    "as rows arrive. The new rows' values are looked up in the store, the components they join merged, and "
    "only those components' rows (read by seq), clicks included, and the engineer actions are reconciled; "
    "only those components' rows are deleted and re-inserted in the rc_* tables, in one transaction with the "
    "run record and the store's changes; commission statuses of all other rows are brought up to `now` in "
    "place (pending -> approved). It falls back to a full run when the engine version, program settings or "
    "partners changed, an engineer action (metadata fix, backfill, period close) arrived, the store must be "
    "rebuilt, or there is no usable previous run. No read of the log's link columns: the store's lookups are "
    "scans of two integer columns. The touched components' rows are read by seq from the row store "
    "(reconcile/run/rowstore.py, SQLite beside the database, filled by the first run) when they are at most "
    "half a percent of the log, by a scan of it otherwise; tests/reconcile/test_incremental.py, "
    "test_components.py and test_rowstore.py prove it gives exactly a full run's tables."
)


# --- measurements, each run by `python -m bench.reconcile <step> ...` in its own process -------


def _status(field: str) -> int | None:
    """A memory figure of this process from /proc/self/status (VmHWM, VmRSS), in bytes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _peak_rss() -> int:
    """Peak resident set size of this process, in bytes."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def step_generate(db: Path, size: int, new_events: int) -> dict[str, Any]:
    import duckdb
    import polars as pl

    from bench import rawgen
    from bench.rawbodies import render

    held_back = round(size * HELD_BACK) + new_events
    started = time.perf_counter()
    if size <= ONE_DRAW:
        log = rawgen.generate(size + held_back)
        generated = time.perf_counter() - started
        head = rawgen.Log(log.events.head(size), log.programs, log.partners)
        log.events.slice(size).write_parquet(_tail(db))
        started = time.perf_counter()
        rawgen.write_db(db, head)
        sample = log.events.head(100_000)
        del log, head
    else:
        sample = rawgen.write_sharded(db, _tail(db), size, held_back, SHARD_EVENTS).events
        generated = time.perf_counter() - started  # generating and writing, shard by shard
    written = 0.0 if size > ONE_DRAW else time.perf_counter() - started
    con = duckdb.connect(str(db), read_only=True)
    try:
        events, programs, partners = con.execute(
            "SELECT (SELECT count(*) FROM raw_events), (SELECT count(*) FROM programs),"
            " (SELECT count(*) FROM partners)"
        ).fetchall()[0]
        mix = con.execute(
            "SELECT kind, outcome, count(*) AS n FROM raw_events GROUP BY ALL ORDER BY n DESC"
        ).fetchall()
        largest = con.execute(
            "SELECT count(*) AS n FROM raw_events GROUP BY program_id ORDER BY n DESC LIMIT 1"
        ).fetchall()[0][0]
    finally:
        con.close()
    return {
        "events": int(events),
        "held_back": held_back,
        "sharded": size > ONE_DRAW,
        "generate_s": round(generated, 2),
        "write_db_s": round(written, 2),
        "db_mib": round(db.stat().st_size / 2**20),
        "mix": {f"{k}/{o}": int(n) for k, o, n in mix},
        "largest_program_events": int(largest),
        "programs": int(programs),
        "partners": int(partners),
        "body_bytes_mean": round(float(render(sample)["body"].str.len_bytes().mean() or 0)),  # type: ignore[arg-type]
        "peak_rss_gib": round(_peak_rss() / GIB, 2),
        "polars": pl.__version__,
        "duckdb": duckdb.__version__,
    }


def _tail(db: Path) -> Path:
    return db.with_suffix(".tail.parquet")


def _appended(db: Path) -> Path:
    return db.with_suffix(".tail.appended")


def step_append(db: Path, count: int | None = None) -> dict[str, Any]:
    """Append the next `count` held-back events (all that are left when None) to `db`; how many
    were appended is kept beside it, so that the next call takes up after them."""
    import duckdb
    import polars as pl

    from bench import rawgen

    taken = int(_appended(db).read_text()) if _appended(db).exists() else 0
    tail = pl.read_parquet(_tail(db)).slice(taken, count)
    con = duckdb.connect(str(db))
    try:
        high = con.sql("SELECT max(seq) FROM raw_events").fetchall()[0][0]
        started = time.perf_counter()
        if tail.height:
            rawgen.append(con, tail.with_columns(seq=pl.col("seq") - tail.get_column("seq").min() + high + 1))
        appended = time.perf_counter() - started
    finally:
        con.close()
    _appended(db).write_text(str(taken + tail.height))
    return {"appended": tail.height, "append_s": round(appended, 2)}


def _memory_mb() -> int:
    """DuckDB's memory bound for the runs measured: the server's (api/settings.py
    `database_memory_mb`) unless `BENCH_RECONCILE_MEMORY_MB` says otherwise."""
    from api.settings import Settings

    default = Settings.model_fields["database_memory_mb"].default
    return int(os.environ.get("BENCH_RECONCILE_MEMORY_MB") or default)


def step_run(db: Path, *, full: bool = False) -> dict[str, Any]:
    import duckdb

    from bench import rawgen
    from reconcile.run import job

    marks: list[tuple[str, int, int, float]] = []
    resident: list[float] = []  # RSS (GiB) at each progress report: growth from chunk to chunk

    def progress(stage: str, done: int, total: int) -> None:
        marks.append((stage, done, total, time.perf_counter()))
        resident.append(round((_status("VmRSS") or 0) / GIB, 2))

    con = duckdb.connect(str(db), config={"memory_limit": f"{_memory_mb()}MB"})  # as bench/bounded.py
    load = _load()
    try:
        cpu = time.process_time()
        started = time.perf_counter()
        summary = job.run(con, rawgen.NOW, progress, full=full)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        con.close()
    # Time from each progress report to the next (the step it announced), and summed by stage.
    steps = [
        (stage, done, total, following - at)
        for (stage, done, total, at), (*_, following) in itertools.pairwise(
            [*marks, ("", 0, 0, started + wall)]
        )
    ]
    stages: dict[str, float] = {}
    for stage, _, _, seconds in steps:
        stages[stage] = stages.get(stage, 0.0) + seconds
    return {
        "mode": summary.mode,
        "events": summary.events_read,
        "sales": summary.sales,
        "commissions": summary.commissions,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "stages_s": {stage: round(seconds, 2) for stage, seconds in stages.items() if stage != "done"},
        "steps_s": [[stage, done, total, round(seconds, 2)] for stage, done, total, seconds in steps],
        "rss_gib_at_steps": resident,
        "events_per_s": round(summary.high_water_seq / wall),
        "peak_rss_gib": round(_peak_rss() / GIB, 2),
        "duckdb_memory_mb": _memory_mb(),
        "load_avg_before": load,
        "load_avg_after": _load(),
    }


def step_reference(size: int) -> dict[str, Any]:
    import duckdb
    from polars.testing import assert_frame_equal

    from bench import rawgen
    from reconcile.pipeline import reconcile
    from reconcile.run import job
    from tests.reconcile.compare import TABLES, reference_frames

    with tempfile.TemporaryDirectory(prefix="tally-bench-ref-") as tmp:
        db = Path(tmp) / "ref.duckdb"
        rawgen.write_db(db, rawgen.generate(size))
        con = duckdb.connect(str(db))
        try:
            raw, programs, partners = job.read(con)
        finally:
            con.close()
    load = _load()
    started = time.perf_counter()
    real = reconcile(raw, programs, partners, rawgen.NOW)
    pipeline_s = time.perf_counter() - started
    started = time.perf_counter()
    expected = reference_frames(raw, programs, partners, rawgen.NOW)
    reference_s = time.perf_counter() - started
    mismatches = []
    ordered = real.sorted()
    for name in TABLES:
        try:
            assert_frame_equal(getattr(ordered, name), expected[name], check_exact=True)
        except AssertionError as exc:
            mismatches.append(f"{name}: {str(exc).splitlines()[0]}")
    return {
        "events": raw.height,
        "sales": real.sales.height,
        "reference_s": round(reference_s, 2),
        "reference_events_per_s": round(raw.height / reference_s),
        "pipeline_s": round(pipeline_s, 3),
        "pipeline_events_per_s": round(raw.height / pipeline_s),
        "agree": not mismatches,
        "mismatches": mismatches,
        "load_avg_before": load,
        "load_avg_after": _load(),
    }


# --- the bench ---------------------------------------------------------------------------------


def _available() -> int:
    """MemAvailable of the machine, in bytes (a large number where /proc is missing)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _child(*args: str, tree: Path = ROOT) -> dict[str, Any]:
    """Run one step in a fresh interpreter, with the code of `tree` (this one, or the baseline's
    export); its last stdout line is the JSON result.

    The machine is shared: should its available memory fall under `BENCH_RECONCILE_MIN_FREE_MIB`
    (default 1024) while the step runs, the step is stopped and reported as such."""
    floor = int(os.environ.get("BENCH_RECONCILE_MIN_FREE_MIB", "1024")) * 2**20
    env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_RECONCILE_MEMORY_MB": str(_memory_mb())}
    bounded = ROOT / "bench" / "bounded.py"
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, str(bounded), str(tree), *args], cwd=tree, env=env, stdout=out, stderr=err
        )
        stopped = None
        while proc.poll() is None:
            time.sleep(0.25)
            if _available() < floor and proc.poll() is None:
                stopped = round(_available() / 2**20)
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if stopped is not None:
        return {
            "error": f"stopped: machine memory available fell to {stopped} MiB",
            "stderr": stderr[-2_000:],
        }
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr": stderr[-2_000:]}
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def _median_run(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The sample with the median wall time (the lower middle one of an even count); a failed
    sample when every one failed."""
    done = sorted((s for s in samples if "wall_s" in s), key=lambda s: float(s["wall_s"]))
    return done[(len(done) - 1) // 2] if done else samples[0]


def _derived_mib(db: Path) -> int:
    """What a side keeps beside the database file: its mirror, indexes (files and folders
    named `<database>.<something>`, but the bench's own tail files)."""
    total = 0
    for path in db.parent.glob(f"{db.name}.*"):
        if path.is_dir():
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        elif not path.name.endswith((".wal", ".tail.parquet", ".tail.appended")):
            total += path.stat().st_size
    return round(total / 2**20)


def _sizes(name: str, default: str) -> list[int]:
    return [int(x) for x in os.environ.get(name, default).replace("_", "").split(",") if x.strip()]


def _out(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False).stdout.strip()


def _git() -> dict[str, object]:
    return {  # BENCH_GIT_COMMIT names the commit of a tree exported without .git
        "commit": _out("rev-parse", "HEAD") or os.environ.get("BENCH_GIT_COMMIT", ""),
        "reconcile_dirty": bool(_out("status", "--porcelain", "reconcile")),
    }


def _baseline(workdir: Path) -> tuple[str, Path] | None:
    """The previous release's code (`BENCH_RECONCILE_BASELINE`, default the merge base of this
    tree and `main`), exported into `workdir`: (commit, folder). None when it is `none`, or
    when it is this tree's own commit with nothing changed in reconcile/."""
    ref = os.environ.get("BENCH_RECONCILE_BASELINE") or _out("merge-base", "HEAD", "main")
    if not ref or ref == "none":
        return None
    commit = _out("rev-parse", "--verify", f"{ref}^{{commit}}")
    if not commit:
        raise SystemExit(f"bench/reconcile: no commit {ref!r} for the baseline")
    if commit == _out("rev-parse", "HEAD") and not _git()["reconcile_dirty"]:
        return None
    tree = workdir / f"baseline-{commit[:12]}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    found = subprocess.run(
        [sys.executable, "-c", "import reconcile; print(reconcile.__file__)"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not found.startswith(str(tree)):
        raise SystemExit(f"bench/reconcile: the baseline imports {found}, not its own tree")
    return commit, tree


def _spread(samples: list[dict[str, Any]], field: str = "wall_s") -> list[float]:
    values = sorted(float(s[field]) for s in samples if field in s)
    return [values[0], values[-1]] if values else []


def _summary(side: dict[str, Any]) -> dict[str, Any]:
    """The issue's figures for one side of one size."""
    full, first = side["full"], side["first_full"]
    if "wall_s" not in full:
        return {"error": full.get("error")}
    out: dict[str, Any] = {
        "full_wall_s": full["wall_s"],
        "full_cpu_s": full["cpu_s"],
        "full_wall_spread_s": _spread(side["full_runs"]),
        "full_cpu_spread_s": _spread(side["full_runs"], "cpu_s"),
        "full_peak_rss_gib": max(s.get("peak_rss_gib", 0) for s in side["full_runs"]),
        "first_wall_s": first.get("wall_s"),
        "first_peak_rss_gib": first.get("peak_rss_gib"),
    }
    for name in ("after_new_events", "after_1pct"):
        run = side[name]
        if "wall_s" in run:
            out[f"{name}_wall_s"] = run["wall_s"]
            out[f"{name}_share_of_full"] = round(run["wall_s"] / full["wall_s"], 3)
            out[f"{name}_mode"] = run.get("mode")
            out[f"{name}_peak_rss_gib"] = run.get("peak_rss_gib")
    return out


def _verdict(runs: list[dict[str, Any]], references: list[dict[str, Any]]) -> dict[str, Any]:
    verdict: dict[str, Any] = {
        "figures": {str(r["size"]): {n: _summary(side) for n, side in r["sides"].items()} for r in runs}
    }
    this = {r["size"]: verdict["figures"][str(r["size"])]["this"] for r in runs}
    ok = {s: f for s, f in this.items() if "full_wall_s" in f}
    big = max((s for s in ok if s >= 10_000_000), default=None)
    if big is not None:
        f = ok[big]
        verdict["at"] = big
        verdict["target_full_met"] = f["full_wall_s"] <= TARGET_WALL_S
        verdict["target_first_met"] = (f["first_wall_s"] or 1e9) <= TARGET_FIRST_S
        verdict["target_1pct_met"] = f.get("after_1pct_share_of_full", 1e9) <= TARGET_INCREMENT_SHARE
        verdict["target_new_events_met"] = f.get("after_new_events_wall_s", 1e9) <= TARGET_NEW_EVENTS_S
        verdict["target_rss_met"] = all(
            max(x["full_peak_rss_gib"], x["first_peak_rss_gib"] or 0) <= TARGET_RSS_GIB for x in ok.values()
        )
    verdict["peak_rss_gib_by_size"] = {
        str(s): max(f["full_peak_rss_gib"], f["first_peak_rss_gib"] or 0) for s, f in ok.items()
    }
    verdict["after_new_events_wall_s_by_size"] = {
        str(s): f.get("after_new_events_wall_s") for s, f in ok.items()
    }
    reference = max(
        (r for r in references if "reference_events_per_s" in r), key=lambda r: r["events"], default=None
    )
    at = min((s for s in ok if s >= 1_000_000), default=max(ok, default=None))
    if reference is not None and at is not None:
        full = next(r["sides"]["this"]["full"] for r in runs if r["size"] == at)
        ratio = full["events_per_s"] / reference["reference_events_per_s"]
        verdict["throughput_ratio"] = round(ratio, 1)
        verdict["throughput_ratio_basis"] = (
            f"job.run on {at} events from DuckDB vs the reference on {reference['events']} events of the "
            f"same generator, extrapolated linearly to {at} (the reference is superlinear: this flatters it)"
        )
        verdict["target_ratio_met"] = ratio >= TARGET_RATIO
        verdict["pipeline_vs_reference_same_input"] = round(
            reference["pipeline_events_per_s"] / reference["reference_events_per_s"], 1
        )
    verdict["incremental"] = INCREMENTAL_NOTE
    return verdict


def _cell(figures: dict[str, Any], name: str) -> str:
    f = figures
    if "full_wall_s" not in f:
        return f"failed: {f.get('error')}"[:40]
    if name == "full":
        lo, hi = f["full_wall_spread_s"]
        return f"{f['full_wall_s']:.2f} s ({lo:.2f}-{hi:.2f}), {f['full_cpu_s']:.1f} CPU-s"
    if name == "first":
        return f"{f['first_wall_s']:.2f} s" if f["first_wall_s"] is not None else "-"
    if name in ("after_1pct", "after_new_events"):
        if f"{name}_wall_s" not in f:
            return "-"
        return f"{f[f'{name}_wall_s']:.2f} s ({f[f'{name}_share_of_full']:.2f} of full, {f[f'{name}_mode']})"
    return f"{f['full_peak_rss_gib']:.2f} GiB (first {f['first_peak_rss_gib']:.2f})"


def _table(runs: list[dict[str, Any]], references: list[dict[str, Any]], new_events: int) -> str:
    rows = (
        ("full run (median, range)", "full"),
        ("first run", "first"),
        ("run after 1 % new events", "after_1pct"),
        (f"run after {new_events:,} new events", "after_new_events"),
        ("peak RSS, full run", "rss"),
    )
    lines = []
    for r in runs:
        g = r["generate"]
        made = g.get("generate_s", 0) + g.get("write_db_s", 0)
        lines.append(
            f"{r['size']:,} events (generated and written in {made:.0f} s,"
            f" database {g.get('db_mib')} MiB, largest program {g.get('largest_program_events')} events)"
        )
        figures = {n: _summary(side) for n, side in r["sides"].items()}
        names = [n for n in ("baseline", "this") if n in figures]
        lines.append(f"  {'':<34}" + "".join(f"{n:<50}" for n in names))
        for label, name in rows:
            lines.append(f"  {label:<34}" + "".join(f"{_cell(figures[n], name):<50}" for n in names))
    for ref in references:
        if "reference_s" not in ref:
            lines.append(f"reference failed: {ref.get('error')} {ref.get('stderr', '')[-300:]}")
            continue
        lines.append(
            f"reference on {ref['events']} events: {ref['reference_s']:.1f} s"
            f" ({ref['reference_events_per_s']} events/s); pipeline on the same frames"
            f" {ref['pipeline_s']:.2f} s ({ref['pipeline_events_per_s']} events/s);"
            f" agree: {ref['agree']}"
        )
    return "\n".join(lines)


def _measure(size: int, workdir: Path, baseline: tuple[str, Path] | None, new_events: int) -> dict[str, Any]:
    """Every run of one size, both sides alternating (see the module docstring)."""
    db = workdir / f"raw_{size}.duckdb"
    print(f"  {size} events: generate + write", flush=True)
    run: dict[str, Any] = {"size": size, "generate": _child("generate", str(db), str(size), str(new_events))}
    sides: dict[str, tuple[Path, Path]] = {}
    wanted = _sizes("BENCH_RECONCILE_BASELINE_SIZES", "") or [s for s in [size] if s <= 10_000_000]
    if baseline is not None and size in wanted:
        copy = workdir / f"raw_{size}_baseline.duckdb"
        shutil.copyfile(db, copy)
        shutil.copyfile(_tail(db), _tail(copy))
        sides["baseline"] = (baseline[1], copy)
    sides["this"] = (ROOT, db)
    results: dict[str, dict[str, Any]] = {name: {"full_runs": []} for name in sides}
    print(f"  first run ({', '.join(sides)})", flush=True)
    for name, (tree, path) in sides.items():
        results[name]["first_full"] = _child("run", str(path), tree=tree)
        results[name]["first_full"]["derived_mib"] = _derived_mib(path)
    repeats = max(1, int(os.environ.get("BENCH_RECONCILE_FULL_RUNS", "3")))
    print(f"  full run x {repeats}", flush=True)
    for _ in range(repeats):
        for name, (tree, path) in sides.items():
            results[name]["full_runs"].append(_child("run", str(path), "full", tree=tree))
    for name in sides:
        results[name]["full"] = _median_run(results[name]["full_runs"])
    for label, count in (("after_new_events", str(new_events)), ("after_1pct", "rest")):
        print(f"  run after {'1 %' if count == 'rest' else count} new events", flush=True)
        for name, (tree, path) in sides.items():
            results[name][f"append_{label}"] = _child("append", str(path), count)
            results[name][label] = _child("run", str(path), tree=tree)
    run["sides"] = results
    for _, path in sides.values():
        for file in (path, _tail(path), _appended(path), path.with_suffix(".duckdb.wal")):
            file.unlink(missing_ok=True)
        for extra in path.parent.glob(f"{path.name}.*"):
            shutil.rmtree(extra, ignore_errors=True) if extra.is_dir() else extra.unlink(missing_ok=True)
    return run


def main() -> dict[str, object]:
    sizes = _sizes("BENCH_RECONCILE_SIZES", "1000000,10000000")
    reference_sizes = _sizes("BENCH_RECONCILE_REFERENCE_SIZES", "25000,100000")
    new_events = int(os.environ.get("BENCH_RECONCILE_NEW_EVENTS", "1000"))
    workdir = Path(
        tempfile.mkdtemp(prefix="tally-bench-reconcile-", dir=os.environ.get("BENCH_RECONCILE_DIR"))
    )
    load_start = _load()
    runs: list[dict[str, Any]] = []
    try:
        baseline = _baseline(workdir)
        print(f"  baseline: {baseline[0] if baseline else 'none'}", flush=True)
        for size in sizes:
            runs.append(_measure(size, workdir, baseline, new_events))
        references = []
        for size in reference_sizes:
            print(f"  reference and pipeline on {size} events", flush=True)
            references.append(_child("reference", str(size)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(_table(runs, references, new_events))
    verdict = _verdict(runs, references)
    print(json.dumps({k: v for k, v in verdict.items() if k not in ("figures", "incremental")}, indent=2))
    result: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "git": _git(),
        "baseline": baseline[0] if baseline else None,
        "new_events": new_events,
        "load_avg_start": load_start,
        "load_avg_end": _load(),
        "runs": runs,
        "reference": references,
        **verdict,
    }
    save("reconcile", result)
    return result


def _step(argv: list[str]) -> dict[str, Any]:
    name, *args = argv
    if name == "generate":
        new_events = (
            int(args[2]) if len(args) > 2 else int(os.environ.get("BENCH_RECONCILE_NEW_EVENTS", "1000"))
        )
        return step_generate(Path(args[0]), int(args[1]), new_events)
    if name == "append":
        return step_append(Path(args[0]), int(args[1]) if len(args) > 1 and args[1] != "rest" else None)
    if name == "run":
        allocator.tune()  # as the `tally` command does, before Polars is imported
        return step_run(Path(args[0]), full=args[1:] == ["full"])
    if name == "reference":
        return step_reference(int(args[0]))
    raise SystemExit(f"unknown step {name!r}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(_step(sys.argv[1:])))
    else:
        main()
