"""A SIGKILL while a payout batch is made, cancelled or a row of it marked failed (CONTRACT 15):
after a restart and the same call made again, one outcome, never two, never half.

Each kill lands at a known step of the call: the server stops at a pause point inside the
reconciler's `act` (ingest/pause.py: `act.decided`, nothing appended; `act.appended`, the row
durable and not reconciled; `act.reconciled`, reconciled and the caller not answered) and the
test checks the server reached it, with the call still unanswered, before it kills. Then the
restarted server answers the same call, and the log and the books are those of one call: one
batch row (one cancel, one failure), the lines held once, the statement's balance as an
uninterrupted run leaves it.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

from ingest.pause import PAUSE_ENV
from tests.conftest import OP, start_server
from tests.processes import kill, wait_until

UP_TO = "2099-12-31"
POINTS = ("act.decided", "act.appended", "act.reconciled")


def _seed(db: Path) -> tuple[dict[str, str], str]:
    """A program (0 holding days) with partners alice and bob, both paid by PayPal in USD, and
    12 attributed sales."""
    server = start_server(db)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
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
                details = {
                    "payout_method": "paypal",
                    "payout_email": f"{code}@paypal.test",
                    "payout_name": code,
                    "payout_currency": "usd",
                }
                r = c.patch(f"/api/v1/programs/{pid}/partners/{code}", json=details, headers=owner)
                assert r.status_code == 200, r.text
                click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": code})
                lead = {"customer_external_id": f"cust_{code}", "click_id": click.json()["data"]["click_id"]}
                assert c.post("/api/v1/track/lead", json=lead, headers=key).status_code == 200
            for n in range(12):
                sale = {
                    "transaction_id": f"tx_{n}",
                    "customer_external_id": f"cust_{'alice' if n % 3 else 'bob'}",
                    "amount": 1_000 + 37 * n,
                    "occurred_at": "2026-10-01T00:00:00Z",
                }
                assert c.post("/api/v1/track/sale", json=sale, headers=key).status_code == 200
            assert c.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    finally:
        server.stop()
    return owner, pid


def _batch(c: httpx.Client, owner: dict[str, str], pid: str) -> Any:
    return c.post(f"/api/v1/programs/{pid}/payouts", json={"up_to": UP_TO}, headers=owner)


def _call(c: httpx.Client, call: str, owner: dict[str, str], pid: str, payout_id: str | None) -> Any:
    if call == "batch":
        return _batch(c, owner, pid)
    if call == "cancel":
        return c.post(
            f"/api/v1/programs/{pid}/payouts/{payout_id}/cancel", json={"reason": "x"}, headers=owner
        )
    return c.post(
        f"/api/v1/programs/{pid}/payouts/{payout_id}/rows/bob/usd/failed",
        json={"reason": "bounced"},
        headers=owner,
    )


def _prepare(url: str, call: str, owner: dict[str, str], pid: str) -> str | None:
    """What the call needs first: an open batch (cancel), a paid one (row failed)."""
    if call == "batch":
        return None
    with httpx.Client(base_url=url, timeout=60) as c:
        r = _batch(c, owner, pid)
        assert r.status_code == 201, r.text
        payout_id: str = r.json()["data"]["payout_id"]
        if call == "failed":
            r = c.post(f"/api/v1/programs/{pid}/payouts/{payout_id}/paid", headers=owner)
            assert r.status_code == 200, r.text
    return payout_id


def _outcome(url: str, owner: dict[str, str], pid: str) -> tuple[Any, ...]:
    """The books a call leaves: the batches (status, rows with outcomes), every line's status and
    batch, bob's statement, without ids or times."""
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        batches = c.get(f"/api/v1/programs/{pid}/payouts", headers=owner).json()["data"]
        lines = c.get(f"/api/v1/programs/{pid}/commissions?limit=1000", headers=owner).json()["data"]
        bob = c.get(f"/api/v1/programs/{pid}/partners/bob/statement?currency=usd", headers=owner).json()[
            "data"
        ]
    ids = {b["payout_id"]: n for n, b in enumerate(reversed(batches))}
    return (
        [
            (b["status"], sorted((r["partner_code"], r["amount"], r["outcome"]) for r in b["rows"]))
            for b in batches
        ],
        sorted((x["transaction_id"], x["status"], ids.get(x["payout_id"])) for x in lines),
        [(e["kind"], e["amount"], e["balance"]) for e in bob["entries"]],
    )


def _acts(db: Path, kind: str) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT count(*) FROM raw_events WHERE kind = ?", [kind]).fetchone()
    return int(row[0]) if row else 0


KIND = {"batch": "payout_batch", "cancel": "payout_cancel", "failed": "payout_row_failed"}


@pytest.mark.slow
@pytest.mark.parametrize("call", ["batch", "cancel", "failed"])
def test_a_kill_at_each_step_of_a_payout_act_leaves_one_outcome(tmp_path: Path, call: str) -> None:
    seeded = tmp_path / "seed"
    seeded.mkdir()
    owner, pid = _seed(seeded / "t.duckdb")

    def copy(name: str) -> Path:
        shutil.copytree(seeded, tmp_path / name)
        return tmp_path / name / "t.duckdb"

    clean = start_server(copy("clean"))
    try:
        payout_id = _prepare(clean.url, call, owner, pid)
        with httpx.Client(base_url=clean.url, timeout=60) as c:
            assert _call(c, call, owner, pid, payout_id).status_code in (200, 201)
        expected = _outcome(clean.url, owner, pid)
    finally:
        clean.stop()

    for point in POINTS:
        db = copy(point)
        ready = start_server(db)
        try:
            payout_id = _prepare(ready.url, call, owner, pid)
        finally:
            ready.stop()
        marker = tmp_path / f"{point}.paused"
        server = start_server(db, **{PAUSE_ENV: f"{point}:{marker}"})
        answered: list[Any] = []

        def send(
            url: str = server.url, payout: str | None = payout_id, answered: list[Any] = answered
        ) -> None:
            try:
                with httpx.Client(base_url=url, timeout=120) as c:
                    answered.append(_call(c, call, owner, pid, payout))
            except httpx.HTTPError:
                pass  # the server died under the call

        sender = threading.Thread(target=send)
        sender.start()
        wait_until(marker.exists, f"the call to reach {point}", 120)
        assert int(marker.read_text()) == server.process.pid
        assert answered == [], f"{point}: the call returned before the kill"
        kill(server.process)
        sender.join(60)
        assert answered == [], f"{point}: the call was answered by a killed server"
        # where the kill landed, seen in the log: nothing appended yet, or the act's one row
        assert _acts(db, KIND[call]) == (0 if point == "act.decided" else 1), point
        restarted = start_server(db)
        try:
            with httpx.Client(base_url=restarted.url, timeout=60) as c:
                r = _call(c, call, owner, pid, payout_id)
                assert r.status_code in (200, 201), r.text
            assert _outcome(restarted.url, owner, pid) == expected, point
        finally:
            restarted.stop()
        assert _acts(db, KIND[call]) == 1, point  # one batch, one cancel, one failure: never two
