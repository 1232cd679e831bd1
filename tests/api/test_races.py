"""Races across paths (CONTRACT sections 4, 5 and 7), many rounds from threads against one app:

- the connect webhook and self-hosted `track/sale` report the same sale at the same moment: the
  sale is counted once whatever arrives first, the processor's record is the one counted, and the
  double-counting report lists the other;
- partial refunds of one sale arrive together and add up to more than the sale: exactly the ones
  that fit are accepted, the rest are refused `refund_exceeds_sale`.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tests.conftest import OP, World, make_world
from tests.helpers import ACCOUNT, LIVE_CHECKOUT, deliver, query
from tests.stripe_fixtures import load_event, serialise

ROUNDS = 24
# The checkout fixture's ids (one occurrence each): invoice, payment intent, checkout session.
FIXTURE_IDS = (
    "in_1KJqKBJDPojXS6LNJbvLUgEy",
    "pi_1IqxJOJDPojXS6LN9uOebAea",
    "cs_live_9RBjcHiy2i5p99Tf1MYM90c3SHK1grU0E6Ae6pKWR2KPA4ZiuKiB2X1Y3X",
)
CONNECT_AMOUNT, CONNECT_CURRENCY = 934, "eur"  # the processor charged 9.99 incl. 0.65 tax: net 9.34
TRACKED_AMOUNT = 12_345  # what the brand's server reports (usd): never the amount counted


@pytest.fixture
def connected(client: TestClient) -> World:
    return make_world(client, stripe_account_id=ACCOUNT)


def round_ids(n: int) -> tuple[str, str, str]:
    """Round `n`'s own invoice, payment intent and checkout session ids."""
    return (f"in_race{n:03d}", f"pi_race{n:03d}", f"cs_live_race{n:03d}")


def checkout_body(n: int) -> bytes:
    """The live checkout fixture as round `n`'s delivery: its own event id and sale ids."""
    text = serialise(load_event(LIVE_CHECKOUT, account=ACCOUNT, event_id=f"evt_race{n:03d}")).decode()
    for fixture_id, own in zip(FIXTURE_IDS, round_ids(n), strict=True):
        assert text.count(fixture_id) == 1, fixture_id
        text = text.replace(fixture_id, own)
    return text.encode()


def track_body(n: int) -> dict[str, Any]:
    """Round `n`'s self-hosted report of the same sale, by one of the processor's ids."""
    return {
        "transaction_id": round_ids(n)[n % 3],
        "customer_external_id": f"cust_race{n:03d}",
        "amount": TRACKED_AMOUNT,
        "occurred_at": "2026-01-15T10:00:00Z",
    }


def reconcile(client: TestClient) -> None:
    r = client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text


def sales(world: World) -> list[dict[str, Any]]:
    r = world.client.get(f"/api/v1/programs/{world.program_id}/sales?limit=1000", headers=world.owner)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["data"]
    return rows


def double_counts(world: World) -> list[dict[str, Any]]:
    r = world.client.get(f"/api/v1/programs/{world.program_id}/reports/double-counting", headers=world.owner)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["data"]["double_counts"]
    return rows


