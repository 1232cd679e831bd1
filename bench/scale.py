"""bench/scale: start-up, memory and ingest of `tally serve` on big logs (issue #12).

For each size in `BENCH_SCALE_SIZES` (default 1M and 10M events):

1. generate the log with bench/rawgen.py once and cache it in `BENCH_DATA` (default bench/data/,
   git-ignored), keyed by size, seed and generator version;
2. prepare it once with the real `tally migrate` (schema migrations and the one-time key-index
   build of an upgrade), timed, and cache the result beside it;
3. copy the prepared database to a scratch file (a run never changes the cache), start
   `tally serve` on it with the scheduler's reconcile off, and measure start-up (spawn to the first
   200 from /healthz), the server's RSS after start, and its RSS after `BENCH_SCALE_LOAD_SECONDS`
   (default 60) of durable ingest (wrk, 1 thread, 32 connections, bench/sale.lua);
4. on the largest size, run bench/ingest's comparison side by side in the same run: the parse-only
   ceiling, tally on an empty log and tally on the big log, with wrk at 1 thread (the issue's
   setting) and at 2 threads (bench/ingest's), `BENCH_SCALE_ROUNDS` rounds (default 2): medians.

Targets (2 cores): start-up <= 5 s and RSS <= 1 GiB at 10M events; durable ingest >= 0.5x the
ceiling, p99 <= 25 ms, zero non-2xx on the big log as on an empty one.
Writes bench/out/scale.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import rawgen
from bench.harness import (
    ROOT,
    WrkResult,
    ceiling_server,
    rss_bytes,
    save,
    setup_program,
    table,
    tally_process,
    wrk,
)

SCRIPT = Path(__file__).with_name("sale.lua")
GENERATOR = "1"  # bump when bench/rawgen.py's output changes: cached logs are regenerated
SEED = 20_250_101
GIB = 1024**3


def _sizes() -> list[int]:
    return [int(s) for s in os.environ.get("BENCH_SCALE_SIZES", "1000000,10000000").split(",") if s]


def _data() -> Path:
    folder = Path(os.environ.get("BENCH_DATA", ROOT / "bench" / "data"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _files(db: Path) -> list[Path]:
    """The database and what lives beside it."""
    return [p for p in db.parent.glob(f"{db.name}*") if p.name == db.name or p.name[len(db.name)] == "."]


def _remove(db: Path) -> None:
    for path in _files(db):
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _copy(src: Path, dst: Path) -> None:
    _remove(dst)
    for path in _files(src):
        target = dst.with_name(dst.name + path.name[len(src.name) :])
        if path.is_dir():
            shutil.copytree(path, target)
        else:
            shutil.copyfile(path, target)


def generated(size: int) -> Path:
    """The cached generated log of `size` events (made now when missing)."""
    db = _data() / f"raw-{size}-{SEED}-g{GENERATOR}.duckdb"
    if db.exists():
        return db
    print(f"  generating {size:,} events (bench/rawgen.py)...", flush=True)
    started = time.perf_counter()
    log = rawgen.generate(size, seed=SEED)
    print(f"  generated in {time.perf_counter() - started:.1f} s; writing {db}...", flush=True)
    scratch = db.with_name(db.name + ".partial")
    _remove(scratch)
    rawgen.write_db(scratch, log)
    del log
    scratch.rename(db)
    print(
        f"  written ({db.stat().st_size / GIB:.2f} GiB) in {time.perf_counter() - started:.1f} s", flush=True
    )
    return db


def prepared(size: int) -> tuple[Path, dict[str, Any]]:
    """The cached log after `tally migrate` (timed the one time it runs), and that run's figures."""
    raw = generated(size)
    db = raw.with_name(raw.name.replace("raw-", "ready-"))
    facts = db.with_name(db.name + ".json")
    if db.exists() and facts.exists():
        return db, json.loads(facts.read_text())
    work = db.with_name(db.name + "-work")
    _copy(raw, work)
    print(f"  tally migrate on {size:,} events (schema migrations and the key index)...", flush=True)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "api.cli", "migrate", "--database", str(work)], cwd=ROOT, check=True
    )
    figures = {"migrate_s": round(time.perf_counter() - started, 1)}
    _copy(work, db)
    _remove(work)
    facts.write_text(json.dumps(figures))
    return db, figures


