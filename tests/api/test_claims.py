"""Claims (ingest/domain/keys.py): every kind of id claims in a space of its own, so no sale id
takes a refund's or a promo code's claim, whichever comes first and whether the sale is tracked
or the processor's; and each program claims on its own, so two programs of one workspace each
take the same ids. Duplicates of each kind stay refused, one after the other and at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.testclient import TestClient

from tests.conftest import World, bearer, make_world
from tests.helpers import ACCOUNT, deliver, renewal_event


@dataclass(frozen=True)
class Program:
    """One program of the world's workspace, with its key."""

    client: TestClient
    program_id: str
    key: dict[str, str]
    owner: dict[str, str]

    def sale(self, txn: str) -> httpx.Response:
        body = {"transaction_id": txn, "customer_external_id": "cust_1", "amount": 1000}
        return self.client.post("/api/v1/track/sale", json=body, headers=self.key)

    def refund(self, refund_id: str, txn: str = "in_1") -> httpx.Response:
        body = {"transaction_id": txn, "refund_id": refund_id, "amount": 10}
        return self.client.post("/api/v1/track/refund", json=body, headers=self.key)

    def promo(self, code: str, promotion_code_id: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"code": code}
        if promotion_code_id is not None:
            body["promotion_code_id"] = promotion_code_id
        path = f"/api/v1/programs/{self.program_id}/partners/alice/promo-codes"
        return self.client.post(path, json=body, headers=self.owner)


def first(world: World) -> Program:
    return Program(world.client, world.program_id, world.key, world.owner)


def second(world: World) -> Program:
    """A second program in the world's workspace, with its own key and partner `alice`."""
    c = world.client
    r = c.post(
        "/api/v1/programs", json={"workspace_id": world.workspace_id, "name": "Second"}, headers=world.owner
    )
    assert r.status_code == 201, r.text
    program_id = r.json()["data"]["program_id"]
    r = c.post(f"/api/v1/programs/{program_id}/api-key", headers=world.owner)
    assert r.status_code == 201, r.text
    key = bearer(r.json()["data"]["api_key"])
    r = c.post(
        f"/api/v1/programs/{program_id}/partners", json={"code": "alice", "name": "A"}, headers=world.owner
    )
    assert r.status_code == 201, r.text
    return Program(c, program_id, key, world.owner)


def refused(r: httpx.Response, status: int, code: str) -> bool:
    return r.status_code == status and r.json()["error"]["code"] == code


def test_no_sale_id_takes_a_refunds_or_a_promo_codes_claim(client: TestClient) -> None:
    world = make_world(client, stripe_account_id=ACCOUNT)
    p = first(world)
    # the sale first: its id is what the refund's or the promo code's claim used to be
    assert p.sale("refund:r77").status_code == 200
    assert p.refund("r77", txn="refund:r77").status_code == 200
    assert p.sale("promo_code:SPRING").status_code == 200
    assert p.sale("promotion_code:promo_1").status_code == 200
    assert p.promo("SPRING", "promo_1").status_code == 201
    # the refund or the promo code first
    assert p.refund("r88").status_code == 200
    assert p.sale("refund:r88").status_code == 200
    assert p.promo("AUTUMN", "promo_2").status_code == 201
    assert p.sale("promo_code:AUTUMN").status_code == 200
    assert p.sale("promotion_code:promo_2").status_code == 200
    # the processor's sale, known by its invoice id: one kind with tracked sales, none with refunds
    r = deliver(client, renewal_event("evt_claims_1", "refund:r99"))
    assert r.status_code == 200 and r.json()["data"]["duplicate"] is False, r.text
    assert p.refund("r99").status_code == 200
    assert refused(p.sale("refund:r99"), 409, "duplicate_transaction")  # the processor's sale
    # every duplicate is still one
    assert refused(p.sale("refund:r77"), 409, "duplicate_transaction")
    assert refused(p.sale("promo_code:AUTUMN"), 409, "duplicate_transaction")
    for refund_id in ("r77", "r88", "r99"):
        assert refused(p.refund(refund_id), 409, "duplicate_refund")
    assert refused(p.promo("spring"), 409, "conflict")
    assert refused(p.promo("OTHER", "promo_2"), 409, "conflict")


def test_each_program_of_a_workspace_claims_on_its_own(world: World) -> None:
    """The second program's first sale, refund and promo code are its own, though the first
    program of the same workspace took the same ids (a claim scoped by workspace refuses them)."""
    programs = [first(world), second(world)]
    for p in programs:
        assert p.sale("in_1").status_code == 200, p.program_id
        assert p.refund("re_1").status_code == 200, p.program_id
        assert p.promo("SPRING", "promo_1").status_code == 201, p.program_id
    for p in programs:
        assert refused(p.sale("in_1"), 409, "duplicate_transaction"), p.program_id
        assert refused(p.refund("re_1"), 409, "duplicate_refund"), p.program_id
        assert refused(p.promo("SPRING"), 409, "conflict"), p.program_id


def test_at_once_each_kind_and_program_takes_each_id_exactly_once(world: World) -> None:
    """Four copies each of a sale `x`, a sale `refund:x`, a refund `x` and a promo code `X` in two
    programs of one workspace, all sent together: in each program, one of each is accepted and
    the others are duplicates."""
    programs = [first(world), second(world)]
    calls = [
        (n, kind, copy)
        for n in range(len(programs))
        for kind in ("sale", "sale-as-refund", "refund", "promo")
        for copy in range(4)
    ]
    start = threading.Barrier(len(calls))

    def call(item: tuple[int, str, int]) -> tuple[int, str, httpx.Response]:
        n, kind, _ = item
        p = programs[n]
        start.wait(30)
        if kind == "sale":
            return n, kind, p.sale("x")
        if kind == "sale-as-refund":
            return n, kind, p.sale("refund:x")
        if kind == "refund":
            return n, kind, p.refund("x", txn="x")
        return n, kind, p.promo("X")

    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(call, calls))
    duplicate = {"sale": "duplicate_transaction", "sale-as-refund": "duplicate_transaction"}
    duplicate |= {"refund": "duplicate_refund", "promo": "conflict"}
    for n in range(len(programs)):
        for kind, code in duplicate.items():
            got = [r for m, k, r in answers if (m, k) == (n, kind)]
            assert sorted(r.status_code for r in got) == [200 if kind != "promo" else 201] + [409] * 3, kind
            assert all(refused(r, 409, code) for r in got if r.status_code == 409), kind
