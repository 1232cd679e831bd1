"""Shared bench plumbing: start servers on loopback, run wrk, parse its report."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
OPERATOR_TOKEN = "bench-operator-token-0123456789"
WEBHOOK_SECRET = "whsec_bench_secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(url: str, proc: subprocess.Popen[bytes], stderr: IO[bytes]) -> None:
    deadline = time.monotonic() + 600  # start-up is itself measured (bench/scale)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr.seek(0)
            raise RuntimeError(f"server exited: {stderr.read().decode()}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.02)
    raise RuntimeError(f"{url} did not come up")


@dataclass
class Served:
    url: str
    pid: int
    startup_s: float  # from spawning the process to its first 200 on the health path


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of process `pid`, all its threads (with `children`, plus its reaped children's)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def thread_cpu(pid: int) -> dict[int, float]:
    """utime + stime of each thread of process `pid`, by thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Python's names of the threads of process `pid` by thread id (py-spy reads them; Python does
    not give them to the OS), empty when py-spy is not at hand."""
    try:
        dump = subprocess.run(
            [str(Path(sys.executable).with_name("py-spy")), "dump", "-p", str(pid)],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): name for tid, name in re.findall(r'Thread (\d+) \([^)]*\): "([^"]+)"', dump)}


GIL_RATE = 100  # samples a second: py-spy keeps up at this rate on a loaded 2-core machine


@dataclass
class GilShare:
    """How much of a window some thread of a process held the interpreter lock (py-spy `--gil`
    samples: only the thread holding the lock at a sampling instant is recorded), in all and by
    thread name."""

    instants: int  # sampling instants read (the rate times the window, less py-spy's misses)
    held: int  # instants at which a thread held the lock
    by_thread: dict[str, int]

    def per_request(self, seconds: float, requests: int) -> dict[str, Any]:
        """The lock's microseconds a request over a window of `seconds` that served `requests`,
        in all and by thread; one lock serves at most `1e6 / us` requests a second, however
        the work is spread over threads."""
        if not self.instants or not requests:
            return {}
        each = seconds / self.instants / requests * 1e6
        by_thread = sorted(self.by_thread.items(), key=lambda kv: -kv[1])
        return {
            "gil_us_per_request": round(self.held * each, 1),
            "gil_us_per_request_by_thread": {name: round(n * each, 1) for name, n in by_thread},
        }


@contextmanager
def gil_sampled(pid: int, seconds: int) -> Iterator[list[GilShare]]:
    """Sample which thread of process `pid` holds the interpreter lock during the block (at most
    `seconds`); the share is appended to the yielded list when the block ends (nothing when
    py-spy is not at hand or could not sample the process: no figure rather than a zero)."""
    spy = Path(sys.executable).with_name("py-spy")
    shares: list[GilShare] = []
    if not spy.exists():
        yield shares
        return
    with tempfile.TemporaryDirectory(prefix="tally-bench-gil-") as tmp:
        raw = Path(tmp) / "gil.txt"
        cmd = [str(spy), "record", "--gil", "--nonblocking", "--threads", "-f", "raw"]
        cmd += ["-r", str(GIL_RATE), "-d", str(seconds), "-p", str(pid), "-o", str(raw)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            yield shares
        finally:
            report = proc.communicate(timeout=seconds + 60)[0]
        if proc.returncode != 0 or not raw.exists():
            return
        errors = re.search(r"Errors: (\d+)", report)
        by_thread: dict[str, int] = {}
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            thread = stack.split(";", 1)[0]
            name = m.group(1) if (m := re.search(r"\): (.+)$", thread)) else "other (native)"
            by_thread[name] = by_thread.get(name, 0) + int(count)
        instants = GIL_RATE * seconds - (int(errors.group(1)) if errors else 0)
        shares.append(GilShare(instants, sum(by_thread.values()), by_thread))


def gil_window(pid: int, run: Callable[[int], WrkResult]) -> dict[str, Any]:
    """The interpreter lock's microseconds a request of process `pid`, in all and by thread, over
    a further window of `BENCH_GIL_SECONDS` (5; 0 leaves it out) in which `run(seconds)` loads
    it. Kept apart from a bench's measured window, so py-spy's own cost is not in its rates."""
    seconds = int(os.environ.get("BENCH_GIL_SECONDS", "5"))
    if seconds <= 0:
        return {}
    with gil_sampled(pid, seconds) as shares:
        result = run(seconds)
    return shares[0].per_request(result.seconds, result.requests) if shares else {}


def gil_medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of `gil_window`'s figures over a side's runs (nothing unless every run has
    them)."""
    if not runs or not all("gil_us_per_request" in r for r in runs):
        return {}
    threads = sorted({name for r in runs for name in r["gil_us_per_request_by_thread"]})
    return {
        "gil_us_per_request_median": statistics.median(r["gil_us_per_request"] for r in runs),
        "gil_us_per_request_by_thread_median": {
            name: statistics.median(r["gil_us_per_request_by_thread"].get(name, 0.0) for r in runs)
            for name in threads
        },
    }


