"""CONTRACT 14 through the real HTTP API and a real reconcile, on both backends: portal sign-in
links (201, seven days, single use, emailed through a real SMTP server the test starts), promo
codes assigned to partners and the sales they attribute (track/sale and the connect webhook, in
either order), and partners' payout details set by the owner."""

from __future__ import annotations

import copy
import email
import email.policy
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import time_machine
from aiosmtpd.controller import Controller
from starlette.testclient import TestClient

from api import mail
from api.app import create_app
from api.settings import Settings
from tests.conftest import OP, World, bearer, make_world
from tests.helpers import ACCOUNT, LIVE_CHECKOUT, deliver, sql_rows
from tests.stripe_fixtures import load_event

SIGN_IN = re.compile(r"http://testserver/partner/sign-in/(ptl_[A-Za-z0-9]+)")


def partner_path(world: World, suffix: str = "", code: str = "alice") -> str:
    return f"/api/v1/programs/{world.program_id}/partners/{code}{suffix}"


def reconcile(client: TestClient) -> None:
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200


def sale_row(world: World, transaction_id: str) -> dict[str, Any]:
    r = world.client.get(
        f"/api/v1/programs/{world.program_id}/sales?transaction_id={transaction_id}", headers=world.owner
    )
    assert r.status_code == 200, r.text
    (found,) = r.json()["data"]
    assert isinstance(found, dict)
    return found


def sign_in(client: TestClient, token: str) -> Any:
    """Open the link's page (which uses nothing up), then press its button."""
    page = client.get(f"/partner/sign-in/{token}")
    assert page.status_code == 200 and 'id="sign-in-form"' in page.text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert csrf is not None
    return client.post(
        "/partner/sign-in", data={"token": token, "csrf_token": csrf.group(1)}, follow_redirects=False
    )


# -- sign-in links --------------------------------------------------------------------------------
def test_an_owner_makes_a_one_time_link_valid_seven_days(world: World) -> None:
    client = world.client
    with time_machine.travel(datetime(2026, 3, 1, 9, tzinfo=UTC), tick=False):
        r = client.post(partner_path(world, "/portal-link"), headers=world.owner)  # no body at all
        assert r.status_code == 201, r.text
        data = r.json()["data"]
        assert data["expires_at"] == "2026-03-08T09:00:00Z" and data["sent"] is False
        token = SIGN_IN.fullmatch(data["url"])
        assert token is not None
        again = client.post(partner_path(world, "/portal-link"), json={"send": False}, headers=world.owner)
        assert again.status_code == 201 and again.json()["data"]["url"] != data["url"]  # a new one each time
        first = sign_in(client, token.group(1))
        assert (
            first.status_code == 303 and first.headers["location"] == f"/partner/programs/{world.program_id}"
        )
        cookie = first.headers["set-cookie"]
        assert "tally_partner=" in cookie and "HttpOnly" in cookie and "Path=/partner" in cookie
        assert "SameSite=lax" in cookie or "samesite=lax" in cookie.lower()
        assert client.get(f"/partner/programs/{world.program_id}").status_code == 200
        client.cookies.clear()
        used = sign_in(client, token.group(1))  # single use
        assert used.status_code == 404 and 'id="error-code">not_found' in used.text
    late = SIGN_IN.fullmatch(again.json()["data"]["url"])
    assert late is not None
    with time_machine.travel(datetime(2026, 3, 8, 9, 0, 1, tzinfo=UTC), tick=False):
        assert sign_in(client, late.group(1)).status_code == 404  # expired after seven days
    client.cookies.clear()
    assert client.get(f"/partner/programs/{world.program_id}", follow_redirects=False).status_code == 303


def test_links_are_for_owners_of_the_program_and_its_partners_only(world: World, client: TestClient) -> None:
    member = world.member()
    r = client.post(partner_path(world, "/portal-link"), headers=member)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")
    r = client.post(partner_path(world, "/portal-link", code="nobody"), headers=world.owner)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "partner_not_found")
    other = client.post(
        "/api/v1/operator/accounts", json={"email": "x@other.test", "workspace_name": "Other"}, headers=OP
    ).json()["data"]["token"]
    r = client.post(partner_path(world, "/portal-link"), headers=bearer(other))
    assert (r.status_code, r.json()["error"]["code"]) == (404, "program_not_found")
    r = client.post(partner_path(world, "/portal-link"), json={"send": "yes"}, headers=world.owner)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error")
    r = client.post(partner_path(world, "/portal-link"), json={"other": 1}, headers=world.owner)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error")


