"""CONTRACT 15, money per currency: `commission_flat` and `payout_minimum` take an integer (the same
number of minor units in every currency) or an object by currency, through every way a program's
settings arrive; a flat rule by currency pays only in the currencies it names, and a sale in
another earns nothing, with `no_flat_amount_for_currency` in the sales read and in explain."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import OP, World, bearer, make_world

PER_CURRENCY = ("commission_flat", "payout_minimum")


def program(world: World) -> dict[str, Any]:
    r = world.client.get(f"/api/v1/programs/{world.program_id}", headers=world.owner)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def patched(world: World, body: dict[str, Any]) -> dict[str, Any]:
    r = world.client.patch(f"/api/v1/programs/{world.program_id}", json=body, headers=world.owner)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


@pytest.mark.parametrize("name", PER_CURRENCY)
def test_each_form_is_set_and_read_back_as_it_was_set(world: World, name: str) -> None:
    """An integer stays an integer, an object an object (codes lowercase, whatever case was sent),
    in the PATCH's answer, the program's read and the list."""
    assert program(world)[name] == 0
    assert patched(world, {name: 5000})[name] == 5000
    assert program(world)[name] == 5000
    by_currency = {"USD": 5000, "jpy": 500, "Kwd": 0}
    assert patched(world, {name: by_currency})[name] == {"jpy": 500, "kwd": 0, "usd": 5000}
    assert program(world)[name] == {"jpy": 500, "kwd": 0, "usd": 5000}
    listed = world.client.get("/api/v1/programs", headers=world.owner).json()["data"]
    assert [p[name] for p in listed if p["program_id"] == world.program_id] == [
        {"jpy": 500, "kwd": 0, "usd": 5000}
    ]
    assert patched(world, {name: 10**12})[name] == 10**12  # back to one number in every currency
    assert program(world)[name] == 10**12


def test_both_forms_are_taken_on_create_and_by_the_agent_endpoint(world: World) -> None:
    body = {
        "workspace_id": world.workspace_id,
        "name": "Second",
        "commission_type": "flat",
        "commission_flat": {"eur": 450, "usd": 500},
        "payout_minimum": 2500,
    }
    r = world.client.post("/api/v1/programs", json=body, headers=world.owner)
    assert r.status_code == 201, r.text
    created = r.json()["data"]
    assert (created["commission_flat"], created["payout_minimum"]) == ({"eur": 450, "usd": 500}, 2500)
    r = world.client.post(
        "/api/v1/operator/agent-keys",
        json={
            "name": "tool",
            "scopes": ["programs:read", "programs:write"],
            "workspace_ids": [world.workspace_id],
        },
        headers=OP,
    )
    agent = bearer(r.json()["data"]["agent_key"])
    path = f"/api/agent/v1/programs/{created['program_id']}"
    r = world.client.patch(
        path, json={"payout_minimum": {"gbp": 2000}, "commission_flat": 700}, headers=agent
    )
    assert r.status_code == 200, r.text
    read = world.client.get(path, headers=agent).json()["data"]
    assert (read["commission_flat"], read["payout_minimum"]) == (700, {"gbp": 2000})


TOO_MANY = {f"{a}{b}{c}": 1 for a in "abc" for b in "abcdef" for c in "abc"}  # 54 currencies
REFUSED = [
    (-1, "must be an integer from 0 to 1000000000000"),
    (10**12 + 1, "must be an integer from 0 to 1000000000000"),
    ("500", "or an object of 1 to 50 currency codes"),
    (5.0, "or an object of 1 to 50 currency codes"),
    (True, "or an object of 1 to 50 currency codes"),
    (None, "or an object of 1 to 50 currency codes"),
    ([500], "or an object of 1 to 50 currency codes"),
    ({}, "or an object of 1 to 50 currency codes"),
    ({"usd": -1}, "usd must be an integer from 0 to 1000000000000"),
    ({"usd": 10**12 + 1}, "usd must be an integer from 0 to 1000000000000"),
    ({"usd": "500"}, "usd must be an integer"),
    ({"usd": 5.5}, "usd must be an integer"),
    ({"usd": None}, "usd must be an integer"),
    ({"usd": {"cents": 500}}, "usd must be an integer"),
    ({"us": 500}, "'us' is not a currency code"),
    ({"usdx": 500}, "'usdx' is not a currency code"),
    ({"u$d": 500}, "is not a currency code"),
    ({"usd": 1, "USD": 2}, "names usd twice"),
    (TOO_MANY, "at most 50"),
]


@pytest.mark.parametrize("name", PER_CURRENCY)
def test_anything_else_is_refused_naming_the_field(world: World, name: str) -> None:
    """A wrong type, a negative or too large amount, a nested object, a code that is not three
    letters, a currency twice, too many: 422 `validation_error` naming the field and saying what
    it wants, on PATCH and on create, and nothing changes."""
    before = program(world)
    for value, said in REFUSED:
        r = world.client.patch(
            f"/api/v1/programs/{world.program_id}", json={name: value}, headers=world.owner
        )
        assert r.status_code == 422, (value, r.text)
        error = r.json()["error"]
        assert error["code"] == "validation_error"
        assert [f["field"] for f in error["fields"]] == [name], value
        assert said in error["fields"][0]["message"], (value, error)
        body = {"workspace_id": world.workspace_id, "name": "Refused", name: value}
        r = world.client.post("/api/v1/programs", json=body, headers=world.owner)
        assert (r.status_code, [f["field"] for f in r.json()["error"]["fields"]]) == (422, [name]), value
    assert program(world) == before
    listed = world.client.get("/api/v1/programs", headers=world.owner).json()["data"]
    assert [p["name"] for p in listed] == ["Brand partners"]


def referred_sale(world: World, tx: str, amount: int, currency: str) -> None:
    """A sale of `amount` `currency` by a customer who came through alice's link."""
    client = world.client
    click = client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    customer = f"cust_{tx}"
    lead = {"customer_external_id": customer, "click_id": click.json()["data"]["click_id"]}
    assert client.post("/api/v1/track/lead", json=lead, headers=world.key).status_code == 200
    r = world.sale(transaction_id=tx, customer_external_id=customer, amount=amount, currency=currency)
    assert r.status_code == 200, r.text


