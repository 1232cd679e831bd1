"""Paying partners keeps books, from the CLI against a live server (CONTRACT sections 10 and 15):
`tally payouts create` says who it does not pay and why, `tally payouts cancel|row-failed`,
`tally payouts list` with each batch's state, and `tally partners list|show|statement|adjust`;
tables (tab-separated rows in a pipe), `--json` (the API's data) and the refusals (a member
where an owner is needed, a paid batch, what does not exist), each a one-line reason and its exit
code.

One `tally serve` for the module; each test makes its own program on it (`books`): 30 %
commission, no holding days, a payout minimum of 10.00. alice (PayPal, USD) sold 100.00, bob (no
payout details) 50.00 and 50.00 EUR, carol (PayPal, USD) 20.00: below the minimum; dave nothing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import OP, LiveServer, bearer, start_server
from tests.test_cli import tally

UP_TO = "2026-01-31"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("cli_ledger") / "live.duckdb")
    try:
        yield live
    finally:
        live.stop()


@dataclass(frozen=True)
class Books:
    url: str
    owner: str  # the owner's account token
    member: str  # a workspace member's
    account_id: str  # the owner's
    program_id: str
    home: Path

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """`tally ARGS` with the owner's token (or `token`), no stored login."""
        return tally(self.home, *args, TALLY_URL=self.url, TALLY_ACCOUNT_TOKEN=token or self.owner)

    def ok(self, *args: str, token: str | None = None) -> str:
        r = self.cli(*args, token=token)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def data(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def api(self, method: str, suffix: str, body: Any = None) -> Any:
        r = httpx.request(
            method,
            f"{self.url}/api/v1/programs/{self.program_id}{suffix}",
            json=body,
            headers=bearer(self.owner),
            timeout=60,
        )
        assert r.status_code < 300, r.text
        return r.json()["data"]


def rows(stdout: str) -> list[list[str]]:
    """A table's rows as a pipe gets them: tab-separated cells (other lines left out)."""
    return [line.split("\t") for line in stdout.splitlines() if "\t" in line]


def refused(r: subprocess.CompletedProcess[str], code: int, error: str) -> None:
    """The command failed with exit `code` and one line on stderr naming `error`."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith(f"tally: {error}: ") and len(r.stderr.splitlines()) == 1, r.stderr


def _books(server: LiveServer, home: Path) -> Books:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "fin@brand.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        owner = bearer(acct["token"])
        settings = {"holding_days": 0, "payout_minimum": 1_000}
        r = c.post(
            "/api/v1/programs",
            json={"workspace_id": acct["workspace_id"], "name": "Books", **settings},
            headers=owner,
        )
        pid = r.json()["data"]["program_id"]
        key = bearer(c.post(f"/api/v1/programs/{pid}/api-key", headers=owner).json()["data"]["api_key"])
        for code in ("alice", "bob", "carol", "dave"):
            body = {"code": code, "name": code.title(), "email": f"{code}@partner.test"}
            assert c.post(f"/api/v1/programs/{pid}/partners", json=body, headers=owner).status_code == 201
        for code in ("alice", "carol"):
            details = {
                "payout_method": "paypal",
                "payout_email": f"{code}@paypal.test",
                "payout_name": code.title(),
                "payout_currency": "usd",
            }
            r = c.patch(f"/api/v1/programs/{pid}/partners/{code}", json=details, headers=owner)
            assert r.status_code == 200, r.text
        sales = (
            ("alice", 10_000, "usd"),
            ("bob", 5_000, "usd"),
            ("bob", 5_000, "eur"),
            ("carol", 2_000, "usd"),
        )
        for n, (code, amount, currency) in enumerate(sales):
            click = c.post("/api/v1/track/click", json={"program_id": pid, "partner_code": code})
            lead = {"customer_external_id": f"cust_{code}", "click_id": click.json()["data"]["click_id"]}
            assert c.post("/api/v1/track/lead", json=lead, headers=key).status_code == 200
            sale = {
                "customer_external_id": f"cust_{code}",
                "transaction_id": f"in_{code}_{currency}",
                "amount": amount,
                "currency": currency,
                "occurred_at": f"2026-01-{5 + n:02d}T10:00:00Z",
            }
            assert c.post("/api/v1/track/sale", json=sale, headers=key).status_code == 200
        assert c.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        r = c.post(
            f"/api/v1/workspaces/{acct['workspace_id']}/members",
            json={"email": "viewer@brand.test", "role": "member"},
            headers=owner,
        )
        assert r.status_code == 201, r.text
        member = r.json()["data"]["token"]
    return Books(server.url, acct["token"], member, acct["account_id"], pid, home)


@pytest.fixture
def books(server: LiveServer, tmp_path: Path) -> Books:
    return _books(server, tmp_path / "cfg")


def _paid_and_failed(books: Books) -> str:
    """A batch paying alice 30.00, marked paid, whose row then failed; its id."""
    batch = books.api("POST", "/payouts", {"up_to": UP_TO})
    books.api("POST", f"/payouts/{batch['payout_id']}/paid")
    books.api("POST", f"/payouts/{batch['payout_id']}/rows/alice/usd/failed", {"reason": "bounced"})
    return str(batch["payout_id"])


# -- payouts ------------------------------------------------------------------------------------------
def test_a_batch_says_who_it_does_not_pay_and_can_be_cancelled(books: Books) -> None:
    out = books.ok("payouts", "create", "--program", books.program_id, "--up-to", UP_TO)
    (batch,) = books.api("GET", "/payouts")
    po = batch["payout_id"]
    assert rows(out) == [
        ["alice", "Alice", "paypal alice@paypal.test", "usd", "30.00 usd", "1", "open"],
        ["bob", "Bob", "eur", "15.00 eur", "1", "no_payout_details (no payout details)"],
        ["bob", "Bob", "usd", "15.00 usd", "1", "no_payout_details (no payout details)"],
        ["carol", "Carol", "usd", "6.00 usd", "1", "below_minimum (below the payout minimum)"],
    ]
    assert out.splitlines()[-1] == f"new batch {po}: 1 line(s); mark it paid once paid"
    listed = rows(books.ok("payouts", "list", "--program", books.program_id))
    assert [(r[1], r[3], r[7]) for r in listed] == [(po, "open", "30.00 USD")]

    # nothing more to pay: the same batch again, and who it still does not pay
    out = books.ok("payouts", "create", "--program", books.program_id, "--up-to", UP_TO)
    assert f"nothing new to pay: batch {po} already has this cut-off" in out

    out = books.ok(
        "payouts", "cancel", "--program", books.program_id, "--payout", po, "--reason", "wrong cut-off"
    )
    assert out.startswith(f"payout {po} cancelled by {books.account_id} at ")
    assert out.rstrip().endswith("(wrong cut-off): its 1 line(s) are due again")
    again = books.data(
        "payouts", "cancel", "--program", books.program_id, "--payout", po, "--reason", "again"
    )
    assert again == books.api("GET", f"/payouts/{po}")  # --json: the API's data; again: no change
    assert (again["status"], again["cancel_reason"], again["cancelled_by"]) == (
        "cancelled",
        "wrong cut-off",
        books.account_id,
    )
    assert [r["outcome"] for r in again["rows"]] == ["cancelled"]
    listed = rows(books.ok("payouts", "list", "--program", books.program_id))
    assert [(r[1], r[3], r[7]) for r in listed] == [(po, "cancelled", "-")]  # it pays nothing

    # alice's line is due again: a new batch pays it; a cancelled batch cannot be paid
    made = books.data("payouts", "create", "--program", books.program_id, "--up-to", UP_TO)
    assert made["payout_id"] != po and [(r["partner_code"], r["amount"]) for r in made["rows"]] == [
        ("alice", 3_000)
    ]
    assert {(n["partner_code"], n["currency"], n["reason"]) for n in made["not_paid"]} == {
        ("bob", "eur", "no_payout_details"),
        ("bob", "usd", "no_payout_details"),
        ("carol", "usd", "below_minimum"),
    }
    r = books.cli("payouts", "mark-paid", "--program", books.program_id, "--payout", po)
    refused(r, 1, "invalid_transition")


def test_a_paid_batch_cannot_be_cancelled_but_a_row_can_fail(books: Books) -> None:
    batch = books.api("POST", "/payouts", {"up_to": UP_TO})
    po, pid = batch["payout_id"], books.program_id
    r = books.cli(
        "payouts",
        "row-failed",
        "--program",
        pid,
        "--payout",
        po,
        "--partner",
        "alice",
        "--currency",
        "usd",
        "--reason",
        "x",
    )
    refused(r, 1, "invalid_transition")  # an open batch's row cannot fail: cancel it instead
    books.ok("payouts", "mark-paid", "--program", pid, "--payout", po)
    r = books.cli("payouts", "cancel", "--program", pid, "--payout", po, "--reason", "too late")
    refused(r, 1, "batch_paid")
    assert "mark a row failed instead" in r.stderr

    failed = ("payouts", "row-failed", "--program", pid, "--payout", po, "--partner", "alice")
    out = books.ok(*failed, "--currency", "USD", "--reason", "PayPal returned it")
    assert rows(out) == [
        ["alice", "Alice", "paypal alice@paypal.test", "usd", "30.00 usd", "1", "failed: PayPal returned it"]
    ]
    assert (
        out.splitlines()[-1] == f"alice's 30.00 usd in payout {po} failed: owed again, a later batch pays it"
    )
    again = books.data(*failed, "--currency", "usd", "--reason", "again")
    (row,) = again["rows"]
    assert (row["outcome"], row["failure"]["reason"], row["failure"]["failed_by"]) == (
        "failed",
        "PayPal returned it",
        books.account_id,
    )
    assert again["totals"] == [] and again == books.api("GET", f"/payouts/{po}")
    listed = rows(books.ok("payouts", "list", "--program", pid))
    assert [(r[1], r[3], r[7]) for r in listed] == [(po, "paid, 1 row(s) failed", "-")]

    r = books.cli(*failed[:-1], "nobody", "--currency", "usd", "--reason", "x")
    refused(r, 1, "not_found")
    r = books.cli("payouts", "cancel", "--program", pid, "--payout", "po_nope", "--reason", "x")
    refused(r, 1, "not_found")
    r = books.cli(*failed, "--currency", "us", "--reason", "x")
    assert r.returncode == 2 and "not a currency code" in r.stderr and len(r.stderr.splitlines()) == 1
    # a member may read but not act
    for command in (
        ("payouts", "cancel", "--program", pid, "--payout", po, "--reason", "x"),
        (*failed, "--currency", "usd", "--reason", "x"),
    ):
        refused(books.cli(*command, token=books.member), 4, "owner_required")


# -- partners -----------------------------------------------------------------------------------------
def test_partners_list_and_show_their_balances(books: Books) -> None:
    _paid_and_failed(books)  # alice is owed her 30.00 again
    pid = books.program_id
    assert rows(books.ok("partners", "list", "--program", pid)) == [
        ["alice", "Alice", "paypal alice@paypal.test (usd)", "usd", "30.00 usd", "0.00 usd", "0.00 usd"],
        ["bob", "Bob", "-", "eur", "15.00 eur", "0.00 eur", "0.00 eur"],
        ["bob", "Bob", "-", "usd", "15.00 usd", "0.00 usd", "0.00 usd"],
        ["carol", "Carol", "paypal carol@paypal.test (usd)", "usd", "6.00 usd", "0.00 usd", "0.00 usd"],
        ["dave", "Dave", "-", "-", "-", "-", "-"],
    ]
    listed = books.data("partners", "list", "--program", pid)
    assert listed == books.api("GET", "/partners")
    assert {p["code"]: p["balances"] for p in listed}["alice"] == [
        {"currency": "usd", "approved_unpaid": 3_000, "pending": 0, "held": 0}
    ]
    shown = rows(books.ok("partners", "show", "--program", pid, "--partner", "alice"))
    fields = {r[0]: r[1] for r in shown if len(r) == 2}
    assert fields["code"] == "alice" and fields["email"] == "alice@partner.test"
    assert (fields["payout"], fields["payout name"]) == ("paypal alice@paypal.test (usd)", "Alice")
    assert [
        "alice",
        "Alice",
        "paypal alice@paypal.test (usd)",
        "usd",
        "30.00 usd",
        "0.00 usd",
        "0.00 usd",
    ] in shown
    shown = rows(books.ok("partners", "show", "--program", pid, "--partner", "bob", token=books.member))
    assert ["payout", "- (no payout details)"] in shown
    assert books.data("partners", "show", "--program", pid, "--partner", "dave") == books.api(
        "GET", "/partners/dave"
    )
    refused(books.cli("partners", "show", "--program", pid, "--partner", "nobody"), 1, "partner_not_found")
    refused(books.cli("partners", "list", "--program", "prog_nope"), 1, "program_not_found")


def test_a_partners_statement_as_a_table_json_and_csv(books: Books, tmp_path: Path) -> None:
    po = _paid_and_failed(books)
    pid = books.program_id
    statement = ("partners", "statement", "--program", pid, "--partner", "alice")
    table = rows(books.ok(*statement))
    assert [r[1:5] for r in table] == [
        ["opening balance", "", "0.00 usd", ""],
        ["commission", "30.00 usd", "30.00 usd", "in_alice_usd"],
        ["payout", "-30.00 usd", "0.00 usd", po],
        ["payout_failed", "30.00 usd", "30.00 usd", po],
        ["closing balance", "", "30.00 usd", ""],
    ]
    assert (table[0][0], table[-1][0]) == ("-", "-")  # no --from, no --to
    assert table[2][5] == "payout 1 paid" and table[3][5] == "bounced"
    data = books.data(*statement, "--currency", "usd")
    assert data == books.api("GET", "/partners/alice/statement?currency=usd")
    assert (data["opening_balance"], data["closing_balance"]) == (0, 3_000)

    # bounded: what comes before --from is the opening balance
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    table = rows(books.ok(*statement, "--from", tomorrow))
    assert [r[:4] for r in table] == [
        [f"{tomorrow} 00:00:00", "opening balance", "", "30.00 usd"],
        ["-", "closing balance", "", "30.00 usd"],
    ]
    assert [r[1:4] for r in rows(books.ok(*statement, "--to", "2020-01-31"))] == [
        ["opening balance", "", "0.00 usd"],
        ["closing balance", "", "0.00 usd"],
    ]

    # CSV: the server's, to a file or stdout
    out = tmp_path / "statement.csv"
    r = books.cli(*statement, "-o", str(out))
    assert r.returncode == 0 and f"to {out}" in r.stderr, r.stderr
    text = out.read_bytes().decode("utf-8")
    assert text.startswith("\ufeffbooked_at,kind,amount,transaction_id,payout_id,reason,balance,currency")
    kinds = [line.split(",")[1] for line in text.splitlines()[1:]]
    assert kinds == ["opening_balance", "commission", "payout", "payout_failed", "closing_balance"]
    assert books.ok(*statement, "--currency", "usd", "-o", "-") == text.replace("\r\n", "\n")  # (text mode)
    r = books.cli(*statement, "--json", "-o", str(out))
    assert r.returncode == 2 and "--json" in r.stderr and len(r.stderr.splitlines()) == 1

    # bob has money in two currencies: name one; a member reads statements too
    bob = ("partners", "statement", "--program", pid, "--partner", "bob")
    r = books.cli(*bob)
    refused(r, 1, "validation_error")
    assert "eur, usd" in r.stderr
    table = rows(books.ok(*bob, "--currency", "eur", token=books.member))
    assert [r[1:4] for r in table][1] == ["commission", "15.00 eur", "15.00 eur"]
    dave = books.data("partners", "statement", "--program", pid, "--partner", "dave")
    assert (dave["currency"], dave["entries"], dave["closing_balance"]) == (None, [], 0)
    assert [
        r[1:4] for r in rows(books.ok("partners", "statement", "--program", pid, "--partner", "dave"))
    ] == [
        ["opening balance", "", "0"],
        ["closing balance", "", "0"],
    ]
    refused(
        books.cli("partners", "statement", "--program", pid, "--partner", "nobody"), 1, "partner_not_found"
    )
    r = books.cli(*statement, "--from", "2026-13-01")
    refused(r, 1, "validation_error")


def test_partners_adjust_books_a_manual_entry(books: Books) -> None:
    pid = books.program_id
    adjust = ("partners", "adjust", "--program", pid, "--partner", "alice")
    out = books.ok(*adjust, "--amount", "25.00", "--currency", "USD", "--reason", "launch bonus")
    ((entry, partner, kind, amount, status, reason, by, _at),) = rows(out)
    assert entry.startswith("man_")
    assert (partner, kind, amount, status, reason, by) == (
        "alice",
        "manual",
        "25.00 usd",
        "approved",
        "launch bonus",
        books.account_id,
    )
    line = books.data(*adjust, "--amount", "-5.5", "--currency", "usd", "--reason", "double-counted")
    assert (line["amount"], line["currency"], line["kind"], line["status"], line["created_by"]) == (
        -550,
        "usd",
        "manual",
        "approved",
        books.account_id,
    )
    assert books.data(*adjust, "--amount", "1,500", "--currency", "jpy", "--reason", "yen")["amount"] == 1_500

    # the statement and the balance carry them
    data = books.data("partners", "statement", "--program", pid, "--partner", "alice", "--currency", "usd")
    assert [(e["kind"], e["amount"], e["reason"]) for e in data["entries"]] == [
        ("commission", 3_000, None),
        ("manual", 2_500, "launch bonus"),
        ("manual", -550, "double-counted"),
    ]
    (usd, jpy) = sorted(books.api("GET", "/partners/alice")["balances"], key=lambda b: b["currency"] != "usd")
    assert (usd["approved_unpaid"], jpy["approved_unpaid"]) == (4_950, 1_500)

    for amount, currency, why in (
        ("1.234", "usd", "USD amounts have at most 2 decimals"),
        ("1.5", "jpy", "JPY amounts have no decimals"),
        ("ten", "usd", "not an amount"),
    ):
        r = books.cli(*adjust, "--amount", amount, "--currency", currency, "--reason", "x")
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    refused(books.cli(*adjust, "--amount", "0", "--currency", "usd", "--reason", "x"), 1, "validation_error")
    refused(
        books.cli(*adjust, "--amount", "5", "--currency", "usd", "--reason", "x", token=books.member),
        4,
        "owner_required",
    )
    r = books.cli(
        "partners",
        "adjust",
        "--program",
        pid,
        "--partner",
        "nobody",
        "--amount",
        "5",
        "--currency",
        "usd",
        "--reason",
        "x",
    )
    refused(r, 1, "partner_not_found")
    assert (
        len(books.api("GET", "/partners/alice/statement?currency=usd")["entries"]) == 3
    )  # nothing more booked