def test_sending_without_mail_settings_is_a_clear_refusal(world: World) -> None:
    """No TALLY_SMTP_URL: `send` is refused (422 validation_error naming `send`), no link made."""
    r = world.client.post(partner_path(world, "/portal-link"), json={"send": True}, headers=world.owner)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "validation_error"
    assert error["fields"][0]["field"] == "send" and "TALLY_SMTP_URL" in error["fields"][0]["message"]


@dataclass
class Inbox:
    """The messages a real SMTP server (aiosmtpd) on this machine received."""

    messages: list[email.message.EmailMessage] = field(default_factory=list)
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        parsed = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        assert isinstance(parsed, email.message.EmailMessage)
        self.messages.append(parsed)
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def test_send_emails_the_link_through_the_configured_smtp_server(
    settings: Settings, smtp: tuple[Inbox, int]
) -> None:
    inbox, port = smtp
    mailing = settings.model_copy(
        update={
            "smtp_url": type(settings.smtp_url)(f"smtp://127.0.0.1:{port}"),
            "mail_from": "partners@brand.test",
        }
    )
    with TestClient(create_app(mailing)) as client:
        world = make_world(client)
        r = client.post(partner_path(world, "/portal-link"), json={"send": True}, headers=world.owner)
        assert r.status_code == 201, r.text
        assert r.json()["data"]["sent"] is True
        (message,) = inbox.messages
        assert inbox.envelopes == [("partners@brand.test", ["alice@partner.test"])]
        assert message["To"] == "Alice <alice@partner.test>"
        assert message["Subject"] == "Your partner dashboard for Brand partners"
        body = message.get_content()
        found = SIGN_IN.search(body)
        assert found is not None and found.group(0) == r.json()["data"]["url"]
        assert sign_in(client, found.group(1)).status_code == 303  # the emailed link signs in
        # a partner without an email: nothing to send to
        client.post(
            f"/api/v1/programs/{world.program_id}/partners",
            json={"code": "bob", "name": "Bob"},
            headers=world.owner,
        )
        r = client.post(partner_path(world, "/portal-link", "bob"), json={"send": True}, headers=world.owner)
        assert (r.status_code, r.json()["error"]["fields"][0]["field"]) == (422, "send")


def test_a_mail_server_that_is_down_voids_the_link(settings: Settings) -> None:
    mailing = settings.model_copy(
        update={
            "smtp_url": type(settings.smtp_url)(f"smtp://127.0.0.1:{_free_port()}"),
            "mail_from": "p@brand.test",
        }
    )
    with TestClient(create_app(mailing)) as client:
        world = make_world(client)
        r = client.post(partner_path(world, "/portal-link"), json={"send": True}, headers=world.owner)
        assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        assert sql_rows(store, "SELECT count(*) FROM portal_links") == [(0,)]  # voided: nobody got it
        ok = client.post(partner_path(world, "/portal-link"), headers=world.owner)
        assert ok.status_code == 201  # without `send`, a link is made as ever
        assert sql_rows(store, "SELECT count(*) FROM portal_links") == [(1,)]


def _mailing(settings: Settings, port: int) -> Settings:
    return settings.model_copy(
        update={
            "smtp_url": type(settings.smtp_url)(f"smtp://127.0.0.1:{port}"),
            "mail_from": "partners@brand.test",
        }
    )


INJECTED = "Brand\r\nBcc: thief@evil.test"


def test_a_name_with_cr_or_lf_is_refused_and_the_link_is_mailed(
    settings: Settings, smtp: tuple[Inbox, int]
) -> None:
    """Issue 48, item 7: CR/LF in a program or partner name (a header injection, and a 500 with
    the link left valid when "send sign-in link" was pressed) is refused at input."""
    inbox, port = smtp
    with TestClient(create_app(_mailing(settings, port))) as client:
        world = make_world(client)
        for path, body in (
            (f"/api/v1/programs/{world.program_id}", {"name": INJECTED}),
            (partner_path(world), {"payout_name": INJECTED}),
            (f"/api/v1/programs/{world.program_id}/partners", {"code": "bob", "name": INJECTED}),
        ):
            method = client.post if path.endswith("/partners") else client.patch
            r = method(path, json=body, headers=world.owner)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), (path, r.text)
        r = client.post(partner_path(world, "/portal-link"), json={"send": True}, headers=world.owner)
        assert r.status_code == 201, r.text
        (message,) = inbox.messages
        assert inbox.envelopes == [("partners@brand.test", ["alice@partner.test"])]
        assert message["Subject"] == "Your partner dashboard for Brand partners"


