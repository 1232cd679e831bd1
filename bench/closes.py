"""bench/closes: what period closes cost a full reconcile run (issue #48, round two's D4).

A close is a booking: the run after it books the closed month's lines into the log once
(reconcile/periods.py), and every later run reads them back instead of valuing the log before
each close again. The target: a full run of a log with 99 closes (the first
`BENCH_CLOSES_PROGRAMS` programs, default 9, close each month 2025-01..2025-11) within 10 % of
a full run of the same log without closes, side by side with the previous release in the same
bench run (which values the log before every close on every run).

Steps, for a log of `BENCH_CLOSES_EVENTS` events (default 27,000, the issue's log; bench/rawgen.py):

1. write four DuckDB files: this tree without closes, this tree with the closes and their
   bookings (made once here as the server makes them after a close: `pipeline.close_bookings`,
   timed), and the baseline with and without the closes (`BENCH_RECONCILE_BASELINE`, default
   the merge base with `main`, as bench/reconcile.py);
2. a first run on each (it writes the mirror and component store later runs read), then
   `BENCH_CLOSES_RUNS` (default 5) full runs of each, alternating sides, each in a fresh
   process with DuckDB's memory bounded as the server bounds it (bench/reconcile.py `step_run`).

Writes bench/out/closes.json and prints the medians with their spread and the ratios.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from bench import rawgen
from bench.harness import save
from bench.reconcile import _baseline, _child, _git

TARGET_RATIO = 1.10


def book(path: Path) -> dict[str, Any]:
    """Book every close of the log at `path` as the server does after a close (api/jobs.py
    `_book_closes`), appending the rows after the log; the rows and the seconds it took."""
    from ingest import actions
    from reconcile import periods, pipeline
    from reconcile.run import job

    con = duckdb.connect(str(path))
    try:
        started = time.perf_counter()
        raw, programs, partners = job.read(con)
        rows = actions.close_booking_rows(
            pipeline.close_bookings(raw, programs, partners, rawgen.NOW).to_dicts()
        )
        seconds = time.perf_counter() - started
        ((high,),) = con.execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchall()
        frame = pl.DataFrame(
            [
                {
                    **r,
                    "seq": int(high) + 1 + i,
                    "received_at": rawgen.NOW,
                    "occurred_at": rawgen.NOW,
                    "test_mode": False,
                }
                for i, r in enumerate(rows)
            ]
        )
        con.register("_booked", frame.to_arrow())
        con.execute("INSERT INTO raw_events BY NAME SELECT * FROM _booked")
        con.unregister("_booked")
        raw, _, _ = job.read(con)
        left = periods.unbooked(raw.lazy())
    finally:
        con.close()
    kinds = frame.get_column("kind").value_counts().rows()
    return {"rows": dict(kinds), "seconds": round(seconds, 2), "unbooked_after": list(left)}


def _median(samples: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [float(s["wall_s"]) for s in samples if "wall_s" in s]
    if not walls:
        return {"error": samples[0].get("error", "no run"), "samples": samples}
    return {
        "wall_s": statistics.median(walls),
        "spread_s": [min(walls), max(walls)],
        "cpu_s": statistics.median(float(s["cpu_s"]) for s in samples if "cpu_s" in s),
        "samples_s": walls,
    }


def main() -> dict[str, Any]:
    events = int(os.environ.get("BENCH_CLOSES_EVENTS", "27000"))
    closing = int(os.environ.get("BENCH_CLOSES_PROGRAMS", "9"))
    runs = int(os.environ.get("BENCH_CLOSES_RUNS", "5"))
    with tempfile.TemporaryDirectory(prefix="bench-closes-") as folder:
        work = Path(folder)
        baseline = _baseline(work)
        plain = rawgen.generate(events)
        closed = rawgen.generate(events, period_closes=closing)
        closes = closed.events.filter(pl.col("kind") == "period_close").height
        files: dict[str, tuple[Path, rawgen.Log]] = {
            "this, no closes": (work / "plain.duckdb", plain),
            "this, closes booked": (work / "booked.duckdb", closed),
        }
        if baseline is not None:
            files["baseline, no closes"] = (work / "plain-base.duckdb", plain)
            files["baseline, closes"] = (work / "closes-base.duckdb", closed)
        for path, log in files.values():
            rawgen.write_db(path, log)
        booked = book(files["this, closes booked"][0])
        trees = {name: (baseline[1] if name.startswith("baseline") and baseline else None) for name in files}
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in files}
        first: dict[str, dict[str, Any]] = {}
        for name, (path, _) in files.items():
            first[name] = _side(path, trees[name], full=False)
        for _ in range(runs):
            for name, (path, _) in files.items():
                samples[name].append(_side(path, trees[name], full=True))
    sides = {name: {"first": first[name], "full": _median(found)} for name, found in samples.items()}

    def wall(name: str) -> float | None:
        figures = sides.get(name, {}).get("full", {})
        value = figures.get("wall_s")
        return float(value) if value is not None else None

    ratios: dict[str, float | None] = {}
    with_closes, without = wall("this, closes booked"), wall("this, no closes")
    if with_closes and without:
        ratios["closes_over_none"] = round(with_closes / without, 3)
    before = wall("baseline, closes")
    if before and with_closes:
        ratios["baseline_closes_over_this"] = round(before / with_closes, 2)
    base_plain = wall("baseline, no closes")
    if base_plain and without:
        ratios["this_over_baseline_no_closes"] = round(without / base_plain, 3)
    result = {
        "events": closed.events.height,
        "period_closes": closes,
        "full_runs_per_side": runs,
        "baseline": baseline[0] if baseline else None,
        "git": _git(),
        "booking": booked,
        "sides": sides,
        "ratios": ratios,
        "target": {"closes_over_none_at_most": TARGET_RATIO},
        "met": ratios.get("closes_over_none", 99.0) <= TARGET_RATIO,
    }
    save("closes", result)
    print(
        f"bench/closes: {result['events']} events, {closes} closes; booking them once: {booked['seconds']} s"
    )
    for name, figures in sides.items():
        full = figures["full"]
        print(f"  {name:22} full run median {full.get('wall_s')} s (spread {full.get('spread_s')})")
    print(
        f"  ratios: {ratios} (target closes/none <= {TARGET_RATIO}: {'met' if result['met'] else 'NOT met'})"
    )
    return result


def _side(path: Path, tree: Path | None, *, full: bool) -> dict[str, Any]:
    args = ["run", str(path), *(["full"] if full else [])]
    return _child(*args) if tree is None else _child(*args, tree=tree)


if __name__ == "__main__":
    main()
