"""The partners' portal pages through the real app, on both backends: what a signed-in partner
sees of each program they belong to (CONTRACT 14), that they see only their own rows (another
partner's program, payout or page: 404, never a word of it; customers' emails and keys never),
and CSRF on every form."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import time_machine
from starlette.testclient import TestClient

from tests.conftest import OP, World, bearer, make_world
from tests.helpers import payee

SIGN_IN = re.compile(r"/partner/sign-in/(ptl_[A-Za-z0-9]+)")
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(at("2026-01-05T09:00:00Z"), tick=True) as traveller:
        yield traveller


def add_partner(world: World, code: str, email: str | None, program_id: str | None = None) -> None:
    body: dict[str, Any] = {"code": code, "name": code.title()}
    if email:
        body["email"] = email
    r = world.client.post(
        f"/api/v1/programs/{program_id or world.program_id}/partners", json=body, headers=world.owner
    )
    assert r.status_code == 201, r.text


def link(world: World, code: str, program_id: str | None = None) -> str:
    r = world.client.post(
        f"/api/v1/programs/{program_id or world.program_id}/partners/{code}/portal-link", headers=world.owner
    )
    assert r.status_code == 201, r.text
    found = SIGN_IN.search(r.json()["data"]["url"])
    assert found is not None
    return found.group(1)


def sign_in(client: TestClient, token: str) -> str:
    """Sign in with `token`; the session's CSRF token (from the portal's front page)."""
    client.cookies.clear()
    page = client.get(f"/partner/sign-in/{token}")
    csrf = CSRF.search(page.text)
    assert csrf is not None
    r = client.post(
        "/partner/sign-in", data={"token": token, "csrf_token": csrf.group(1)}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    home = client.get("/partner")
    found = CSRF.search(home.text)
    assert found is not None
    return found.group(1)


def referred(world: World, code: str, tx: str, amount: int, email: str) -> None:
    client = world.client
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": code})
    customer = f"secret_key_{tx}"
    lead = {"customer_external_id": customer, "click_id": click.json()["data"]["click_id"], "email": email}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    r = world.sale(transaction_id=tx, customer_external_id=customer, amount=amount, email=email)
    assert r.status_code == 200, r.text


@pytest.fixture
def brand(client: TestClient, clock: time_machine.Traveller) -> World:
    """Program "Brand partners" (site https://brand.test, no holding days) with alice and bob,
    each with a referred sale, a promo code of alice's, a refund, a held sale of bob's, payout
    details (paypal, usd) and an open batch paying both; and a second program of the brand where
    alice (same email) is `alice2`."""
    world = make_world(client, holding_days=0, website_url="https://brand.test/welcome?lang=en")
    add_partner(world, "bob", "bob@partner.test")
    referred(world, "alice", "tx_alice", 10_000, "customer-a@shop.test")
    referred(world, "bob", "tx_bob", 20_000, "customer-b@shop.test")
    referred(world, "bob", "tx_bob_held", 5_000, "customer-c@shop.test")
    r = client.post(
        f"/api/v1/programs/{world.program_id}/partners/alice/promo-codes",
        json={"code": "ALICE10"},
        headers=world.owner,
    )
    assert r.status_code == 201
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    r = client.post(
        f"/api/v1/programs/{world.program_id}/commissions/tx_bob_held/hold",
        json={"reason": "checking the order"},
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    clock.move_to(at("2026-01-20T09:00:00Z"))
    payee(world, "alice")  # a batch pays only partners with payout details
    payee(world, "bob")
    r = client.post(
        f"/api/v1/programs/{world.program_id}/payouts", json={"up_to": "2026-01-31"}, headers=world.owner
    )
    assert r.status_code == 201, r.text
    refund = {"transaction_id": "tx_alice", "refund_id": "re_1", "amount": 5_000}
    assert client.post("/api/v1/track/refund", json=refund, headers=world.key).status_code == 200
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    second = client.post(
        "/api/v1/programs",
        json={"workspace_id": world.workspace_id, "name": "Brand wholesale"},
        headers=world.owner,
    ).json()["data"]["program_id"]
    add_partner(world, "alice2", "ALICE@partner.test", second)
    world.second_program = second  # type: ignore[attr-defined]
    return world


def test_a_partner_sees_each_program_of_the_brand_and_their_numbers(brand: World) -> None:
    client = brand.client
    sign_in(client, link(brand, "alice"))
    home = client.get("/partner").text
    assert "Brand partners" in home and "Brand wholesale" in home  # one email, two programs
    page = client.get(f"/partner/programs/{brand.program_id}")
    assert page.status_code == 200
    text = page.text
    assert 'id="referral-link">https://brand.test/welcome?lang=en&amp;aff=alice<' in text
    assert 'id="promo-1">ALICE10<' in text
    assert "<svg" in text and 'id="activity-chart"' in text
    assert 'data-period="2026-01"' in text
    row = re.search(r'<tr data-period="2026-01">(.*?)</tr>', text, re.S)
    assert row is not None
    cells = re.findall(r'class="num (\w+)"[^>]*>([^<]*)', row.group(1))
    # 30.00 earned, then the refund of half after payment: a -15.00 clawback of the same month
    assert dict(cells) == {"clicks": "1", "signups": "1", "sales": "1", "commission": "15.00 USD"}
    built = client.get(
        f"/partner/programs/{brand.program_id}?page=https://brand.test/pricing?plan=pro%26aff=bob"
    ).text
    assert 'id="built-link">https://brand.test/pricing?plan=pro&amp;aff=alice<' in built
    bad = client.get(f"/partner/programs/{brand.program_id}?page=javascript:alert(1)").text
    assert 'id="page-error"' in bad and "built-link" not in bad

    lines = client.get(f"/partner/programs/{brand.program_id}/commissions").text
    assert (
        "tx_alice" in lines and "Clawback: the sale was refunded after its commission was approved" in lines
    )
    payouts = client.get(f"/partner/programs/{brand.program_id}/payouts").text
    assert "#1" in payouts and "30.00 USD" in payouts
    exported = client.get(f"/partner/programs/{brand.program_id}/payouts?format=csv")
    rows = list(csv.DictReader(io.StringIO(exported.content.decode("utf-8-sig"))))
    assert [(r["currency"], r["amount"], r["status"]) for r in rows] == [("usd", "3000", "open")]
    batch_csv = client.get(f"/partner/programs/{brand.program_id}/payouts/{rows[0]['payout_id']}")
    assert batch_csv.status_code == 200 and "tx_alice" in batch_csv.text and "tx_bob" not in batch_csv.text

    wholesale = client.get(f"/partner/programs/{brand.second_program}")  # type: ignore[attr-defined]
    assert wholesale.status_code == 200 and "<code>alice2</code>" in wholesale.text
    assert 'id="no-website"' in wholesale.text and 'id="no-numbers"' in wholesale.text


def test_a_partner_never_sees_another_partners_rows(brand: World, client: TestClient) -> None:
    sign_in(client, link(brand, "alice"))
    batches = client.get(f"/api/v1/programs/{brand.program_id}/payouts", headers=brand.owner).json()["data"]
    other = client.post(
        "/api/v1/operator/accounts", json={"email": "o@other.test", "workspace_name": "Other"}, headers=OP
    ).json()["data"]
    foreign = client.post(
        "/api/v1/programs",
        json={"workspace_id": other["workspace_id"], "name": "Other brand"},
        headers=bearer(other["token"]),
    ).json()["data"]["program_id"]
    third = client.post(
        "/api/v1/programs",
        json={"workspace_id": brand.workspace_id, "name": "Brand without alice"},
        headers=brand.owner,
    ).json()["data"]["program_id"]
    everything = ""
    for path in (
        "/partner",
        f"/partner/programs/{brand.program_id}",
        f"/partner/programs/{brand.program_id}/commissions",
        f"/partner/programs/{brand.program_id}/payouts",
        f"/partner/programs/{brand.program_id}/payouts?format=csv",
        f"/partner/programs/{brand.program_id}/payout-details",
    ):
        r = client.get(path)
        assert r.status_code == 200, path
        everything += r.text
    for secret in (
        "tx_bob",
        "bob@partner.test",
        "bob@paypal.test",
        "Bob",
        "customer-a@shop.test",
        "secret_key_",
        brand.api_key,
        brand.account_token,
        "checking the order",
    ):
        assert secret not in everything, secret
    for path in (
        f"/partner/programs/{foreign}",
        f"/partner/programs/{third}",
        f"/partner/programs/{third}/payouts",
        "/partner/programs/prog_nope/commissions",
        f"/partner/programs/{foreign}/payout-details",
        f"/partner/programs/{brand.program_id}/payouts/po_nope",
    ):
        r = client.get(path)
        assert r.status_code == 404 and 'id="error-code">not_found' in r.text, path
        assert "Other brand" not in r.text and "Brand without alice" not in r.text
    # bob's payout batch holds none of alice's lines... the one batch here holds both: a batch
    # alice has no line in is 404 to her, one she has lines in shows hers only
    sign_in(client, link(brand, "bob"))
    mine = client.get(f"/partner/programs/{brand.program_id}/payouts/{batches[0]['payout_id']}")
    assert mine.status_code == 200 and "tx_bob" in mine.text and "tx_alice" not in mine.text
    held = client.get(f"/partner/programs/{brand.program_id}/commissions").text
    assert "Held by the brand: checking the order" in held  # their own line says why
    assert client.get(f"/partner/programs/{brand.second_program}").status_code == 404  # type: ignore[attr-defined]


def test_the_payout_details_form_saves_with_csrf_and_refuses_without(
    brand: World, client: TestClient
) -> None:
    csrf = sign_in(client, link(brand, "alice"))
    path = f"/partner/programs/{brand.program_id}/payout-details"
    form = {
        "payout_method": "wise",
        "payout_email": "alice@wise.test",
        "payout_name": "Alice Example",
        "payout_currency": "eur",
    }
    r = client.post(path, data=form, follow_redirects=False)
    assert r.status_code == 403 and "csrf_refused" in r.text
    r = client.post(path, data={**form, "csrf_token": "x" * 43}, follow_redirects=False)
    assert r.status_code == 403
    r = client.post(
        path,
        data={**form, "csrf_token": csrf},
        headers={"Origin": "https://evil.test"},
        follow_redirects=False,
    )
    assert r.status_code == 403
    r = client.post(path, data={**form, "csrf_token": csrf, "payout_email": "nope"}, follow_redirects=False)
    assert r.status_code == 422 and 'id="details-errors"' in r.text and 'value="Alice Example"' in r.text
    r = client.post(path, data={**form, "csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("/payout-details?saved=1")
    owner_view = client.get(f"/api/v1/programs/{brand.program_id}/partners", headers=brand.owner).json()[
        "data"
    ]
    alice = next(p for p in owner_view if p["code"] == "alice")
    assert (alice["payout_method"], alice["payout_email"], alice["payout_currency"]) == (
        "wise",
        "alice@wise.test",
        "eur",
    )
    page = client.get(path + "?saved=1").text
    assert 'id="saved"' in page and 'value="alice@wise.test"' in page
    # signing out ends the session everywhere; its cookie is worth nothing after
    r = client.post("/partner/sign-out", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get(path, follow_redirects=False).status_code == 303
    assert 'id="signed-out"' in client.get("/partner").text
