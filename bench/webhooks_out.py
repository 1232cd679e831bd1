"""bench/webhooks_out: webhooks to brand servers, measured side by side in one run.

1. Deliveries per second: `BENCH_WEBHOOK_SALES` sales (default 2,000) reconciled into
   `sale.created` events for 3 endpoints on a local receiver (bench/hookreceiver.py, uvicorn),
   timed from the end of the reconcile until the receiver has every delivery (signing, the
   guarded transport, the lease and the recorded attempt included). Requests are counted in all
   and once per (endpoint, webhook-id), so a delivery sent twice would show. The CPU each
   delivery costs the server's process (what it takes from ingest: claims, recording) and its
   sending process (api/outbound/sending.py, at nice 19) is read from /proc: a figure the
   machine's load does not move much, where req/s under wrk move by 20 % between runs on a
   loaded machine.
2. Ingest cost: `POST /api/v1/track/sale` under wrk (32 connections, `BENCH_SECONDS` each) on
   a tally with no endpoint, with 3 endpoints subscribed (no reconcile runs during the load, so
   no event is due: the cost of the worker waiting), and with 3 endpoints while the worker drains
   a backlog of deliveries during the load (the worst case: the same process signs and sends
   while it ingests). Runs alternate (`BENCH_PAIRS` rounds, default 2). Target (issue 33): with
   3 endpoints subscribed, ingest within 5 % of none.

`python -m bench webhooks_out`; writes bench/out/webhooks_out.json.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.harness import (
    OPERATOR_TOKEN,
    WrkResult,
    _serve,
    cpu_seconds,
    free_port,
    save,
    setup_program,
    table,
    tally_process,
    tally_server,
    wrk,
)

SCRIPT = Path(__file__).with_name("sale.lua")
OP = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
HOOKS = {"TALLY_WEBHOOKS_ALLOW_PRIVATE": "1"}
ENDPOINTS = 3


@contextmanager
def receiver() -> Iterator[str]:
    """The receiver stands for a brand's server, which runs on a machine of its own: here it
    shares the two cores with tally and wrk, so it runs at the lowest CPU priority (nice 19),
    and the CPU it takes to answer does not count against ingest."""
    port = free_port()
    cmd = ["nice", "-n", "19", sys.executable, "-m", "uvicorn", "bench.hookreceiver:app", "--port", str(port)]
    with _serve([*cmd, "--log-level", "warning", "--no-access-log"], port, "/count", None) as served:
        yield served.url


def _owner(url: str) -> tuple[str, dict[str, str], str]:
    """(program id, the owner's auth, the program key) on a running tally."""
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "h@x.test", "workspace_name": "Hooks"}, headers=OP
        ).json()["data"]
        auth = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "Hooks"}, headers=auth
        ).json()["data"]["program_id"]
        key = c.post(f"/api/v1/programs/{pid}/api-key", headers=auth).json()["data"]["api_key"]
    return str(pid), auth, str(key)


