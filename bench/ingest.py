"""bench/ingest: durable `POST /api/v1/track/sale` beside its ceilings, in the same run.

Sides, each a fresh server on the same uvicorn, under wrk (`BENCH_THREADS`, default 1 thread;
32 connections; `BENCH_SECONDS`, default 15, after a 3-second warm-up), `BENCH_ROUNDS` rounds
(default 3) with the sides' order alternating, medians kept with every sample:

- `ceiling`: the framework ceiling, a Starlette endpoint that only parses the JSON body;
- `bare`: the interpreter's limit, a bare ASGI callable that decodes and validates the same body
  with msgspec (bench/ceiling.py);
- `tally`: durable track sales on an empty log; with `BENCH_INGEST_EVENTS` (e.g. 10000000) also
  `tally (N events)`, on a copy of bench/scale's generated and migrated log of that size.

Reported per side: req/s, p50 and p99, non-2xx, the server's CPU microseconds per request (all
its threads, from /proc) and, for tally, that CPU by thread (the event loop, the writer, the
copier, the log writer; names from py-spy). Then a further window of `BENCH_GIL_SECONDS` (5; 0
leaves it out) under wrk with py-spy sampling which thread holds the interpreter lock: the lock's
microseconds a request, in all and by thread, and `gil_bound_rps`, the most one lock can serve
(`1e6 / us`), as a ratio of the ceiling too. A server cannot go past that bound, however its
work is spread over threads; how close it comes is how well its threads take turns. Targets
(2 cores): tally >= 0.5x the ceiling, p99 <= 15 ms, zero non-2xx, on the big log as on an empty
one.

`observability()` (`python -m bench observability`): the same load with access lines and metrics
on (`TALLY_LOG_LEVEL=INFO`, text lines to a file) and off (`bench/unobserved.py`,
`TALLY_LOG_LEVEL=WARNING`), in alternating pairs in one run; medians and spread. Target: on within
10 % of off.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.harness import (
    Served,
    WrkResult,
    ceiling_process,
    cpu_seconds,
    gil_medians,
    gil_window,
    save,
    setup_program,
    table,
    tally_process,
    tally_server,
    thread_cpu,
    thread_names,
    wrk,
)

SCRIPT = Path(__file__).with_name("sale.lua")
CONNECTIONS = 32


def _threads() -> int:
    return int(os.environ.get("BENCH_THREADS", "1"))


def _measure(label: str, served: Served, seconds: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """wrk against a running server after a warm-up; its CPU per request, by thread for tally."""
    env = env or {}
    url, threads = served.url, _threads()
    wrk("warm-up", url, SCRIPT, 3, CONNECTIONS, threads, env={**env, "BENCH_RUN": f"w{time.time_ns()}"})
    names = thread_names(served.pid) if env else {}
    before, before_threads = cpu_seconds(served.pid), thread_cpu(served.pid)
    run = {**env, "BENCH_RUN": f"m{time.time_ns()}"}
    result = wrk(label, url, SCRIPT, seconds, CONNECTIONS, threads, env=run)
    after, after_threads = cpu_seconds(served.pid), thread_cpu(served.pid)
    cpu = round((after - before) / result.requests * 1e6, 1)
    out: dict[str, Any] = {"wrk": result, "cpu_us_per_request": cpu}
    if names:
        by_thread: dict[str, float] = {}
        for tid, used in after_threads.items():
            name = names.get(tid, "other (native)")
            spent = (used - before_threads.get(tid, 0.0)) / result.requests * 1e6
            by_thread[name] = round(by_thread.get(name, 0.0) + spent, 1)
        out["cpu_us_per_request_by_thread"] = dict(sorted(by_thread.items(), key=lambda kv: -kv[1]))

    def lock_window(seconds: int) -> WrkResult:
        run = {**env, "BENCH_RUN": f"g{time.time_ns()}"}
        return wrk(label, url, SCRIPT, seconds, CONNECTIONS, threads, env=run)

    out.update(gil_window(served.pid, lock_window))
    return out


@contextmanager
def _big_log(events: int) -> Iterator[Path]:
    from bench.scale import prepared, scratch_copy

    db, _ = prepared(events)
    with scratch_copy(db) as copy:
        yield copy


def _side(name: str, seconds: int) -> dict[str, Any]:
    if name in ("ceiling", "bare"):
        with ceiling_process("app" if name == "ceiling" else name) as served:
            return _measure(name, served, seconds)
    events = int(name.split("(")[1].split(maxsplit=1)[0].replace(",", "")) if "(" in name else 0
    with _big_log(events) if events else _nothing() as database, tally_process(database) as served:
        _, key = setup_program(served.url)
        return _measure(name, served, seconds, {"BENCH_API_KEY": key})


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rps = [r["wrk"].rps for r in runs]
    summary: dict[str, Any] = {
        "rps_median": round(statistics.median(rps)),
        "rps_range": [round(min(rps)), round(max(rps))],
        "p50_ms_median": statistics.median(r["wrk"].p50_ms for r in runs),
        "p99_ms_median": statistics.median(r["wrk"].p99_ms for r in runs),
        "p99_ms_max": max(r["wrk"].p99_ms for r in runs),
        "non_2xx": sum(r["wrk"].non_2xx + r["wrk"].socket_errors for r in runs),
        "cpu_us_per_request_median": statistics.median(r["cpu_us_per_request"] for r in runs),
    }
    if all("cpu_us_per_request_by_thread" in r for r in runs):
        names = {name for r in runs for name in r["cpu_us_per_request_by_thread"]}
        summary["cpu_us_per_request_by_thread_median"] = {
            name: statistics.median(r["cpu_us_per_request_by_thread"].get(name, 0.0) for r in runs)
            for name in sorted(names)
        }
    summary.update(gil_medians(runs))
    if gil := summary.get("gil_us_per_request_median"):
        # however the work is spread over threads, one interpreter lock serves at most this
        summary["gil_bound_rps"] = round(1e6 / gil)
    return summary


def main(
    duration: int = int(os.environ.get("BENCH_SECONDS", "15")),
    rounds: int = int(os.environ.get("BENCH_ROUNDS", "3")),
) -> dict[str, object]:
    sides = ["ceiling", "bare", "tally"]
    events = int(os.environ.get("BENCH_INGEST_EVENTS", "0"))
    if events:
        sides.append(f"tally ({events:,} events)")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for n in range(rounds):  # alternate the order, so drift hits every side alike
        for side in sides if n % 2 == 0 else sides[::-1]:
            runs[side].append(_side(side, duration))
            print(f"  round {n + 1}: {side}: {runs[side][-1]['wrk'].rps:.0f} req/s", flush=True)
    print(table([r["wrk"] for side in sides for r in runs[side]]))
    summaries = {side: _summary(runs[side]) for side in sides}
    for side in sides:
        rps = summaries[side]["rps_median"]
        summaries[side]["ratio_vs_ceiling"] = round(rps / summaries["ceiling"]["rps_median"], 3)
        summaries[side]["ratio_vs_bare"] = round(rps / summaries["bare"]["rps_median"], 3)
        if summaries[side].get("gil_bound_rps"):
            bound = summaries[side]["gil_bound_rps"] / summaries["ceiling"]["rps_median"]
            summaries[side]["gil_bound_ratio_vs_ceiling"] = round(bound, 3)
        print(f"{side:>24}: {summaries[side]}")
    tallies = [side for side in sides if side.startswith("tally")]
    verdict = {
        "target_ratio_met": all(summaries[s]["ratio_vs_ceiling"] >= 0.5 for s in tallies),
        "target_p99_met": all(summaries[s]["p99_ms_median"] <= 15.0 for s in tallies),
        "target_zero_non_2xx_met": all(summaries[s]["non_2xx"] == 0 for s in tallies),
    }
    print(verdict)
    payload: dict[str, object] = {
        "seconds": duration,
        "rounds": rounds,
        "connections": CONNECTIONS,
        "wrk_threads": _threads(),
        "summary": summaries,
        "runs": runs,
        **verdict,
        "machine_load": list(os.getloadavg()),
    }
    save("ingest", payload)
    return payload


def _one(observe: bool, duration: int, connections: int) -> WrkResult:
    level = "INFO" if observe else "WARNING"
    with tally_server(observe=observe, env_extra={"TALLY_LOG_LEVEL": level}) as url:
        _, key = setup_program(url)
        env = {"BENCH_API_KEY": key}
        wrk("warm-up", url, SCRIPT, 3, connections, env={**env, "BENCH_RUN": f"w{time.time_ns()}"})
        label = "observability on" if observe else "observability off"
        return wrk(label, url, SCRIPT, duration, connections, env={**env, "BENCH_RUN": f"m{time.time_ns()}"})


def observability(
    duration: int = int(os.environ.get("BENCH_SECONDS", "15")),
    connections: int = 32,
    pairs: int = int(os.environ.get("BENCH_PAIRS", "3")),
) -> dict[str, object]:
    runs: dict[bool, list[WrkResult]] = {True: [], False: []}
    for n in range(pairs):  # alternate which side goes first, so drift hits both alike
        for observe in (False, True) if n % 2 == 0 else (True, False):
            runs[observe].append(_one(observe, duration, connections))
    print(table(runs[False] + runs[True]))

    def summary(results: list[WrkResult]) -> dict[str, float]:
        rps = [r.rps for r in results]
        return {
            "rps_median": statistics.median(rps),
            "rps_min": min(rps),
            "rps_max": max(rps),
            "p99_ms_median": statistics.median(r.p99_ms for r in results),
        }

    off, on = summary(runs[False]), summary(runs[True])
    ratio = on["rps_median"] / off["rps_median"]
    result: dict[str, object] = {
        "connections": connections,
        "seconds": duration,
        "pairs": pairs,
        "off": off,
        "on": on,
        "runs_off": runs[False],
        "runs_on": runs[True],
        "ratio_on_vs_off": round(ratio, 3),
        "target_within_10_percent_met": ratio >= 0.9,
    }
    print(
        f"median req/s off {off['rps_median']:.0f} ({off['rps_min']:.0f}..{off['rps_max']:.0f}), "
        f"on {on['rps_median']:.0f} ({on['rps_min']:.0f}..{on['rps_max']:.0f}); on/off = {ratio:.3f}"
    )
    save("ingest-observability", result)
    return result


if __name__ == "__main__":
    main()
