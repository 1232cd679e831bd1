"""bench/ingest: durable `POST /api/v1/track/sale` versus the framework ceiling, same run.

Targets (2 cores, 32 connections): durable ingest >= 0.5x the ceiling, p99 <= 25 ms, zero non-2xx.

`observability()` (`python -m bench observability`): the same load with access lines and metrics
on (`TALLY_LOG_LEVEL=INFO`, text lines to a file) and off (`bench/unobserved.py`,
`TALLY_LOG_LEVEL=WARNING`), in alternating pairs in one run; medians and spread. Target: on within
10 % of off.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from bench.harness import (
    WrkResult,
    ceiling_server,
    save,
    setup_program,
    side_by_side,
    table,
    tally_server,
    wrk,
)

SCRIPT = Path(__file__).with_name("sale.lua")


def main(
    duration: int = int(os.environ.get("BENCH_SECONDS", "15")), connections: int = 32
) -> dict[str, object]:
    with ceiling_server() as url:
        wrk("ceiling warm-up", url, SCRIPT, 3, connections)
        ceiling = wrk("ceiling (parse JSON only)", url, SCRIPT, duration, connections)
    with tally_server() as url:
        _, key = setup_program(url)
        env = {"BENCH_API_KEY": key}
        wrk("tally warm-up", url, SCRIPT, 3, connections, env={**env, "BENCH_RUN": f"w{time.time_ns()}"})
        tally = wrk(
            "tally track/sale (durable)",
            url,
            SCRIPT,
            duration,
            connections,
            env={**env, "BENCH_RUN": f"m{time.time_ns()}"},
        )
    ratio = tally.rps / ceiling.rps
    verdict = {
        "ratio_vs_ceiling": round(ratio, 3),
        "target_ratio_met": ratio >= 0.5,
        "target_p99_met": tally.p99_ms <= 25.0,
        "target_zero_non_2xx_met": tally.non_2xx == 0 and tally.socket_errors == 0,
    }
    return side_by_side("ingest", ceiling, tally, connections, duration, verdict)


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