def test_a_name_stored_with_cr_lf_never_reaches_a_header() -> None:
    """A name stored before the rule: the message is still one header per line, no Bcc."""
    message = mail.portal_link_message(
        "p@brand.test",
        "alice@partner.test",
        "Al\r\nBcc: a@evil.test",
        INJECTED,
        "http://x/",
        datetime.now(UTC),
    )
    headers = message.as_bytes().split(b"\n\n", 1)[0].splitlines()
    assert not [h for h in headers if h.lower().startswith(b"bcc")]
    assert message["Subject"] == "Your partner dashboard for Brand  Bcc: thief@evil.test"
    assert message.get_all("Bcc") is None


def test_any_failure_to_send_voids_the_link(
    settings: Settings, smtp: tuple[Inbox, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port = smtp

    def broken(*args: Any) -> Any:
        raise ValueError("Header values may not contain linefeed or carriage return characters")

    monkeypatch.setattr(mail, "portal_link_message", broken)
    with TestClient(create_app(_mailing(settings, port)), raise_server_exceptions=False) as client:
        world = make_world(client)
        r = client.post(partner_path(world, "/portal-link"), json={"send": True}, headers=world.owner)
        assert r.status_code == 500
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        assert sql_rows(store, "SELECT count(*) FROM portal_links") == [(0,)]


# -- promo codes ----------------------------------------------------------------------------------
def test_promo_codes_are_assigned_listed_and_each_belongs_to_one_partner(
    world: World, client: TestClient
) -> None:
    r = client.post(partner_path(world, "/promo-codes"), json={"code": "ALICE10"}, headers=world.owner)
    assert r.status_code == 201, r.text
    assert r.json()["data"] | {"created_at": None} == {
        "program_id": world.program_id,
        "partner_code": "alice",
        "code": "ALICE10",
        "promotion_code_id": None,
        "created_at": None,
    }
    body = {"code": "SUMMER", "promotion_code_id": "promo_1Q2w3E"}
    assert client.post(partner_path(world, "/promo-codes"), json=body, headers=world.owner).status_code == 201
    client.post(
        f"/api/v1/programs/{world.program_id}/partners",
        json={"code": "bob", "name": "Bob"},
        headers=world.owner,
    )
    for taken in ({"code": "alice10"}, {"code": "OTHER", "promotion_code_id": "promo_1Q2w3E"}):
        r = client.post(partner_path(world, "/promo-codes", "bob"), json=taken, headers=world.owner)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict"), taken
    for bad in ({"code": "has space"}, {"code": "X", "promotion_code_id": "coupon_1"}, {"code": ""}, {}):
        r = client.post(partner_path(world, "/promo-codes"), json=bad, headers=world.owner)
        assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), bad
    member = world.member()
    listed = client.get(partner_path(world, "/promo-codes"), headers=member)
    assert [p["code"] for p in listed.json()["data"]] == ["ALICE10", "SUMMER"]
    assert client.get(partner_path(world, "/promo-codes", "bob"), headers=member).json()["data"] == []
    r = client.post(partner_path(world, "/promo-codes", "bob"), json={"code": "BOB"}, headers=member)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")
    r = client.get(partner_path(world, "/promo-codes", "nobody"), headers=member)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "partner_not_found")


