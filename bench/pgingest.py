"""bench/pgingest: durable `POST /api/v1/track/sale` on PostgreSQL, one replica and two replicas,
beside the embedded DuckDB default and the framework ceiling, in the same run.

Each side runs `BENCH_SECONDS` (15) under wrk with `BENCH_CONNECTIONS` (32) connections in all
(two replicas: two wrk processes, half the connections each, at the same time) after a 3-second
warm-up; `BENCH_ROUNDS` (2) rounds, sides alternating, medians kept with every sample. Reported per
side: req/s, p50 and p99 (two replicas: the worse of the two wrk reports), non-2xx, and CPU
microseconds per request of the tally processes and of PostgreSQL (all of the cluster's
processes, from /proc: utime + stime of the postmaster, its children and the children it reaped);
for one process (DuckDB, one replica), the interpreter lock's microseconds a request and the most
one lock can serve as a ratio of the ceiling, from a further window (bench/ingest says how).

Targets (2 cores): one replica >= 0.35x the ceiling, p99 <= 30 ms, zero non-2xx; two replicas at
least as fast as one. The database is a durable cluster of the bench's own (tests/pg.py: fsync
and synchronous commit on, as in production), or `BENCH_POSTGRES_URL`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.harness import (
    WrkResult,
    ceiling_server,
    cpu_seconds,
    gil_window,
    save,
    setup_program,
    table,
    tally_process,
    wrk,
)

SCRIPT = Path(__file__).with_name("sale.lua")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (FileNotFoundError, IndexError, ValueError):
                continue
    return out


class Cpu:
    """CPU seconds of the tally processes and of the PostgreSQL cluster (its postmaster's tree)."""

    def __init__(self, tally_pids: list[int], postmaster: int | None) -> None:
        self.tally_pids = tally_pids
        self.postmaster = postmaster

    def sample(self) -> tuple[float, float]:
        tally = sum(cpu_seconds(pid) for pid in self.tally_pids)
        pg = 0.0
        if self.postmaster is not None:
            pg = cpu_seconds(self.postmaster, children=True)
            pg += sum(cpu_seconds(child) for child in _children(self.postmaster))
        return tally, pg


def _run(
    label: str, urls: list[str], keys: list[str], seconds: int, connections: int, cpu: Cpu | None
) -> dict[str, Any]:
    """wrk against every url at once (connections split evenly); combined figures."""
    results: list[WrkResult] = []
    before = cpu.sample() if cpu else (0.0, 0.0)
    threads = [
        threading.Thread(
            target=lambda u=url, k=key, n=i: results.append(
                wrk(
                    f"{label} [{n}]",
                    u,
                    SCRIPT,
                    seconds,
                    connections // len(urls),
                    threads=1,
                    env={"BENCH_API_KEY": k, "BENCH_RUN": f"m{time.time_ns()}_{n}"},
                )
            )
        )
        for i, (url, key) in enumerate(zip(urls, keys, strict=True))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = cpu.sample() if cpu else (0.0, 0.0)
    requests = sum(r.requests for r in results)
    out: dict[str, Any] = {
        "label": label,
        "rps": round(sum(r.rps for r in results)),
        "p50_ms": max(r.p50_ms for r in results),
        "p99_ms": max(r.p99_ms for r in results),
        "non_2xx": sum(r.non_2xx for r in results),
        "socket_errors": sum(r.socket_errors for r in results),
        "requests": requests,
        "runs": results,
    }
    if cpu is not None and requests:
        out["tally_cpu_us_per_request"] = round((after[0] - before[0]) / requests * 1e6)
        out["postgres_cpu_us_per_request"] = round((after[1] - before[1]) / requests * 1e6)
    return out


@contextmanager
def _postgres() -> Iterator[tuple[Any, int | None]]:
    """(a function giving a fresh database URL, the postmaster's pid or None)."""
    given = os.environ.get("BENCH_POSTGRES_URL")
    if given:
        yield (lambda: given), None
        return
    from tests.pg import Cluster

    cluster = Cluster(durable=True)
    try:
        postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
        yield (lambda: cluster.url(cluster.create_database())), postmaster
    finally:
        cluster.close()


def _side(
    name: str, replicas: int, database: str | None, seconds: int, connections: int, postmaster: int | None
) -> dict[str, Any]:
    with ExitStack() as stack:
        servers = []
        for n in range(replicas):
            env = {
                "TALLY_ENGINE_DIR": stack.enter_context(tempfile.TemporaryDirectory(prefix=f"engine-{n}-"))
            }
            if database is not None:
                env["TALLY_DATABASE"] = database
            servers.append(stack.enter_context(tally_process(env_extra=env)))
        _, key = setup_program(servers[0].url)
        urls, keys = [s.url for s in servers], [key] * replicas
        cpu = Cpu([s.pid for s in servers], postmaster if database is not None else None)
        _run(f"{name} warm-up", urls, keys, 3, connections, None)
        out = _run(name, urls, keys, seconds, connections, cpu)
        if replicas == 1:  # (one process: one interpreter lock to measure)

            def lock_window(seconds: int) -> WrkResult:
                runs: list[WrkResult] = _run(f"{name} lock", urls, keys, seconds, connections, None)["runs"]
                return runs[0]

            out.update(gil_window(servers[0].pid, lock_window))
        return out


def main(
    seconds: int = int(os.environ.get("BENCH_SECONDS", "15")),
    connections: int = int(os.environ.get("BENCH_CONNECTIONS", "32")),
    rounds: int = int(os.environ.get("BENCH_ROUNDS", "2")),
) -> dict[str, object]:
    samples: dict[str, list[dict[str, Any]]] = {"ceiling": [], "duckdb": [], "pg1": [], "pg2": []}
    with _postgres() as (fresh, postmaster):
        for n in range(rounds):
            order = ["ceiling", "duckdb", "pg1", "pg2"]
            for side in order if n % 2 == 0 else order[::-1]:
                if side == "ceiling":
                    with ceiling_server() as url:
                        _run("ceiling warm-up", [url], ["none"], 3, connections, None)
                        samples[side].append(_run("ceiling", [url], ["none"], seconds, connections, None))
                elif side == "duckdb":
                    samples[side].append(_side("duckdb (1 process)", 1, None, seconds, connections, None))
                else:
                    replicas = int(side[-1])
                    label = f"postgresql ({replicas} replica{'s' if replicas > 1 else ''})"
                    samples[side].append(_side(label, replicas, fresh(), seconds, connections, postmaster))
    medians: dict[str, dict[str, Any]] = {}
    for side, runs in samples.items():
        medians[side] = {
            key: statistics.median(r[key] for r in runs)
            for key in (
                "rps",
                "p50_ms",
                "p99_ms",
                "tally_cpu_us_per_request",
                "postgres_cpu_us_per_request",
                "gil_us_per_request",
            )
            if all(key in r for r in runs)
        }
        medians[side]["rps_range"] = [min(r["rps"] for r in runs), max(r["rps"] for r in runs)]
        medians[side]["non_2xx"] = sum(r["non_2xx"] + r["socket_errors"] for r in runs)
    ceiling = medians["ceiling"]["rps"]
    for side in ("duckdb", "pg1", "pg2"):
        medians[side]["ratio_vs_ceiling"] = round(medians[side]["rps"] / ceiling, 3)
        if gil := medians[side].get("gil_us_per_request"):  # the most one interpreter lock serves
            medians[side]["gil_bound_ratio_vs_ceiling"] = round(1e6 / gil / ceiling, 3)
    print(table([run for runs in samples.values() for r in runs for run in r["runs"]]))
    for side, m in medians.items():
        print(f"{side:>8}: {m}")
    verdict = {
        "target_ratio_met": medians["pg1"]["ratio_vs_ceiling"] >= 0.35,
        "target_p99_met": medians["pg1"]["p99_ms"] <= 30.0,
        "target_zero_non_2xx_met": medians["pg1"]["non_2xx"] == 0 and medians["pg2"]["non_2xx"] == 0,
        "two_replicas_at_least_one": medians["pg2"]["rps"] >= medians["pg1"]["rps"],
    }
    print(verdict)
    payload: dict[str, object] = {
        "seconds": seconds,
        "connections": connections,
        "rounds": rounds,
        "medians": medians,
        "samples": samples,
        **verdict,
        "machine_load": list(os.getloadavg()),
    }
    save("pgingest", payload)
    return payload
