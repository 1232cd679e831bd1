"""bench/webhook: signed `POST /webhooks/stripe` deliveries per second versus the ingest ceiling.

Each request is a distinct, properly signed Connect delivery (a live `checkout.session.completed`
with attribution metadata, unique event, session and payment-intent ids), so every one goes
through signature verification, parsing, routing, the duplicate check and a durable append that
claims three idempotency keys. wrk cannot compute HMAC-SHA256 per request, so the deliveries are
signed here just before the run (timestamps stay within the default 300 s tolerance) and
bench/webhook.lua replays them, one per request.

Its ceiling is a Starlette endpoint that checks the same signature (the same secret) and parses
the body, and nothing else (bench/ceiling.py `webhook`), served the same deliveries; bench/ingest's
parse-only ceiling is measured beside them. `BENCH_ROUNDS` rounds (default 3) of the three sides,
medians with every sample, and each side's CPU microseconds per request; for the signed endpoint
and tally, the interpreter lock's microseconds a request and the most one lock serves, as a ratio
of the signed endpoint's rate (a further window under py-spy: bench/ingest says how). Target:
tally >= 0.5x the signed parse-only endpoint, zero non-2xx.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    WEBHOOK_SECRET,
    WrkResult,
    ceiling_process,
    cpu_seconds,
    gil_medians,
    gil_window,
    save,
    setup_program,
    table,
    tally_process,
    wrk,
)
from ingest.stripe import sign

SCRIPT = Path(__file__).with_name("webhook.lua")
CEILING_SCRIPT = Path(__file__).with_name("sale.lua")
ACCOUNT = "acct_bench"  # the account bench.harness.setup_program connects the program to
THREADS = 2


def delivery(run: str, n: int, program_id: str, now: int) -> tuple[str, bytes]:
    """One signed delivery: (Stripe-Signature, body)."""
    tag = f"{run}{n:07d}"
    event: dict[str, Any] = {
        "id": f"evt_{tag}",
        "object": "event",
        "account": ACCOUNT,
        "api_version": "2025-03-31.basil",
        "created": now,
        "livemode": True,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": "checkout.session.completed",
        "data": {
            "object": {
                "id": f"cs_live_{tag}",
                "object": "checkout.session",
                "amount_subtotal": 4900,
                "amount_total": 4900 + n % 1000,
                "currency": "usd",
                "customer": f"cus_{n % 5000:06d}",
                "customer_details": {"email": f"buyer{n % 5000}@example.com", "name": None},
                "invoice": None,
                "livemode": True,
                "metadata": {
                    "svc_click_id": f"clk_{n % 997:05d}",
                    "svc_customer_key": f"user_{n % 5000}",
                    "program_id": program_id,
                },
                "mode": "payment",
                "payment_intent": f"pi_{tag}",
                "payment_status": "paid",
                "status": "complete",
                "total_details": {"amount_discount": 0, "amount_shipping": 0, "amount_tax": 0},
            }
        },
    }
    body = json.dumps(event, separators=(",", ":")).encode()
    return sign(body, WEBHOOK_SECRET, now), body


def write_deliveries(prefix: Path, run: str, count: int, program_id: str) -> None:
    """`count` signed deliveries, dealt round-robin into one file per wrk thread."""
    now = int(time.time())
    with ExitStack() as stack:
        files = [stack.enter_context(open(f"{prefix}.{t}", "w", encoding="utf-8")) for t in range(THREADS)]
        for n in range(count):
            signature, body = delivery(run, n, program_id, now)
            files[n % THREADS].write(f"{signature}\t{body.decode()}\n")


def run_deliveries(
    label: str, url: str, program_id: str, tmp: Path, count: int, duration: int, connections: int
) -> tuple[WrkResult, Path]:
    run = f"{label[:1]}{time.time_ns() % 10**9}_"
    prefix = tmp / f"deliveries-{run}"
    write_deliveries(prefix, run, count, program_id)
    env = {"BENCH_DELIVERIES": str(prefix)}
    return wrk(label, url, SCRIPT, duration, connections, threads=THREADS, env=env), prefix


def post(url: str, signature: str, body: bytes) -> dict[str, Any]:
    headers = {"Stripe-Signature": signature, "Content-Type": "application/json"}
    answer: dict[str, Any] = httpx.post(
        url + "/webhooks/stripe", content=body, headers=headers, timeout=30
    ).json()
    return answer


def check(url: str, prefix: Path, program_id: str) -> dict[str, object]:
    """After the run: a replayed delivery is a duplicate, a fresh one is accepted and routed."""
    # wrk spends one request of its first thread checking the script, so take a later line
    signature, body = Path(f"{prefix}.0").read_text(encoding="utf-8").split("\n", 11)[10].split("\t", 1)
    replay = post(url, signature, body.encode())
    fresh = post(url, *delivery("check_", 0, program_id, int(time.time())))
    return {
        "replay_answered_duplicate": replay == {"data": {"received": True, "duplicate": True}},
        "fresh_routed_to_program": fresh.get("data", {}).get("program_id") == program_id,
    }


def _sides(duration: int, connections: int, tmp: Path) -> dict[str, Any]:
    """One round: the parse-only ceiling, the signed parse-only ceiling and tally, each measured
    with its CPU microseconds per request."""
    out: dict[str, Any] = {}
    with ceiling_process() as served:
        wrk("ceiling warm-up", served.url, CEILING_SCRIPT, 3, connections)
        before = cpu_seconds(served.pid)
        result = wrk("ceiling (parse JSON only)", served.url, CEILING_SCRIPT, duration, connections)
        out["ceiling"] = {"wrk": result, "cpu_us": (cpu_seconds(served.pid) - before) / result.requests * 1e6}
    with ceiling_process("webhook") as served:
        run_deliveries("signed warm-up", served.url, "prog_none", tmp, 20_000, 3, connections)
        before = cpu_seconds(served.pid)
        label = "signed parse-only"
        result, _ = run_deliveries(label, served.url, "prog_none", tmp, 50_000, duration, connections)
        out["signed"] = {"wrk": result, "cpu_us": (cpu_seconds(served.pid) - before) / result.requests * 1e6}

        def signed_lock(seconds: int) -> WrkResult:
            result, _ = run_deliveries(
                "signed lock", served.url, "prog_none", tmp, 50_000, seconds, connections
            )
            return result

        out["signed"].update(gil_window(served.pid, signed_lock))
    with tally_process() as served:
        program_id, _ = setup_program(served.url)
        warm, _ = run_deliveries("warm-up", served.url, program_id, tmp, 20_000, 3, connections)
        # Enough distinct deliveries for the measured run, from the warm-up's rate, with room.
        count = max(50_000, int(warm.rps * duration * 2))
        before = cpu_seconds(served.pid)
        label = "tally webhook (signed, durable)"
        result, prefix = run_deliveries(label, served.url, program_id, tmp, count, duration, connections)
        cpu = (cpu_seconds(served.pid) - before) / result.requests * 1e6
        out["tally"] = {
            "wrk": result,
            "cpu_us": cpu,
            "deliveries": count,
            **check(served.url, prefix, program_id),
        }
        more = max(20_000, int(warm.rps * 10))  # distinct deliveries for the lock's window

        def tally_lock(seconds: int) -> WrkResult:
            result, _ = run_deliveries("tally lock", served.url, program_id, tmp, more, seconds, connections)
            return result

        out["tally"].update(gil_window(served.pid, tally_lock))
    return out


def main(
    duration: int = int(os.environ.get("BENCH_SECONDS", "15")),
    connections: int = 32,
    rounds: int = int(os.environ.get("BENCH_ROUNDS", "3")),
) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tally-bench-webhook-"))
    samples: list[dict[str, Any]] = []
    try:
        for n in range(rounds):
            samples.append(_sides(duration, connections, tmp))
            print(f"  round {n + 1}: " + ", ".join(f"{k} {v['wrk'].rps:.0f}" for k, v in samples[-1].items()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table([side["wrk"] for sample in samples for side in sample.values()]))
    medians = {
        name: {
            "rps_median": round(statistics.median(s[name]["wrk"].rps for s in samples)),
            "rps_range": [
                round(min(s[name]["wrk"].rps for s in samples)),
                round(max(s[name]["wrk"].rps for s in samples)),
            ],
            "p99_ms_median": statistics.median(s[name]["wrk"].p99_ms for s in samples),
            "cpu_us_per_request_median": round(statistics.median(s[name]["cpu_us"] for s in samples), 1),
            "non_2xx": sum(s[name]["wrk"].non_2xx + s[name]["wrk"].socket_errors for s in samples),
        }
        for name in ("ceiling", "signed", "tally")
    }
    for name in ("signed", "tally"):
        medians[name].update(gil_medians([s[name] for s in samples]))
        if gil := medians[name].get("gil_us_per_request_median"):
            # the most one interpreter lock serves, against the signed parse-only endpoint's rate
            medians[name]["gil_bound_ratio_vs_signed"] = round(1e6 / gil / medians["signed"]["rps_median"], 3)
    tally = medians["tally"]["rps_median"]
    verdict: dict[str, object] = {
        "ratio_vs_signed_parse_only": round(tally / medians["signed"]["rps_median"], 3),
        "ratio_vs_ceiling": round(tally / medians["ceiling"]["rps_median"], 3),
        "every_request_a_new_event": all(
            s["tally"]["wrk"].requests <= s["tally"]["deliveries"] for s in samples
        ),
        "zero_non_2xx": medians["tally"]["non_2xx"] == 0 and medians["signed"]["non_2xx"] == 0,
        "replay_answered_duplicate": all(s["tally"]["replay_answered_duplicate"] for s in samples),
        "fresh_routed_to_program": all(s["tally"]["fresh_routed_to_program"] for s in samples),
    }
    verdict["target_ratio_met"] = verdict["ratio_vs_signed_parse_only"] >= 0.5  # type: ignore[operator]
    for name, m in medians.items():
        print(f"{name:>8}: {m}")
    print(verdict)
    payload: dict[str, object] = {
        "seconds": duration,
        "connections": connections,
        "rounds": rounds,
        "medians": medians,
        "samples": samples,
        **verdict,
        "machine_load": list(os.getloadavg()),
    }
    save("webhook", payload)
    return payload


if __name__ == "__main__":
    main()