def test_a_flat_rule_by_currency_pays_only_the_currencies_it_names(world: World) -> None:
    """`{"usd": 500, "jpy": 500}`: a USD sale earns 5.00 USD, a JPY sale ¥500 (whole yen), a EUR
    sale nothing, saying why in the sales read (JSON and CSV) and in explain; the platform fee
    (basis points) is due on all three."""
    patched(
        world,
        {"commission_type": "flat", "commission_flat": {"usd": 500, "JPY": 500}, "platform_fee_bps": 500},
    )
    referred_sale(world, "in_usd", 12_345, "usd")
    referred_sale(world, "in_eur", 12_345, "eur")
    referred_sale(world, "in_jpy", 9_999, "jpy")
    assert world.client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    sales = world.client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner).json()["data"]
    got = {
        s["transaction_id"]: (s["currency"], s["commission"], s["platform_fee"], s["warnings"]) for s in sales
    }
    assert got == {
        "in_usd": ("usd", 500, 617, []),
        "in_eur": ("eur", 0, 617, ["no_flat_amount_for_currency"]),
        "in_jpy": ("jpy", 500, 500, []),
    }
    assert all(s["partner_code"] == "alice" for s in sales)
    csv = world.client.get(f"/api/v1/programs/{world.program_id}/sales?format=csv", headers=world.owner).text
    (eur_row,) = [line for line in csv.splitlines() if "in_eur" in line]
    assert "no_flat_amount_for_currency" in eur_row
    explained = world.client.get(
        f"/api/v1/programs/{world.program_id}/sales/in_eur/explain", headers=world.owner
    ).json()["data"]
    last = explained["steps"][-1]
    assert (last["step"], last["rule"], last["looked_up"], last["result"]) == (
        7,
        "commission",
        "currency=eur",
        "no_flat_amount_for_currency",
    )
    assert "EUR" in last["found"] and explained["sale"]["warnings"] == ["no_flat_amount_for_currency"]
    usd = world.client.get(
        f"/api/v1/programs/{world.program_id}/sales/in_usd/explain", headers=world.owner
    ).json()["data"]
    assert [s["rule"] for s in usd["steps"]][-1] == "result"  # a sale paid in its currency: six steps


def test_an_integer_flat_rule_still_pays_the_same_minor_units_in_every_currency(client: Any) -> None:
    world = make_world(client, commission_type="flat", commission_flat=500)
    referred_sale(world, "in_usd", 12_345, "usd")
    referred_sale(world, "in_eur", 12_345, "eur")
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    sales = client.get(f"/api/v1/programs/{world.program_id}/sales", headers=world.owner).json()["data"]
    assert sorted((s["transaction_id"], s["commission"], s["warnings"]) for s in sales) == [
        ("in_eur", 500, []),
        ("in_usd", 500, []),
    ]