@contextmanager
def scratch_copy(source: Path | None) -> Iterator[Path]:
    """A scratch copy of `source` (or an empty database path), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="tally-scale-", dir=_data()))
    db = folder / "tally.duckdb"
    try:
        if source is not None:
            _copy(source, db)
        yield db
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _load(url: str, seconds: int, threads: int, label: str) -> WrkResult:
    _, key = setup_program(url)
    env = {"BENCH_API_KEY": key}
    wrk("warm-up", url, SCRIPT, 3, 32, threads, env={**env, "BENCH_RUN": f"w{time.time_ns()}"})
    return wrk(label, url, SCRIPT, seconds, 32, threads, env={**env, "BENCH_RUN": f"m{time.time_ns()}"})


def measure(size: int, load_seconds: int) -> dict[str, Any]:
    db, figures = prepared(size)
    with scratch_copy(db) as copy, tally_process(copy) as served:
        rss_start = rss_bytes(served.pid)
        load = _load(served.url, load_seconds, 1, f"{size:,} events, wrk -t1")
        rss_loaded = rss_bytes(served.pid)
    result = {
        "events": size,
        **figures,
        "startup_s": round(served.startup_s, 2),
        "rss_after_start_gib": round(rss_start / GIB, 3),
        "rss_after_load_gib": round(rss_loaded / GIB, 3),
        "load_seconds": load_seconds,
        "load": load,
    }
    print(
        f"  {size:,} events: start-up {served.startup_s:.2f} s, RSS {rss_start / GIB:.3f} GiB after start, "
        f"{rss_loaded / GIB:.3f} GiB after {load_seconds} s of ingest ({load.rps:.0f} req/s, "
        f"p99 {load.p99_ms:.1f} ms, {load.non_2xx} non-2xx)",
        flush=True,
    )
    return result


def ingest_side_by_side(size: int, seconds: int, rounds: int) -> dict[str, Any]:
    """Ceiling, tally on an empty log and tally on the `size` log, at wrk -t1 and -t2, alternating."""
    db, _ = prepared(size)
    runs: dict[str, list[WrkResult]] = {}
    for n in range(rounds):
        for threads in (1, 2):
            with ceiling_server() as url:
                wrk("warm-up", url, SCRIPT, 3, 32, threads)
                runs.setdefault(f"ceiling t{threads}", []).append(
                    wrk(f"ceiling t{threads} #{n + 1}", url, SCRIPT, seconds, 32, threads)
                )
            for name, source in (("empty log", None), (f"{size:,} events", db)):
                with scratch_copy(source) as copy, tally_process(copy) as served:
                    label = f"{name} t{threads}"
                    runs.setdefault(label, []).append(
                        _load(served.url, seconds, threads, f"{label} #{n + 1}")
                    )
    print(table([r for rs in runs.values() for r in rs]))
    summary: dict[str, Any] = {}
    for threads in (1, 2):
        ceiling = statistics.median(r.rps for r in runs[f"ceiling t{threads}"])
        for name in ("empty log", f"{size:,} events"):
            rs = runs[f"{name} t{threads}"]
            rps = statistics.median(r.rps for r in rs)
            summary[f"{name} t{threads}"] = {
                "rps_median": round(rps),
                "rps_range": [round(min(r.rps for r in rs)), round(max(r.rps for r in rs))],
                "p99_ms": [r.p99_ms for r in rs],
                "non_2xx": sum(r.non_2xx + r.socket_errors for r in rs),
                "ceiling_rps_median": round(ceiling),
                "ratio_vs_ceiling": round(rps / ceiling, 3),
            }
    return {"rounds": rounds, "seconds": seconds, "runs": runs, "summary": summary}


def main() -> dict[str, Any]:
    sizes = _sizes()
    load_seconds = int(os.environ.get("BENCH_SCALE_LOAD_SECONDS", "60"))
    results = [measure(size, load_seconds) for size in sizes]
    biggest = max(sizes)
    ingest = ingest_side_by_side(
        biggest, int(os.environ.get("BENCH_SECONDS", "15")), int(os.environ.get("BENCH_SCALE_ROUNDS", "2"))
    )
    top = next(r for r in results if r["events"] == biggest)
    big = ingest["summary"][f"{biggest:,} events t1"]
    verdict = {
        "target_startup_met": top["startup_s"] <= 5.0,
        "target_rss_met": max(top["rss_after_start_gib"], top["rss_after_load_gib"]) <= 1.0,
        "target_ingest_ratio_met": big["ratio_vs_ceiling"] >= 0.5,
        "target_ingest_p99_met": max(big["p99_ms"]) <= 25.0,
        "target_zero_non_2xx_met": big["non_2xx"] == 0 and all(r["load"].non_2xx == 0 for r in results),
    }
    for name, row in ingest["summary"].items():
        print(
            f"{name:<24} {row['rps_median']:>6} req/s (range {row['rps_range'][0]}-{row['rps_range'][1]}), "
            f"{row['ratio_vs_ceiling']:.3f}x ceiling {row['ceiling_rps_median']}, p99 {row['p99_ms']} ms, "
            f"{row['non_2xx']} non-2xx"
        )
    print(verdict)
    payload = {"sizes": results, "ingest": ingest, **verdict}
    save("scale", payload)
    return payload


if __name__ == "__main__":
    main()
