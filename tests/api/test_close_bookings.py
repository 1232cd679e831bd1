"""A period close is a booking (issue #48): the run after a close books the month's lines as of
the close into the log once (`close_booking` rows, then a `close_booked` marker), and every
later run reads them back instead of valuing the log before the close again. The books are the
same either way; a booking cut short before its marker is never read and is made again. And a
close or an action on one program's money holds its program's reconcile partition only: the
programs of other partitions are not answered 409 meanwhile."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import time_machine
from starlette.testclient import TestClient

from api.app import create_app
from ingest.storage.partitions import part_of
from reconcile import periods
from reconcile.pipeline import reconcile
from reconcile.run import backfill_inputs
from tests.conftest import OP, World, bearer, make_world
from tests.helpers import at, query
from tests.pg import Server
from tests.reconcile import builders as b
from tests.reconcile.apps import replica_settings
from tests.reconcile.builders import at as day

LINE = ("transaction_id", "partner_code", "kind", "period", "amount", "status")


def _lines(world: World) -> list[tuple[Any, ...]]:
    r = world.client.get(f"/api/v1/programs/{world.program_id}/commissions", headers=world.owner)
    assert r.status_code == 200, r.text
    return sorted(tuple(row[c] for c in LINE) for row in r.json()["data"])


def _close(world: World, period: str) -> None:
    r = world.client.post(f"/api/v1/programs/{world.program_id}/periods/{period}/close", headers=world.owner)
    assert r.status_code == 200, r.text


def test_a_close_is_booked_once_and_read_back_by_every_later_run(
    client: TestClient, clock: time_machine.Traveller, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world(client)  # 30 % commission; the customer comes through alice's link
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    lead = {"customer_external_id": "cust_1", "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    for tx, amount, when in (("tx_1", 10_000, "2026-01-05"), ("tx_2", 20_000, "2026-01-10")):
        made = world.sale(
            transaction_id=tx, amount=amount, customer_external_id="cust_1", occurred_at=f"{when}T12:00:00Z"
        )
        assert made.status_code == 200, made.text
    clock.move_to(at("2026-02-05T09:00:00Z"))
    _close(world, "2026-01")

    ((close_seq,),) = query(client, "SELECT seq FROM raw_events WHERE kind = 'period_close'")
    marks = query(client, "SELECT body FROM raw_events WHERE kind = 'close_booked'")
    assert [json.loads(body)["close_seq"] for (body,) in marks] == [close_seq]
    held = query(
        client, "SELECT transaction_id, body FROM raw_events WHERE kind = 'close_booking' ORDER BY 1"
    )
    assert [tx for tx, _ in held] == ["tx_1", "tx_2"]  # one row per sale of the closed month
    assert [line["amount"] for _, body in held for line in json.loads(body)["lines"]] == [3_000, 6_000]
    january = _lines(world)

    # From now on no run values the log before the January close again.
    valued: list[list[int]] = []
    real = periods.stacked

    def spy(log: pl.LazyFrame, snaps: pl.DataFrame) -> pl.LazyFrame:
        valued.append(snaps.get_column("seq").to_list())
        return real(log, snaps)

    monkeypatch.setattr(periods, "stacked", spy)
    clock.move_to(at("2026-02-06T09:00:00Z"))
    body = {"transaction_id": "tx_1", "refund_id": "re_1", "amount": 4_000}
    assert client.post("/api/v1/track/refund", json=body, headers=world.key).status_code == 200
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    clock.move_to(at("2026-03-03T09:00:00Z"))
    _close(world, "2026-02")
    assert valued and all(close_seq not in seqs for seqs in valued), valued
    assert len(query(client, "SELECT 1 FROM raw_events WHERE kind = 'close_booked'")) == 2

    # January keeps its lines; the refund is a line of February, the first month open then.
    after = _lines(world)
    assert [line[:5] for line in after if line[3] == "2026-01"] == [line[:5] for line in january]
    assert [line[4:] for line in after if line[0] == "tx_1" and line[3] == "2026-02"] == [
        (-1_200, "approved")
    ]

    # The books read back equal the books valued from the log's prefixes.
    monkeypatch.setattr(periods, "stacked", real)
    raw, programs, partners, _ = backfill_inputs(client.app.state.tally.store, world.program_id)  # type: ignore[attr-defined]
    now = at("2026-03-03T10:00:00Z")
    booked = reconcile(raw, programs, partners, now).commissions
    valued_again = reconcile(
        raw.filter(~pl.col("kind").is_in(periods.KINDS)), programs, partners, now
    ).commissions
    assert periods.unbooked(raw.lazy()) == ()
    assert periods.unbooked(raw.filter(~pl.col("kind").is_in(periods.KINDS)).lazy()) == (world.program_id,)
    order = ["sale_id", "partner_code", "kind", "cause", "period"]
    assert booked.sort(order).equals(valued_again.sort(order))


def test_a_booking_cut_short_is_never_read_and_is_made_again() -> None:
    rows = [
        b.click("clk_1", "p1", occurred_at=day(0)),
        b.lead("lead_1", "ck_1", click_id="clk_1", occurred_at=day(1)),
        b.track_sale("s1", "tx_1", 10_000, customer_key="ck_1", occurred_at=day(5)),
        b.track_sale("s2", "tx_2", 20_000, customer_key="ck_1", occurred_at=day(9)),
        b.period_close("close_jan", "2026-01", occurred_at=day(35)),
    ]
    people = b.partners(("p1", None), ("p2", None))
    booked = b.close_bookings(rows, day(36), people)
    assert [r["kind"] for r in booked] == ["close_booking", "close_booking", "close_booked"]
    later = [b.track_refund("re_1", "tx_1", 5_000, occurred_at=day(40))]

    def lines(log: list[dict[str, Any]]) -> pl.DataFrame:
        result = reconcile(b.frame(log), b.programs(), people, day(60))
        return result.commissions.select(*LINE, "cause").sort(LINE)

    whole = lines([*rows, *booked, *later])
    assert whole.equals(lines([*rows, *later]))  # read back = valued again

    # the marker never made it (a crash): the rows are ignored, the close is still to book
    cut = [*rows, *booked[:-1]]
    assert periods.unbooked(b.frame(cut).lazy()) == (b.PROGRAM,)
    altered = [{**r, "body": r["body"].replace("1000", "999")} for r in booked[:-1]]
    assert lines([*rows, *altered, *later]).equals(lines([*rows, *later]))
    again = b.close_bookings([*rows, *altered], day(37), people)
    assert json.loads(again[-1]["body"])["booking_id"] != json.loads(booked[-1]["body"])["booking_id"]
    assert lines([*rows, *altered, *again, *later]).equals(whole)
    assert periods.unbooked(b.frame([*rows, *altered, *again]).lazy()) == ()


def _program(client: TestClient, n: int) -> tuple[str, dict[str, str]]:
    """A workspace of its own with one program and partner alice: (program id, owner headers)."""
    r = client.post(
        "/api/v1/operator/accounts",
        json={"email": f"owner{n}@brand.test", "workspace_name": f"Brand {n}"},
        headers=OP,
    )
    assert r.status_code == 201, r.text
    account = r.json()["data"]
    owner = bearer(account["token"])
    r = client.post(
        "/api/v1/programs", json={"workspace_id": account["workspace_id"], "name": f"P{n}"}, headers=owner
    )
    assert r.status_code == 201, r.text
    program_id: str = r.json()["data"]["program_id"]
    partner = {"code": "alice", "name": "Alice", "email": "alice@partner.test"}
    assert (
        client.post(f"/api/v1/programs/{program_id}/partners", json=partner, headers=owner).status_code == 201
    )
    return program_id, owner


def test_a_close_or_payout_holds_its_programs_partition_only(pg_server: Server, tmp_path: Path) -> None:
    database = pg_server.fresh_database()
    with TestClient(create_app(replica_settings(database, str(tmp_path / "one")))) as client:
        (first, first_owner), (second, second_owner) = _program(client, 1), _program(client, 2)
    parts = next(n for n in range(2, 64) if part_of(first, n) != part_of(second, n))
    with TestClient(create_app(replica_settings(database, str(tmp_path / "two"), parts))) as client:
        reconciler = client.app.state.tally.reconciler  # type: ignore[attr-defined]
        inside, leave = threading.Event(), threading.Event()

        def decide() -> None:  # an action on the first program, deciding slowly
            inside.set()
            leave.wait(60)

        acting = threading.Thread(target=reconciler.act, args=(decide, first))
        acting.start()
        try:
            assert inside.wait(60)
            busy = client.post(f"/api/v1/programs/{first}/periods/2026-01/close", headers=first_owner)
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "reconcile_running", busy.text
            entry = {"amount": 500, "currency": "usd", "reason": "launch bonus"}
            path = f"/api/v1/programs/{second}/partners/alice/adjustments"
            made = client.post(path, json=entry, headers=second_owner)
            assert made.status_code == 201, made.text
            closed = client.post(f"/api/v1/programs/{second}/periods/2026-01/close", headers=second_owner)
            assert closed.status_code == 200, closed.text
            made = client.post(
                f"/api/v1/programs/{first}/partners/alice/adjustments", json=entry, headers=first_owner
            )
            assert made.status_code == 409, made.text
        finally:
            leave.set()
            acting.join(60)
        assert (
            client.post(f"/api/v1/programs/{first}/periods/2026-01/close", headers=first_owner).status_code
            == 200
        )