@pytest.mark.parametrize("assign_first", [True, False], ids=["code-then-sales", "sales-then-code"])
def test_sales_naming_a_partners_promo_code_are_theirs_through_track_and_webhook(
    client: TestClient, assign_first: bool
) -> None:
    world = make_world(client, stripe_account_id=ACCOUNT)

    def assign() -> None:
        body = {"code": "ALICE10", "promotion_code_id": "promo_1Q2w3E"}
        assert (
            client.post(partner_path(world, "/promo-codes"), json=body, headers=world.owner).status_code
            == 201
        )

    if assign_first:
        assign()
    r = world.sale(
        transaction_id="tx_promo", customer_external_id="cust_9", amount=10_000, promo_code="alice10"
    )
    assert r.status_code == 200 and r.json()["data"]["attributed"] is False
    assert "promo code alice10" in r.json()["warnings"][0]["message"]
    event = copy.deepcopy(load_event(LIVE_CHECKOUT, account=ACCOUNT))
    event["data"]["object"]["discounts"] = [{"coupon": "co_1", "promotion_code": "promo_1Q2w3E"}]
    assert deliver(client, event).status_code == 200
    if not assign_first:
        reconcile(client)
        assert sale_row(world, "tx_promo")["partner_code"] is None
        assign()
    reconcile(client)
    typed = sale_row(world, "tx_promo")
    assert (typed["partner_code"], typed["attribution_rule"], typed["commission"]) == (
        "alice",
        "promo_code",
        3_000,
    )
    checkout = sale_row(world, "in_1KJqKBJDPojXS6LNJbvLUgEy")
    assert (checkout["partner_code"], checkout["attribution_rule"]) == ("alice", "promo_code")
    steps = client.get(
        f"/api/v1/programs/{world.program_id}/sales/in_1KJqKBJDPojXS6LNJbvLUgEy/explain", headers=world.owner
    ).json()["data"]["steps"]
    assert steps[1] == {
        "step": 2,
        "rule": "promo_code",
        "looked_up": "promo_code=promo_1Q2w3E",
        "found": "promo code promo_1Q2w3E of partner alice",
        "result": "matched",
    }


# -- payout details -------------------------------------------------------------------------------
def test_the_owner_sets_a_partners_payout_details(world: World, client: TestClient) -> None:
    r = client.patch(partner_path(world), json={"payout_method": "paypal"}, headers=world.owner)
    assert r.status_code == 422
    assert sorted(f["field"] for f in r.json()["error"]["fields"]) == [
        "payout_currency",
        "payout_email",
        "payout_name",
    ]
    full = {
        "payout_method": "paypal",
        "payout_email": "alice@paypal.test",
        "payout_name": "Alice Example",
        "payout_currency": "EUR",
    }
    r = client.patch(partner_path(world), json=full, headers=world.owner)
    assert r.status_code == 200, r.text
    assert {k: r.json()["data"][k] for k in full} == {**full, "payout_currency": "eur"}
    r = client.patch(partner_path(world), json={"payout_method": "wise"}, headers=world.owner)
    assert (r.json()["data"]["payout_method"], r.json()["data"]["payout_email"]) == (
        "wise",
        "alice@paypal.test",
    )
    listed = client.get(f"/api/v1/programs/{world.program_id}/partners", headers=world.member()).json()[
        "data"
    ]
    assert listed[0]["payout_method"] == "wise" and listed[0]["payout_name"] == "Alice Example"
    for bad in (
        {"payout_method": "cash"},
        {"payout_name": "=HYPERLINK(1)"},
        {"payout_email": "not-an-email"},
        {"payout_currency": "dollars"},
        {"name": "Alice 2"},
    ):
        r = client.patch(partner_path(world), json=bad, headers=world.owner)
        assert (r.status_code, r.json()["error"]["code"]) == (422, "validation_error"), bad
    r = client.patch(partner_path(world), json=full, headers=world.member())
    assert (r.status_code, r.json()["error"]["code"]) == (403, "owner_required")


@pytest.mark.embedded
def test_a_rebuilt_key_index_still_knows_whose_code_is_whose(settings: Settings) -> None:
    """The claims of promo-code assignments are derived from the log (ingest/domain/keys.py
    `claims_of`): an embedded key index rebuilt from it refuses a second assignment as before."""
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
        body = {"code": "ALICE10", "promotion_code_id": "promo_1"}
        assert (
            client.post(partner_path(world, "/promo-codes"), json=body, headers=world.owner).status_code
            == 201
        )
    for path in Path(settings.database).parent.glob(Path(settings.database).name + ".keys*"):
        path.unlink()
    with TestClient(create_app(settings)) as client:
        for taken in ({"code": "alice10"}, {"code": "OTHER", "promotion_code_id": "promo_1"}):
            r = client.post(partner_path(world, "/promo-codes"), json=taken, headers=world.owner)
            assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict"), taken
        assert (
            client.post(
                partner_path(world, "/promo-codes"), json={"code": "NEW"}, headers=world.owner
            ).status_code
            == 201
        )
