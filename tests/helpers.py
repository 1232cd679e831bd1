"""Helpers that several test modules share (test modules never import each other):

- signed connect deliveries into the in-process app, and reads of what it stored;
- the dashboard's login and settings forms;
- the finance CSV read back into the JSON report's shape.
"""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
from starlette.testclient import TestClient

from ingest.storage.schema import RAW_EVENT_FIELDS
from ingest.stripe import sign
from reports.money import units
from tests.conftest import WEBHOOK_SECRET, World
from tests.stripe_fixtures import serialise

# -- connect deliveries ---------------------------------------------------------------------------
ACCOUNT = "acct_1TallyTestAccount"
LIVE_CHECKOUT = "stripe-sync-engine__checkout_session_completed.json"  # livemode, invoice + pi + cs
LEGACY_INVOICE = "stripe-ruby-mock__invoice.paid.json"  # invoice, payment intent, charge; 2000 usd


def renewal_event(event_id: str, invoice_id: str, account: str = ACCOUNT, **invoice: Any) -> dict[str, Any]:
    """A live `invoice.paid` renewal (5000 usd, customer `cus_1`) for `account`, created now;
    `invoice` adds or replaces fields of the invoice object."""
    obj = {
        "id": invoice_id,
        "object": "invoice",
        "amount_paid": 5000,
        "currency": "usd",
        "customer": "cus_1",
        "billing_reason": "subscription_cycle",
        **invoice,
    }
    return {
        "id": event_id,
        "object": "event",
        "type": "invoice.paid",
        "created": int(time.time()),
        "livemode": True,
        "account": account,
        "data": {"object": obj},
    }


def deliver(
    client: TestClient,
    event: dict[str, Any] | bytes,
    secret: str = WEBHOOK_SECRET,
    timestamp: int | None = None,
    signature: str | None = None,
) -> httpx.Response:
    """POST `event` to /webhooks/stripe, signed with `secret` at `timestamp` (default now)."""
    body = event if isinstance(event, bytes) else serialise(event)
    header = signature or sign(body, secret, timestamp if timestamp is not None else int(time.time()))
    headers = {"Stripe-Signature": header, "Content-Type": "application/json", "User-Agent": "Stripe/1.0"}
    return client.post("/webhooks/stripe", content=body, headers=headers)


def at(text: str) -> datetime:
    """An RFC 3339 time ("2026-01-01T09:00:00Z") as an aware datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def sql_rows(store: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of `sql` (`?` parameters) on a store, through its `Reader` (either backend)."""
    with store.reader() as db:
        rows: list[tuple[Any, ...]] = db.rows(sql, params)
    return rows


