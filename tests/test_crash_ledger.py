"""A SIGKILL while a payout batch is made or marked paid: restarted, and the call made again,
the books are those of an uninterrupted run (same lines, same batch rows, no line paid twice).
Each kill lands at a different point of the call (a fraction of the uninterrupted call's
duration), on a fresh copy of the same database."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import OP, start_server
from tests.processes import kill

UP_TO = "2099-12-31"


def _seed(db: Path) -> tuple[dict[str, str], str]:
    """A program (0 holding days) with partners alice and bob (with payout details) and 40
    attributed sales."""
    server = start_server(db)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            acct = c.post(
                "/api/v1/operator/accounts", json={"email": "o@x.test", "workspace_name": "W"}, headers=OP
            ).json()["data"]
            owner = {"Authorization": f"Bearer {acct['token']}"}
            body = {"workspace_id": acct["workspace_id"], "name": "P", "holding_days": 0}
            pid = c.post("/api/v1/programs", json=body, headers=owner).json()["data"]["program_id"]
            key = {
                "Authorization": "Bearer "
                + c.post(f"/api/v1/programs/{pid}/api-key", headers=owner).json()["data"]["api_key"]
            }
            for code in ("alice", "bob"):
                c.post(f"/api/v1/programs/{pid}/partners", json={"code": code, "name": code}, headers=owner)
                details = {  # a batch pays only partners with payout details
                    "payout_method": "paypal",
                    "payout_email": f"{code}@paypal.test",
                    "payout_name": code.title(),
                    "payout_currency": "usd",
                }
                r = c.patch(f"/api/v1/programs/{pid}/partners/{code}", json=details, headers=owner)
                assert r.status_code == 200, r.text
                click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": code})
                lead = {"customer_external_id": f"cust_{code}", "click_id": click.json()["data"]["click_id"]}
                assert c.post("/api/v1/track/lead", json=lead, headers=key).status_code == 200
            for n in range(40):
                sale = {
                    "transaction_id": f"tx_{n}",
                    "customer_external_id": f"cust_{'alice' if n % 3 else 'bob'}",
                    "amount": 1_000 + 37 * n,
                    "occurred_at": "2026-10-01T00:00:00Z",
                }
                assert c.post("/api/v1/track/sale", json=sale, headers=key).status_code == 200
    finally:
        server.stop()
    return owner, pid


def _books(url: str, owner: dict[str, str], pid: str) -> tuple[list[Any], list[Any]]:
    """(every line, every batch's rows), without ids or times."""
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        lines = c.get(f"/api/v1/programs/{pid}/commissions?limit=1000", headers=owner).json()["data"]
        batches = c.get(f"/api/v1/programs/{pid}/payouts", headers=owner).json()["data"]
    return (
        sorted(
            (
                x["transaction_id"],
                x["kind"],
                x["partner_code"],
                x["amount"],
                x["status"],
                x["payout_id"] is not None,
            )
            for x in lines
        ),
        [
            (b["status"], sorted((r["partner_code"], r["amount"], r["lines"]) for r in b["rows"]))
            for b in batches
        ],
    )


def _make_and_pay(url: str, owner: dict[str, str], pid: str) -> None:
    """Make the batch (again: the existing one) and mark it paid (again: no change)."""
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": UP_TO}, headers=owner)
        assert r.status_code in (200, 201), r.text
        payout_id = r.json()["data"]["payout_id"]
        assert payout_id is not None
        r = c.post(f"/api/v1/programs/{pid}/payouts/{payout_id}/paid", headers=owner)
        assert r.status_code == 200, r.text


def _killed_during(url: str, server: Any, call: str, owner: dict[str, str], pid: str, after: float) -> None:
    """Send the call, SIGKILL the server `after` seconds in."""

    def send() -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as c:
                if call == "batch":
                    c.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": UP_TO}, headers=owner)
                else:
                    batches = c.get(f"/api/v1/programs/{pid}/payouts", headers=owner).json()["data"]
                    if batches:
                        c.post(
                            f"/api/v1/programs/{pid}/payouts/{batches[0]['payout_id']}/paid", headers=owner
                        )
        except httpx.HTTPError:
            pass  # the server died under the call

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(after)
    kill(server.process)
    sender.join(30)


@pytest.mark.slow
def test_sigkill_while_a_batch_is_made_or_paid_leaves_the_books_of_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    seeded = tmp_path / "seed"
    seeded.mkdir()
    owner, pid = _seed(seeded / "t.duckdb")

    def copy(name: str) -> Path:
        shutil.copytree(seeded, tmp_path / name)
        return tmp_path / name / "t.duckdb"

    clean = start_server(copy("clean"))
    try:
        started = time.monotonic()
        _make_and_pay(clean.url, owner, pid)
        took = time.monotonic() - started
        expected = _books(clean.url, owner, pid)
    finally:
        clean.stop()
    assert len(expected[1]) == 1 and expected[1][0][0] == "paid"
    assert all(line[4] == "paid" for line in expected[0])

    for n, (call, fraction) in enumerate(
        [("batch", 0.1), ("batch", 0.3), ("batch", 0.5), ("paid", 0.7), ("paid", 0.9)]
    ):
        db = copy(f"crash_{n}")
        if call == "paid":  # a batch made first, then the kill while it is marked paid
            server = start_server(db)
            with httpx.Client(base_url=server.url, timeout=60) as c:
                r = c.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": UP_TO}, headers=owner)
                assert r.status_code == 201, r.text
        else:
            server = start_server(db)
        _killed_during(server.url, server, call, owner, pid, took * fraction)
        restarted = start_server(db)
        try:
            _make_and_pay(restarted.url, owner, pid)
            assert _books(restarted.url, owner, pid) == expected, (call, fraction)
        finally:
            restarted.stop()
