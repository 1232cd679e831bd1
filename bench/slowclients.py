"""bench/slowclients: normal traffic's p99 with and without slowloris clients, same server, same run.

One `tally serve` on loopback with its default header timeout (`TALLY_HEADER_TIMEOUT_SECONDS`,
10 s). wrk posts durable sales (bench/sale.lua) twice: alone, then while `SLOW` connections each
send a request line and then one more header line every `DRIBBLE` seconds, never finishing their
headers, and reconnect whenever the server closes them (a patient attacker). Reported: p99/p50
and throughput of the normal traffic in both runs, how many slow connections the server held
(sampled every 0.5 s: peak and mean), how many it closed and how long it held each one.

Targets: every slow connection is closed within the header timeout plus its dribble interval, and
the normal traffic's p99 with slow clients stays within 2x (and 10 ms) of its p99 without.
Bounded: 2 x BENCH_SECONDS (default 15) of load plus a 3 s warm-up; loopback only.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import OPERATOR_TOKEN, WEBHOOK_SECRET, _serve, free_port, save, setup_program, table, wrk

SCRIPT = Path(__file__).with_name("sale.lua")
SLOW = 500
DRIBBLE = 1.0  # seconds between two header lines of a slow client
HEADER_TIMEOUT = 10.0  # the default of TALLY_HEADER_TIMEOUT_SECONDS, set explicitly
CONNECTIONS = 16


@contextmanager
def server() -> Iterator[str]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tally-bench-") as tmp:
        env = {
            **os.environ,
            "TALLY_DATABASE": str(Path(tmp) / "bench.duckdb"),
            "TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN,
            "TALLY_BASE_URL": f"http://127.0.0.1:{port}",
            "TALLY_STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET,
            "TALLY_RECONCILE_INTERVAL_SECONDS": "0",
            "TALLY_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
        }
        cmd = [sys.executable, "-m", "api.cli", "serve", "--port", str(port)]
        with _serve(cmd, port, "/healthz", env) as served:
            yield served.url


@dataclass
class Slowloris:
    """`count` connections dribbling headers at `port`, reconnecting when closed, until stopped."""

    port: int
    count: int
    open_now: int = 0
    opened: int = 0
    held_seconds: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    async def _one(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(index * 0.002)  # ramp up over about a second
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                self.failures += 1
                await asyncio.sleep(0.1)
                continue
            start = loop.time()
            self.open_now += 1
            self.opened += 1
            closed_by_server = False
            try:
                writer.write(b"POST /api/v1/track/sale HTTP/1.1\r\nHost: bench\r\n")
                while not self.stop.is_set():
                    try:
                        if not await asyncio.wait_for(reader.read(65536), DRIBBLE):
                            closed_by_server = True
                            break
                    except TimeoutError:
                        writer.write(b"X-Slow: a\r\n")
                        await writer.drain()
            except OSError:
                closed_by_server = True
            finally:
                self.open_now -= 1
                if closed_by_server:
                    self.held_seconds.append(loop.time() - start)
                writer.close()

    async def _sample(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.open_now)
            await asyncio.sleep(0.5)

    async def _main(self) -> None:
        await asyncio.gather(self._sample(), *(self._one(i) for i in range(self.count)))

    @contextmanager
    def running(self) -> Iterator[Slowloris]:
        thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            thread.join(DRIBBLE + 10)


def main(duration: int = int(os.environ.get("BENCH_SECONDS", "15"))) -> dict[str, object]:
    with server() as url:
        _, key = setup_program(url)
        env = {"BENCH_API_KEY": key}
        wrk("warm-up", url, SCRIPT, 3, CONNECTIONS, env={**env, "BENCH_RUN": f"w{time.time_ns()}"})
        alone = wrk(
            "sales alone", url, SCRIPT, duration, CONNECTIONS, env={**env, "BENCH_RUN": f"a{time.time_ns()}"}
        )
        attack = Slowloris(int(url.rsplit(":", 1)[1]), SLOW)
        with attack.running():
            time.sleep(2)  # let the slow connections open before measuring
            beside = wrk(
                f"sales beside {SLOW} slow",
                url,
                SCRIPT,
                duration,
                CONNECTIONS,
                env={**env, "BENCH_RUN": f"s{time.time_ns()}"},
            )
        print(table([alone, beside]))
    held = sorted(attack.held_seconds)
    samples = attack.samples[4:] or [0]  # after the ramp-up
    bound = HEADER_TIMEOUT + DRIBBLE + 1.0
    verdict: dict[str, object] = {
        "slow_connections_opened": attack.opened,
        "slow_connections_closed_by_server": len(held),
        "slow_connect_failures": attack.failures,
        "slow_held_peak": max(samples),
        "slow_held_mean": round(statistics.fmean(samples), 1),
        "slow_held_seconds_p50": round(statistics.median(held), 2) if held else None,
        "slow_held_seconds_max": round(held[-1], 2) if held else None,
        "p99_ratio_with_slow": round(beside.p99_ms / alone.p99_ms, 2),
        "target_slow_closed_within_timeout_met": bool(held) and held[-1] <= bound,
        "target_p99_held_met": beside.p99_ms <= max(2 * alone.p99_ms, alone.p99_ms + 10),
        "target_zero_non_2xx_met": beside.non_2xx == 0 and beside.socket_errors == 0,
    }
    print(" ".join(f"{k}={v}" for k, v in verdict.items()))
    result: dict[str, object] = {
        "header_timeout_seconds": HEADER_TIMEOUT,
        "slow_clients": SLOW,
        "dribble_seconds": DRIBBLE,
        "connections": CONNECTIONS,
        "seconds": duration,
        "alone": alone,
        "with_slow_clients": beside,
        **verdict,
    }
    save("slowclients", result)
    return result


if __name__ == "__main__":
    main()