def test_connect_webhook_and_track_sale_racing_count_the_sale_once(connected: World) -> None:
    client = connected.client
    calls = [("webhook", n) for n in range(ROUNDS)] + [("track", n) for n in range(ROUNDS)]
    random.Random(20261121).shuffle(calls)  # sometimes one path is first in line, sometimes the other

    def call(item: tuple[str, int]) -> tuple[str, int, httpx.Response]:
        path, n = item
        if path == "webhook":
            return path, n, deliver(client, checkout_body(n))
        return path, n, client.post("/api/v1/track/sale", json=track_body(n), headers=connected.key)

    with ThreadPoolExecutor(8) as pool:
        answers = {(path, n): r for path, n, r in pool.map(call, calls)}

    track_won = set()
    for n in range(ROUNDS):
        webhook, track = answers["webhook", n], answers["track", n]
        assert webhook.status_code == 200, webhook.text
        assert webhook.json()["data"]["duplicate"] is False  # a new event, whoever came first
        if track.status_code == 200:
            track_won.add(n)
        else:
            assert (track.status_code, track.json()["error"]["code"]) == (409, "duplicate_transaction")

    # The writer serialises the two: the raw log's order is the order they happened in, and the
    # answers agree with it (the track call is refused exactly when the delivery came first).
    seqs = dict(query(client, "SELECT event_id, seq FROM raw_events WHERE kind = 'stripe'"))
    tracked = dict(query(client, "SELECT transaction_id, seq FROM raw_events WHERE kind = 'sale'"))
    for n in range(ROUNDS):
        track_first = tracked[track_body(n)["transaction_id"]] < seqs[f"evt_race{n:03d}"]
        assert (n in track_won) is track_first, n

    reconcile(client)
    counted = sales(connected)
    assert len(counted) == ROUNDS  # one sale per round, not two
    by_invoice = {s["transaction_id"]: s for s in counted}
    for n in range(ROUNDS):
        sale = by_invoice[round_ids(n)[0]]  # a connect sale is listed by its invoice id
        assert (sale["source"], sale["amount"], sale["currency"]) == (
            "connect",
            CONNECT_AMOUNT,
            CONNECT_CURRENCY,
        ), n

    listed = {row["duplicate_transaction_id"]: row for row in double_counts(connected)}
    assert len(listed) == ROUNDS
    for n in range(ROUNDS):
        row = listed[track_body(n)["transaction_id"]]
        expected = "connect_and_self_hosted" if n in track_won else "ingest_refused"
        counted_id = by_invoice[round_ids(n)[0]]["sale_id"]
        assert (row["kind"], row["sale_id"]) == (expected, counted_id), n


@pytest.mark.parametrize("track_first", [True, False])
def test_either_order_in_turn_counts_the_processor_record(connected: World, track_first: bool) -> None:
    """The two outcomes the race can have, each forced: what the race test relies on."""
    client = connected.client

    def track() -> httpx.Response:
        return client.post("/api/v1/track/sale", json=track_body(0), headers=connected.key)

    if track_first:
        tracked, delivered = track(), deliver(client, checkout_body(0))
    else:
        delivered = deliver(client, checkout_body(0))
        tracked = track()
    assert delivered.status_code == 200
    assert tracked.status_code == (200 if track_first else 409)
    reconcile(client)
    [sale] = sales(connected)
    assert (sale["source"], sale["transaction_id"], sale["amount"]) == (
        "connect",
        round_ids(0)[0],
        CONNECT_AMOUNT,
    )
    [row] = double_counts(connected)
    expected = "connect_and_self_hosted" if track_first else "ingest_refused"
    assert (row["kind"], row["duplicate_transaction_id"], row["sale_id"]) == (
        expected,
        track_body(0)["transaction_id"],
        sale["sale_id"],
    )


@pytest.mark.parametrize(("amount", "size"), [(1000, 300), (1000, 250), (999, 1000)])
def test_concurrent_partial_refunds_accept_exactly_the_ones_that_fit(
    world: World, amount: int, size: int
) -> None:
    client, rounds, per_sale = world.client, 8, 10
    fit = amount // size
    for n in range(rounds):
        txn = f"in_refund{n}"
        r = world.sale(transaction_id=txn, customer_external_id=f"c{n}", amount=amount)
        assert r.status_code == 200, r.text
        start = threading.Barrier(per_sale)

        def post(i: int, txn: str = txn, start: threading.Barrier = start) -> httpx.Response:
            body = {"transaction_id": txn, "refund_id": f"re_{txn}_{i}", "amount": size}
            start.wait(10)  # all of this sale's refunds leave together
            return client.post("/api/v1/track/refund", json=body, headers=world.key)

        with ThreadPoolExecutor(per_sale) as pool:
            answers = list(pool.map(post, range(per_sale)))
        accepted = [r for r in answers if r.status_code == 200]
        assert len(accepted) == fit, [r.text for r in answers]
        for r in accepted:
            assert "warnings" not in r.json(), r.text
        for r in answers:
            if r.status_code != 200:
                assert (r.status_code, r.json()["error"]["code"]) == (422, "refund_exceeds_sale"), r.text

    reconcile(client)
    refunded = {s["transaction_id"]: s["refunded"] for s in sales(world)}
    assert refunded == {f"in_refund{n}": fit * size for n in range(rounds)}
