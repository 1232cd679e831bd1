"""bench/reconcile: the full reconcile job on a realistic raw log of 1M and 10M events, beside the
pure-Python reference implementation.

For each size in `BENCH_RECONCILE_SIZES` (default `1000000,10000000`):

1. generate the log (bench/rawgen.py) with 1 % more events than the size and write the first
   `size` of them (arrival order) to a fresh DuckDB file with the schema of ingest/storage/schema.py;
2. in a fresh subprocess, open the file and time `reconcile.run.job.run(con, now)`: wall clock, CPU
   time, the time and resident memory of every step the job reports through `on_progress`
   (read / mirror / each reconcile chunk / write), and the peak RSS of that process (VmHWM), so
   sizes never share a peak. This first run also writes the log's column mirror
   (reconcile/run/mirror.py), which every later full run reads instead of DuckDB's copy;
3. time `BENCH_RECONCILE_FULL_RUNS` (default 3) more full runs (`full=True`, what a change of
   program settings or an engineer action causes), each in a fresh subprocess: the one with the
   median wall time is the figure held to the target (the machine's speed varies from run to
   run; every sample is kept in the JSON, with its wall and CPU time);
4. append the held-back 1 % (the newest events) and time a third run in a fresh subprocess.

The reference (tests/reconcile/reference.py, `reconcile_reference`) runs on
`BENCH_RECONCILE_REFERENCE_SIZES` events (default `25000,100000`) of the same generator: it
looks leads up by scanning every lead for every sale, so its cost grows with the square of the
log and 1M events would take hours. Its throughput at the largest of those sizes is taken as its
throughput at 1M (linear extrapolation, which flatters it). The same frames (read back through
`job.read` from a DuckDB file) also go through `reconcile.pipeline.reconcile`, and the two
results are compared table by table.

Targets (2 cores): 10M events in <= 20 s wall with peak RSS <= 6 GiB; >= 20x the reference's
throughput; a run after 1 % new events well under a full run. `BENCH_RECONCILE_DIR` puts the
database files somewhere else than the system temp dir (the 10M one takes about 6 GB); a step is
stopped should the machine's available memory fall under `BENCH_RECONCILE_MIN_FREE_MIB` (1024).
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

TARGET_WALL_S = 20.0
TARGET_RSS_GIB = 6.0
TARGET_RATIO = 20.0
GIB = 1024**3
HELD_BACK = 0.01

INCREMENTAL_NOTE = (
    "incremental by affected customers (reconcile/run/incremental.py, reconcile/run/closure.py): the run "
    "after "
    "1 % new events builds on the previous run's high water seq. The new rows seed a closure over every "
    "non-click row linked to them through any shared value (click id, customer key, normalised email, "
    "processor customer, subscription, transaction/invoice/payment intent/session/charge/object/event "
    "ids), found by 64-bit value hashes (a collision only widens it); only that closure, the clicks it "
    "reaches and the engineer actions are reconciled, and only those components' rows are deleted and "
    "re-inserted in the rc_* tables, in one transaction with the run record; commission statuses of all "
    "other rows are brought up to `now` in place (pending -> approved). It falls back to a full run when "
    "the engine version, program settings or partners changed, an engineer action (metadata fix, "
    "backfill, period close) arrived, or there is no usable previous run; months closed before the "
    "previous run do not prevent it (their snapshots are per component too). "
    "Its cost is dominated by one read of the link columns of the whole log; "
    "tests/reconcile/test_incremental.py proves it gives exactly a full run's tables."
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


def step_generate(db: Path, size: int) -> dict[str, Any]:
    import duckdb
    import polars as pl

    from bench import rawgen

    started = time.perf_counter()
    log = rawgen.generate(size + round(size * HELD_BACK))
    generated = time.perf_counter() - started
    head = rawgen.Log(log.events.head(size), log.programs, log.partners)
    log.events.slice(size).write_parquet(_tail(db))
    started = time.perf_counter()
    rawgen.write_db(db, head)
    written = time.perf_counter() - started
    mix = head.events.group_by("kind", "outcome").len().sort("len", descending=True)
    return {
        "events": head.events.height,
        "held_back": log.events.height - size,
        "generate_s": round(generated, 2),
        "write_db_s": round(written, 2),
        "db_mib": round(db.stat().st_size / 2**20),
        "mix": {f"{k}/{o}": n for k, o, n in mix.iter_rows()},
        "programs": log.programs.height,
        "partners": log.partners.height,
        "body_bytes_mean": round(
            float(log.events.head(100_000).pipe(rawgen.render)["body"].str.len_bytes().mean() or 0)
        ),
        "peak_rss_gib": round(_peak_rss() / GIB, 2),
        "polars": pl.__version__,
        "duckdb": duckdb.__version__,
    }


def _tail(db: Path) -> Path:
    return db.with_suffix(".tail.parquet")


def step_append(db: Path) -> dict[str, Any]:
    import duckdb
    import polars as pl

    from bench import rawgen

    tail = pl.read_parquet(_tail(db))
    con = duckdb.connect(str(db))
    try:
        high = con.sql("SELECT max(seq) FROM raw_events").fetchall()[0][0]
        started = time.perf_counter()
        rawgen.append(con, tail.with_columns(seq=pl.col("seq") - tail.get_column("seq").min() + high + 1))
        appended = time.perf_counter() - started
    finally:
        con.close()
    return {"appended": tail.height, "append_s": round(appended, 2)}


def step_run(db: Path, *, full: bool = False) -> dict[str, Any]:
    import duckdb

    from bench import rawgen
    from reconcile.run import job

    marks: list[tuple[str, int, int, float]] = []
    resident: list[float] = []  # RSS (GiB) at each progress report: growth from chunk to chunk

    def progress(stage: str, done: int, total: int) -> None:
        marks.append((stage, done, total, time.perf_counter()))
        resident.append(round((_status("VmRSS") or 0) / GIB, 2))

    con = duckdb.connect(str(db))
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


def _child(*args: str) -> dict[str, Any]:
    """Run one step in a fresh interpreter; its last stdout line is the JSON result.

    The machine is shared: should its available memory fall under `BENCH_RECONCILE_MIN_FREE_MIB`
    (default 1024) while the step runs, the step is stopped and reported as such."""
    floor = int(os.environ.get("BENCH_RECONCILE_MIN_FREE_MIB", "1024")) * 2**20
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.reconcile", *args], cwd=ROOT, stdout=out, stderr=err
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


def _mirror_mib(db: Path) -> int:
    folder = Path(f"{db}.mirror")
    return round(sum(p.stat().st_size for p in folder.iterdir()) / 2**20) if folder.is_dir() else 0


def _sizes(name: str, default: str) -> list[int]:
    return [int(x) for x in os.environ.get(name, default).replace("_", "").split(",") if x.strip()]


def _git() -> dict[str, object]:
    def out(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    return {  # BENCH_GIT_COMMIT names the commit of a tree exported without .git
        "commit": out("rev-parse", "HEAD") or os.environ.get("BENCH_GIT_COMMIT", ""),
        "reconcile_dirty": bool(out("status", "--porcelain", "reconcile")),
    }


def _verdict(runs: list[dict[str, Any]], references: list[dict[str, Any]]) -> dict[str, Any]:
    full = {r["size"]: r["full"] for r in runs if "wall_s" in r["full"]}
    verdict: dict[str, Any] = {}
    big = max((s for s in full if s >= 10_000_000), default=None)
    if big is not None:
        verdict["wall_s_at_10m"] = full[big]["wall_s"]
        first = next(r["first_full"] for r in runs if r["size"] == big)
        verdict["first_run_wall_s_at_10m"] = first.get("wall_s")
        verdict["first_run_peak_rss_gib_at_10m"] = first.get("peak_rss_gib")
        verdict["target_wall_met"] = full[big]["wall_s"] <= TARGET_WALL_S
        verdict["peak_rss_gib_at_10m"] = full[big]["peak_rss_gib"]
        verdict["target_rss_met"] = full[big]["peak_rss_gib"] <= TARGET_RSS_GIB
    reference = max(
        (r for r in references if "reference_events_per_s" in r), key=lambda r: r["events"], default=None
    )
    at = min((s for s in full if s >= 1_000_000), default=max(full, default=None))
    if reference is not None and at is not None:
        ratio = full[at]["events_per_s"] / reference["reference_events_per_s"]
        verdict["throughput_ratio"] = round(ratio, 1)
        verdict["throughput_ratio_basis"] = (
            f"job.run on {at} events from DuckDB vs the reference on {reference['events']} events of the "
            f"same generator, extrapolated linearly to {at} (the reference is superlinear: this flatters it)"
        )
        verdict["target_ratio_met"] = ratio >= TARGET_RATIO
        verdict["pipeline_vs_reference_same_input"] = round(
            reference["pipeline_events_per_s"] / reference["reference_events_per_s"], 1
        )
    increments = {
        r["size"]: r["after_1pct"]["wall_s"] / r["full"]["wall_s"]
        for r in runs
        if "wall_s" in r["after_1pct"] and r["size"] in full
    }
    verdict["incremental_ratio"] = {str(s): round(x, 2) for s, x in increments.items()}
    verdict["after_1pct_mode"] = {str(r["size"]): r["after_1pct"].get("mode") for r in runs}
    verdict["incremental"] = INCREMENTAL_NOTE
    return verdict


def _table(runs: list[dict[str, Any]], references: list[dict[str, Any]]) -> str:
    lines = [
        f"{'events':>11}{'gen s':>7}{'db s':>7}{'db MiB':>8}{'1st s':>8}{'run s':>8}"
        f"{'read':>7}{'recon':>7}{'write':>7}"
        f"{'cpu s':>8}{'RSS GiB':>9}{'events/s':>11}{'+1% s':>8}{'ratio':>7}"
    ]
    for r in runs:
        g, f, a, first = (
            r["generate"],
            r["full"],
            r["after_1pct"],
            r["first_full"].get("wall_s", float("nan")),
        )
        if "wall_s" not in f:
            lines.append(f"{r['size']:>11}  failed: {f.get('error')} {f.get('stderr', '')[-300:]}")
            continue
        st, nan = f["stages_s"], float("nan")
        plus = (
            f"{a['wall_s']:>8.2f}{a['wall_s'] / f['wall_s']:>7.2f}" if "wall_s" in a else f"{'-':>8}{'-':>7}"
        )
        lines.append(
            f"{f['events']:>11}{g['generate_s']:>7.1f}{g['write_db_s']:>7.1f}{g['db_mib']:>8}{first:>8.2f}"
            f"{f['wall_s']:>8.2f}"
            f"{st.get('read', nan):>7.2f}{st.get('reconcile', nan):>7.2f}{st.get('write', nan):>7.2f}"
            f"{f['cpu_s']:>8.2f}"
            f"{f['peak_rss_gib']:>9.2f}{f['events_per_s']:>11}{plus}"
        )
        samples = [f"{x['wall_s']:.2f} s / {x['cpu_s']:.1f} CPU-s" for x in r["full_runs"] if "wall_s" in x]
        lines.append(f"{'':>11}  full runs (median above): {', '.join(samples)}")
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


def main() -> dict[str, object]:
    sizes = _sizes("BENCH_RECONCILE_SIZES", "1000000,10000000")
    reference_sizes = _sizes("BENCH_RECONCILE_REFERENCE_SIZES", "25000,100000")
    workdir = Path(
        tempfile.mkdtemp(prefix="tally-bench-reconcile-", dir=os.environ.get("BENCH_RECONCILE_DIR"))
    )
    load_start = _load()
    runs: list[dict[str, Any]] = []
    try:
        for size in sizes:
            db = workdir / f"raw_{size}.duckdb"
            print(f"  {size} events: generate + write", flush=True)
            run: dict[str, Any] = {"size": size, "generate": _child("generate", str(db), str(size))}
            print("  first full run (writes the column mirror)", flush=True)
            run["first_full"] = _child("run", str(db))
            run["first_full"]["mirror_mib"] = _mirror_mib(db)
            repeats = max(1, int(os.environ.get("BENCH_RECONCILE_FULL_RUNS", "3")))
            print(f"  full run x {repeats}", flush=True)
            run["full_runs"] = [_child("run", str(db), "full") for _ in range(repeats)]
            run["full"] = _median_run(run["full_runs"])
            run["append"] = _child("append", str(db))
            print("  run after 1 % new events", flush=True)
            run["after_1pct"] = _child("run", str(db))
            runs.append(run)
            for path in (db, _tail(db), db.with_suffix(".duckdb.wal")):
                path.unlink(missing_ok=True)
            shutil.rmtree(f"{db}.mirror", ignore_errors=True)
        references = []
        for size in reference_sizes:
            print(f"  reference and pipeline on {size} events", flush=True)
            references.append(_child("reference", str(size)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(_table(runs, references))
    verdict = _verdict(runs, references)
    print(json.dumps(verdict, indent=2))
    result: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "git": _git(),
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
        return step_generate(Path(args[0]), int(args[1]))
    if name == "append":
        return step_append(Path(args[0]))
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