def rss_bytes(pid: int) -> int:
    """The resident set of process `pid` (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextmanager
def tally_server(
    database: Path | None = None, observe: bool = True, env_extra: dict[str, str] | None = None
) -> Iterator[str]:
    """`tally serve` on loopback; `observe=False` runs it without access lines and metrics
    (bench/unobserved.py), the baseline of bench/ingest's observability cost."""
    with tally_process(database, observe, env_extra) as served:
        yield served.url


@contextmanager
def tally_process(
    database: Path | None = None, observe: bool = True, env_extra: dict[str, str] | None = None
) -> Iterator[Served]:
    """`tally serve` on loopback, with its pid and how long it took to answer."""
    port = free_port()
    # (removed with the server: a run of the benches starts dozens, of about 65 MB each)
    with tempfile.TemporaryDirectory(prefix="tally-bench-") as tmp:
        env = {
            **os.environ,
            "TALLY_DATABASE": str(database or Path(tmp) / "bench.duckdb"),
            "TALLY_OPERATOR_TOKEN": OPERATOR_TOKEN,
            "TALLY_BASE_URL": f"http://127.0.0.1:{port}",
            "TALLY_STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET,
            "TALLY_RECONCILE_INTERVAL_SECONDS": "0",
            **(env_extra or {}),
        }
        module = "api.cli" if observe else "bench.unobserved"
        with _serve(
            [sys.executable, "-m", module, "serve", "--port", str(port)], port, "/healthz", env
        ) as served:
            yield served


@contextmanager
def ceiling_server(app: str = "app") -> Iterator[str]:
    """One of bench/ceiling.py's apps (`app`, `bare`, `webhook`) on uvicorn, as `tally serve` runs."""
    with ceiling_process(app) as served:
        yield served.url


@contextmanager
def ceiling_process(app: str = "app") -> Iterator[Served]:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", f"bench.ceiling:{app}", "--port", str(port)]
    with _serve([*cmd, "--log-level", "warning", "--no-access-log"], port, "/", None) as served:
        yield served


@contextmanager
def _serve(cmd: list[str], port: int, health: str, env: dict[str, str] | None) -> Iterator[Served]:
    """Run a server process on loopback until the block ends; yield its base URL once it answers.
    Its stderr (tally's log lines, one a request at INFO) goes to a file, as a deployment's would:
    a pipe nobody reads would fill and stall the log writer."""
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait(url + health, proc, stderr)
            yield Served(url, proc.pid, time.perf_counter() - started)
        finally:
            proc.terminate()
            proc.wait(30)


@dataclass
class WrkResult:
    label: str
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int


def _ms(value: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", value)  # wrk writes a minute-long run as "1.00m"
    if not m:
        raise ValueError(value)
    number, unit = float(m.group(1)), m.group(2)
    return number * {"us": 0.001, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}[unit]


def wrk(
    label: str,
    url: str,
    script: Path,
    duration: int,
    connections: int,
    threads: int = 2,
    env: dict[str, str] | None = None,
) -> WrkResult:
    out = subprocess.run(
        [
            "wrk",
            "-t",
            str(threads),
            "-c",
            str(connections),
            "-d",
            f"{duration}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    seconds = _ms(re.search(r"requests in ([\d.]+\w+),", out).group(1)) / 1000  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return WrkResult(
        label,
        requests,
        seconds,
        requests / seconds,
        p50,
        p99,
        int(non2xx.group(1)) if non2xx else 0,
        sum(int(g) for g in errors.groups()) if errors else 0,
    )


def setup_program(url: str) -> tuple[str, str]:
    """An account, a program and its key on a running tally; returns (program_id, api_key)."""
    op = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "b@x.test", "workspace_name": "Bench"}, headers=op
        ).json()["data"]
        auth = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs",
            json={"workspace_id": acct["workspace_id"], "name": "Bench", "stripe_account_id": "acct_bench"},
            headers=auth,
        ).json()["data"]["program_id"]
        key = c.post(f"/api/v1/programs/{pid}/api-key", headers=auth).json()["data"]["api_key"]
        return str(pid), str(key)


def save(name: str, payload: dict[str, object]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=asdict))
    return path


def table(rows: list[WrkResult]) -> str:
    lines = [f"{'run':<28}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'non-2xx':>10}{'errors':>8}"]
    for r in rows:
        lines.append(
            f"{r.label:<28}{r.rps:>10.0f}{r.p50_ms:>10.2f}{r.p99_ms:>10.2f}{r.non_2xx:>10}"
            f"{r.socket_errors:>8}"
        )
    return "\n".join(lines)


def side_by_side(
    name: str,
    ceiling: WrkResult,
    measured: WrkResult,
    connections: int,
    duration: int,
    verdict: dict[str, object],
) -> dict[str, object]:
    """Print and save a run measured beside the framework ceiling (bench/out/<name>.json)."""
    print(table([ceiling, measured]))
    print(f"ratio {name}/ceiling = {measured.rps / ceiling.rps:.2f}  {verdict}")
    result: dict[str, object] = {
        "connections": connections,
        "seconds": duration,
        "ceiling": ceiling,
        name: measured,
        **verdict,
    }
    save(name, result)
    return result
