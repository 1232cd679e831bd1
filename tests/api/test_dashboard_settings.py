"""The dashboard's settings form and money per currency (CONTRACT 15): the flat commission and the
payout minimum as rows of an amount and a currency, or one row for every currency; what is set
is what the page shows, and saving the page as it is changes nothing."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

from tests.conftest import World
from tests.helpers import logged_in, program_path, settings_form


class _Form(HTMLParser):
    """The values a browser would post from the form with id `form_id`: its inputs (a checkbox
    when checked) and each select's selected option (else its first)."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id, self.inside = form_id, False
        self.select: str | None = None
        self.options: list[tuple[str, bool]] = []
        self.values: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        elif self.inside and tag == "input" and (a.get("type") != "checkbox" or "checked" in a):
            self.values[a["name"]] = a.get("value", "on")
        elif self.inside and tag == "select":
            self.select, self.options = a["name"], []
        elif self.select is not None and tag == "option":
            self.options.append((a.get("value", ""), "selected" in a))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select" and self.select is not None:
            chosen = [value for value, selected in self.options if selected] or [self.options[0][0]]
            self.values[self.select], self.select = chosen[0], None


def posted_as_shown(page: str) -> dict[str, str]:
    parser = _Form("settings-form")
    parser.feed(page)
    return parser.values


def api_settings(world: World) -> dict[str, Any]:
    data: dict[str, Any] = world.client.get(
        f"/api/v1/programs/{world.program_id}", headers=world.owner
    ).json()["data"]
    return data


def rows_shown(page: str, name: str) -> list[tuple[str, str]]:
    """(amount, chosen currency) of each row of per-currency setting `name` on the page."""
    form = posted_as_shown(page)
    currency = {"commission_flat": "flat_currency", "payout_minimum": "minimum_currency"}[name]
    rows = [(form[name], form[currency])]
    n = 2
    while f"{name}_{n}" in form:
        rows.append((form[f"{name}_{n}"], form[f"{currency}_{n}"]))
        n += 1
    return rows


