"""bench/ingest: durable `POST /api/v1/track/sale` versus the framework ceiling, same run.

Targets (2 cores, 32 connections): durable ingest >= 0.5x the ceiling, p99 <= 25 ms, zero non-2xx.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.harness import ceiling_server, setup_program, side_by_side, tally_server, wrk

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


if __name__ == "__main__":
    main()
