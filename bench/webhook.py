"""bench/webhook: signed `POST /webhooks/stripe` deliveries per second versus the ingest ceiling.

Each request is a distinct, properly signed Connect delivery (a live `checkout.session.completed`
with attribution metadata, unique event, session and payment-intent ids), so every one goes
through signature verification, parsing, routing, the duplicate check and a durable append that
claims three idempotency keys. wrk cannot compute HMAC-SHA256 per request, so the deliveries are
signed here just before the run (timestamps stay within the default 300 s tolerance) and
bench/webhook.lua replays them, one per request. The ceiling is bench/ingest's: a bare Starlette
endpoint that only parses JSON, measured in the same run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    WEBHOOK_SECRET,
    WrkResult,
    ceiling_server,
    setup_program,
    side_by_side,
    tally_server,
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


def main(
    duration: int = int(os.environ.get("BENCH_SECONDS", "15")), connections: int = 32
) -> dict[str, object]:
    with ceiling_server() as url:
        wrk("ceiling warm-up", url, CEILING_SCRIPT, 3, connections)
        ceiling = wrk("ceiling (parse JSON only)", url, CEILING_SCRIPT, duration, connections)
    tmp = Path(tempfile.mkdtemp(prefix="tally-bench-webhook-"))
    try:
        with tally_server() as url:
            program_id, _ = setup_program(url)
            warm, _ = run_deliveries("warm-up", url, program_id, tmp, 20_000, 3, connections)
            # Enough distinct deliveries for the measured run, from the warm-up's rate, with room.
            count = max(50_000, int(warm.rps * duration * 2))
            webhook, prefix = run_deliveries(
                "tally webhook (signed, durable)", url, program_id, tmp, count, duration, connections
            )
            checks = check(url, prefix, program_id)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = webhook.rps / ceiling.rps
    verdict: dict[str, object] = {
        "ratio_vs_ceiling": round(ratio, 3),
        "deliveries_signed": count,
        "every_request_a_new_event": webhook.requests <= count,
        "zero_non_2xx": webhook.non_2xx == 0 and webhook.socket_errors == 0,
        **checks,
    }
    return side_by_side("webhook", ceiling, webhook, connections, duration, verdict)


if __name__ == "__main__":
    main()