def test_one_amount_per_currency_is_set_on_the_form_and_shown_as_set(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world)).text
    # a new program: 0 in every currency for both, and a blank row to add a currency
    assert rows_shown(page, "commission_flat") == [("0", "every"), ("", "")]
    assert rows_shown(page, "payout_minimum") == [("0", "every"), ("", "")]
    form = settings_form(
        token,
        commission_type="flat",
        commission_flat="5.00",
        flat_currency="usd",
        commission_flat_2="500",
        flat_currency_2="jpy",
        commission_flat_3="",
        flat_currency_3="eur",
        payout_minimum="5,000",
        minimum_currency="every",
    )
    r = world.client.post(program_path(world, "/settings"), data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    api = api_settings(world)
    assert (api["commission_flat"], api["payout_minimum"]) == ({"jpy": 500, "usd": 500}, 5000)
    page = world.client.get(program_path(world)).text
    assert rows_shown(page, "commission_flat") == [("500", "jpy"), ("5.00", "usd"), ("", "")]
    assert rows_shown(page, "payout_minimum") == [("5000", "every"), ("", "")]
    found = re.search(r'<p class="hint" id="per-currency-now">(.*?)</p>', page, re.S)
    assert found is not None
    assert " ".join(found.group(1).split()) == (
        "Now: a flat commission of 500 JPY, 5.00 USD (nothing in other currencies); a payout minimum of "
        "5,000 minor units in every currency (50.00 USD, 5,000 JPY)."
    )
    # saved again as shown: nothing changes (no currency dropped, no amount rescaled)
    r = world.client.post(
        program_path(world, "/settings"), data=posted_as_shown(page), follow_redirects=False
    )
    assert r.status_code == 303, r.text
    assert api_settings(world) == {**api, "updated_at": api_settings(world)["updated_at"]}
    # one minimum per currency, the flat commission back to every currency
    form = {
        **posted_as_shown(page),
        "commission_flat": "250",
        "flat_currency": "every",
        "commission_flat_2": "",
    }
    form.update(
        payout_minimum="20.00", minimum_currency="eur", payout_minimum_2="2000", minimum_currency_2="jpy"
    )
    r = world.client.post(program_path(world, "/settings"), data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    api = api_settings(world)
    assert (api["commission_flat"], api["payout_minimum"]) == (250, {"eur": 2000, "jpy": 2000})


def test_a_currency_set_through_the_api_is_kept_when_the_form_is_saved(world: World) -> None:
    """Swedish kronor and forints are not among the form's usual currencies: rows set through the
    API show them, and saving the page keeps them."""
    r = world.client.patch(
        f"/api/v1/programs/{world.program_id}",
        json={"commission_flat": {"sek": 1050, "usd": 500}, "payout_minimum": {"huf": 100_000}},
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    logged_in(world.client, world.account_token)
    page = world.client.get(program_path(world)).text
    assert rows_shown(page, "commission_flat") == [("10.50", "sek"), ("5.00", "usd"), ("", "")]
    assert rows_shown(page, "payout_minimum") == [("1000.00", "huf"), ("", "")]
    before = api_settings(world)
    r = world.client.post(
        program_path(world, "/settings"), data=posted_as_shown(page), follow_redirects=False
    )
    assert r.status_code == 303, r.text
    after = api_settings(world)
    assert (after["commission_flat"], after["payout_minimum"]) == (
        before["commission_flat"],
        before["payout_minimum"],
    )


def test_rows_that_do_not_make_one_setting_are_refused_and_shown_again(world: World) -> None:
    token = logged_in(world.client, world.account_token)
    for rows, said in (
        (
            {"flat_currency": "every", "commission_flat_2": "1.00", "flat_currency_2": "usd"},
            "cannot be combined",
        ),
        ({"flat_currency": "usd", "commission_flat_2": "7", "flat_currency_2": "usd"}, "USD is given twice"),
        ({"flat_currency": "", "commission_flat_2": "", "flat_currency_2": ""}, "choose the currency of 5"),
    ):
        form = settings_form(token, commission_type="flat", commission_flat="5", **rows)
        r = world.client.post(program_path(world, "/settings"), data=form)
        assert r.status_code == 422 and said in r.text, said
        assert 'id="e-commission_flat"' in r.text and 'aria-invalid="true"' in r.text
        assert rows_shown(r.text, "commission_flat")[:2] == [
            ("5", rows["flat_currency"]),
            (rows["commission_flat_2"], rows["flat_currency_2"]),
        ]
    assert (api_settings(world)["commission_type"], api_settings(world)["commission_flat"]) == ("percent", 0)


def test_a_member_reads_the_settings_per_currency(world: World) -> None:
    r = world.client.patch(
        f"/api/v1/programs/{world.program_id}",
        json={"commission_type": "flat", "commission_flat": {"jpy": 500}, "payout_minimum": 2500},
        headers=world.owner,
    )
    assert r.status_code == 200, r.text
    logged_in(world.client, world.member()["Authorization"].removeprefix("Bearer "))
    page = " ".join(world.client.get(program_path(world)).text.split())
    assert 'id="settings-form"' not in page
    assert "<dt>Commission</dt> <dd>500 JPY per sale (nothing in other currencies)</dd>" in page
    assert (
        "<dt>Payout minimum</dt><dd>2,500 minor units in every currency (25.00 USD, 2,500 JPY)</dd>" in page
    )


def test_the_payout_pages_state_the_minimum_as_set(world: World) -> None:
    """The owner's Payouts tab and the partner's portal say what the minimum is in each currency,
    never one currency's figure as if it held in all (5000 minor units are 50.00 USD but 5,000 JPY)."""
    logged_in(world.client, world.account_token)
    owner_page = world.client.get(program_path(world, "/payouts")).text
    assert "payout minimum" not in owner_page  # none set: nothing said
    for minimum, said in (
        (5000, "5,000 minor units in every currency (50.00 USD, 5,000 JPY)"),
        ({"usd": 5000, "jpy": 5000}, "5,000 JPY, 50.00 USD; no minimum in other currencies"),
    ):
        r = world.client.patch(
            f"/api/v1/programs/{world.program_id}", json={"payout_minimum": minimum}, headers=world.owner
        )
        assert r.status_code == 200, r.text
        world.client.cookies.clear()  # the partner's session of the round before
        logged_in(world.client, world.account_token)
        owner_page = " ".join(world.client.get(program_path(world, "/payouts")).text.split())
        assert f"below the program's payout minimum ({said})" in owner_page
        r = world.client.post(
            f"/api/v1/programs/{world.program_id}/partners/alice/portal-link", headers=world.owner
        )
        assert r.status_code == 201, r.text
        world.client.cookies.clear()
        token = r.json()["data"]["url"].rsplit("/", 1)[-1]
        page = world.client.get(f"/partner/sign-in/{token}").text
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert csrf is not None
        r = world.client.post(
            "/partner/sign-in", data={"token": token, "csrf_token": csrf.group(1)}, follow_redirects=False
        )
        assert r.status_code == 303, r.text
        portal = " ".join(world.client.get(f"/partner/programs/{world.program_id}/payouts").text.split())
        assert f"The brand pays at least {said}: a smaller balance waits for the next payout." in portal