def query(client: TestClient, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of `sql` on the app's database, once the writer has flushed everything acknowledged."""
    state = client.app.state.tally  # type: ignore[attr-defined]
    sync = getattr(state.writer, "sync_blocking", None)
    if sync is not None:
        sync()
    rows: list[tuple[Any, ...]] = sql_rows(state.store, sql, params)
    return rows


def log_entries(world: World) -> list[dict[str, Any]]:
    """The program's tracking-log lines for the connect webhook, newest first."""
    r = world.client.get(f"/api/v1/programs/{world.program_id}/tracking-log", headers=world.owner)
    assert r.status_code == 200, r.text
    return [e for e in r.json()["data"]["entries"] if e["endpoint"] == "webhooks/stripe"]


# -- the dashboard's forms ------------------------------------------------------------------------
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "the page has no CSRF field"
    return found.group(1)


def login(client: TestClient, token: str) -> httpx.Response:
    form = client.get("/dashboard/login")
    assert form.status_code == 200
    return client.post(
        "/dashboard/login", data={"token": token, "csrf_token": csrf_of(form.text)}, follow_redirects=False
    )


def logged_in(client: TestClient, token: str) -> str:
    """Log in; the CSRF token of the new session (from the programs page)."""
    r = login(client, token)
    assert r.status_code == 303, r.text
    return csrf_of(client.get("/dashboard").text)


def program_path(world: World, suffix: str = "") -> str:
    return f"/dashboard/programs/{world.program_id}{suffix}"


def settings_form(token: str, **changes: str) -> dict[str, str]:
    """The program settings form with the defaults of `make_world`'s program, and `changes`."""
    form = {
        "csrf_token": token,
        "name": "Brand partners",
        "commission_type": "percent",
        "commission_percent": "30",
        "commission_flat": "0.00",
        "flat_currency": "usd",
        "recurring_months": "",
        "platform_fee_percent": "0",
        "holding_days": "30",
        "stripe_account_id": "",
    }
    form.update(changes)
    return form


# -- the finance CSV ------------------------------------------------------------------------------
def parse_finance_csv(text: str) -> dict[str, Any]:
    """The documented layout read back: rows grouped by (section, row), values typed by the JSON.
    Checks the one CSV format on the way (a BOM; `value_decimal`, where filled, is `value` in
    whole units of the line's currency)."""
    assert text.startswith("\ufeff"), "every CSV starts with a BOM"
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))
    assert next(reader) == ["section", "row", "currency", "metric", "value", "value_decimal"]
    sections: dict[str, dict[int, dict[str, str]]] = {}
    for section, row, currency, metric, value, value_decimal in reader:
        entry = sections.setdefault(section, {}).setdefault(int(row), {})
        if currency:
            entry["currency"] = currency
        entry[metric] = value
        if value_decimal:
            assert Decimal(value_decimal) == units(int(value), currency), (section, row, metric)
    return {name: [rows[i] for i in sorted(rows)] for name, rows in sections.items()}


def as_cell(value: Any) -> str:
    """A JSON value as the finance CSV writes it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


PROVENANCE = re.compile(rb'<p class="provenance" id="report-provenance".*?</p>\n', re.DOTALL)
RUN_ID = re.compile(rb'data-run-id="([^"]*)"')


def without_provenance(html: bytes) -> bytes:
    """An html report without its provenance line (when it was generated, from which run): what
    stays the same for the same figures."""
    assert len(PROVENANCE.findall(html)) == 1, "the report says where its figures come from"
    return PROVENANCE.sub(b"", html)


def report_run_id(html: bytes) -> str:
    found = RUN_ID.search(html)
    assert found is not None
    return found.group(1).decode()


# -- raw rows and journal records for the store and journal tests --------------------------
STORE_AT = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)


def sale_row(n: int, amount: object = 100) -> dict[str, object]:
    """A raw-log row of an accepted sale `in_<n>` of program `p`, as the writer appends it."""
    return {
        "received_at": STORE_AT,
        "source": "track",
        "kind": "sale",
        "program_id": "p",
        "outcome": "accepted",
        "event_id": f"sale_{n}",
        "transaction_id": f"in_{n}",
        "customer_key": "c",
        "amount": amount,
        "currency": "usd",
        "occurred_at": STORE_AT,
        "body": "{}",
        "headers": "{}",
    }


def journal_record(number: int, rows: list[dict[str, object]]) -> dict[str, object]:
    """A journal record of batch `number` holding `rows` (as DuckStore journals them)."""
    raw = [[{**row, "seq": number * 10 + i}.get(f) for f in RAW_EVENT_FIELDS] for i, row in enumerate(rows)]
    for values in raw:
        for i, value in enumerate(values):
            if isinstance(value, datetime):
                values[i] = value.isoformat()
        values[RAW_EVENT_FIELDS.index("test_mode")] = False
    return {"batch": number, "raw": raw, "logs": [], "keys": [], "checks": [], "tagged": True}


def payee(
    world: World, code: str = "alice", method: str = "paypal", currency: str = "usd", **kw: str
) -> None:
    """Give partner `code` payout details (a batch pays only partners who have them)."""
    body = {
        "payout_method": method,
        "payout_email": kw.get("email", f"{code}@{method}.test"),
        "payout_name": kw.get("name", code.title()),
        "payout_currency": currency,
    }
    r = world.client.patch(
        f"/api/v1/programs/{world.program_id}/partners/{code}", json=body, headers=world.owner
    )
    assert r.status_code == 200, r.text