def _subscribe(url: str, pid: str, auth: dict[str, str], target: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        for n in range(ENDPOINTS):
            body = {"url": f"{target}/hooks/{n}", "events": ["sale.created"]}
            r = c.post(f"/api/v1/programs/{pid}/webhook-endpoints", json=body, headers=auth)
            assert r.status_code == 201, r.text


def _sales(url: str, key: str, count: int, run: str) -> None:
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
        for n in range(count):
            body = {
                "transaction_id": f"in_{run}_{n}",
                "customer_external_id": f"c{n}",
                "amount": 1000 + n % 900,
            }
            assert c.post("/api/v1/track/sale", json=body).status_code == 200


def _received(target: str) -> dict[str, int]:
    found: dict[str, int] = httpx.get(f"{target}/count", timeout=10).json()
    return found


def _reconcile(url: str) -> None:
    assert httpx.post(f"{url}/api/v1/operator/reconcile", headers=OP, timeout=600).status_code == 200


def throughput(sales: int) -> dict[str, object]:
    """Deliveries per second from the end of a reconcile until the receiver has them all."""
    with receiver() as target, tally_process(env_extra=HOOKS) as served:
        url = served.url
        pid, auth, key = _owner(url)
        _subscribe(url, pid, auth, target)
        _sales(url, key, sales, "t")
        started = time.perf_counter()
        _reconcile(url)
        reconciled = time.perf_counter()
        server_cpu = cpu_seconds(served.pid)
        sender_cpu = 0.0
        want = sales * ENDPOINTS
        deadline = time.monotonic() + 600
        while _received(target)["count"] < want and time.monotonic() < deadline:
            sender_cpu = max(sender_cpu, sum(cpu_seconds(c) for c in _children(served.pid)))
            time.sleep(0.05)
        done = time.perf_counter()
        server_cpu = cpu_seconds(served.pid) - server_cpu
        got = _received(target)
    seconds = done - reconciled
    return {
        "sales": sales,
        "endpoints": ENDPOINTS,
        "deliveries": got["count"],
        "distinct_deliveries": got["ids"],
        "reconcile_and_derive_s": round(reconciled - started, 3),
        "delivery_s": round(seconds, 3),
        "deliveries_per_s": round(got["count"] / seconds, 1),
        # CPU per delivery: the server's process (from the end of the reconcile; the sending
        # process's own is not in it) and the sending process (its whole life: it starts with
        # the first delivery)
        "server_cpu_ms_per_delivery": round(1000 * server_cpu / max(1, got["count"]), 3),
        "sender_cpu_ms_per_delivery": round(1000 * sender_cpu / max(1, got["count"]), 3),
    }


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def _ingest(label: str, mode: str, duration: int, connections: int, backlog: int) -> WrkResult:
    """wrk on track/sale: `none` (no endpoint), `idle` (3 endpoints, nothing due) or `draining`
    (3 endpoints and `backlog` sales' events being delivered during the load)."""
    with receiver() as target, tally_server(env_extra=HOOKS) as url:
        if mode == "none":
            _, key = setup_program(url)
        else:
            pid, auth, key = _owner(url)
            _subscribe(url, pid, auth, target)
        if mode == "draining":
            _sales(url, key, backlog, "b")
        env = {"BENCH_API_KEY": key}
        wrk("warm-up", url, SCRIPT, 3, connections, env={**env, "BENCH_RUN": f"w{time.time_ns()}"})
        if mode == "draining":
            _reconcile(url)  # the backlog's events are due now: the worker sends them during the run
        result = wrk(
            label, url, SCRIPT, duration, connections, env={**env, "BENCH_RUN": f"m{time.time_ns()}"}
        )
        if mode == "draining":
            result.label += f" ({_received(target)['count']} sent)"
        return result


def main(
    duration: int = int(os.environ.get("BENCH_SECONDS", "15")),
    connections: int = 32,
    pairs: int = int(os.environ.get("BENCH_PAIRS", "2")),
    sales: int = int(os.environ.get("BENCH_WEBHOOK_SALES", "2000")),
) -> dict[str, object]:
    delivered = throughput(sales)
    print(
        f"deliveries: {delivered['deliveries']} ({delivered['distinct_deliveries']} distinct) in "
        f"{delivered['delivery_s']} s = {delivered['deliveries_per_s']} /s to {ENDPOINTS} endpoints; "
        f"CPU per delivery: server {delivered['server_cpu_ms_per_delivery']} ms, "
        f"sending process {delivered['sender_cpu_ms_per_delivery']} ms"
    )
    modes = {"none": "no endpoint", "idle": "3 endpoints subscribed", "draining": "3 endpoints, draining"}
    runs: dict[str, list[WrkResult]] = {m: [] for m in modes}
    backlog = max(1, duration * 100 // ENDPOINTS)  # about what the worker sends in the run
    for n in range(pairs):
        order = list(modes) if n % 2 == 0 else list(reversed(modes))
        for mode in order:
            runs[mode].append(_ingest(modes[mode], mode, duration, connections, backlog))
    print(table([r for m in modes for r in runs[m]]))
    median = {m: statistics.median(r.rps for r in runs[m]) for m in modes}
    idle_cost = 1 - median["idle"] / median["none"]
    draining_cost = 1 - median["draining"] / median["none"]
    verdict = {
        "median_rps": {m: round(v, 1) for m, v in median.items()},
        "ingest_cost_subscribed": round(idle_cost, 3),
        "ingest_cost_while_draining": round(draining_cost, 3),
        "target_within_5_percent_met": idle_cost <= 0.05,
    }
    print(
        f"ingest with 3 endpoints subscribed: {-idle_cost:+.1%} vs none; "
        f"while the worker drains a backlog: {-draining_cost:+.1%}"
    )
    result: dict[str, object] = {"throughput": delivered, "runs": runs, "connections": connections, **verdict}
    save("webhooks_out", result)
    return result
