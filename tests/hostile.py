"""Hostile requests for the hardening property (`tests/test_hardening_properties.py`): the
values, what the contract says each must get, strategies over every write endpoint, a server
that restarts on its database file, and the checks run after every batch."""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal

import httpx2
from hypothesis import strategies as st
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings, load_settings
from ingest.stripe import sign
from tests.conftest import OP, OPERATOR_TOKEN, WEBHOOK_SECRET, bearer

MIB = 1024 * 1024
Fit = Literal["in", "out", "either"]
Rotation = Literal["none", "future", "past", "unknown"]
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")

INTS: tuple[int, ...] = (0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, 10**12, 10**12 + 1)
FLOATS: tuple[float, ...] = (1.5, 1e20, -0.0)
NUMBERS: tuple[int | float, ...] = INTS + FLOATS
MAX_AMOUNT = 10**12
# 9999-12-30T00:00:00Z and 9999-12-31T00:00:00Z: the upper bound is "9999-12-30" in UTC.
LAST_DAY = 253402128000
BEYOND = 253402214400


# -- hostile values ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Text:
    """A generated string of `length` characters of `char`, a unique tag first when asked."""

    length: int
    char: str = "a"

    def render(self, tag: str = "") -> str:
        return (tag + self.char * self.length)[: self.length]

    def __repr__(self) -> str:
        return f"Text({self.length}x{self.char!r})"


@dataclass(frozen=True)
class Stamp:
    """An RFC 3339-ish timestamp and whether it lies within 1970-01-01..9999-12-30 in UTC."""

    text: str
    fit: Fit

    @property
    def past(self) -> bool:
        return not self.text.startswith(("9999", "10000"))

    def __repr__(self) -> str:
        return repr(self.text)


STAMPS = (
    Stamp("2020-06-15T12:00:00Z", "in"),
    Stamp("0000-01-01T00:00:00Z", "out"),
    Stamp("0001-01-01T00:00:00Z", "out"),
    Stamp("0001-01-01T00:00:00+14:00", "out"),  # year 0 in UTC
    Stamp("1969-12-31T23:59:59Z", "out"),
    Stamp("1970-01-01T00:00:00Z", "in"),
    Stamp("1970-01-01T00:00:00+14:00", "out"),  # 1969 in UTC
    Stamp("1969-12-31T23:00:00-14:00", "in"),  # 1970 in UTC
    Stamp("2016-12-31T23:59:60Z", "either"),  # leap second
    Stamp("2020-06-15T12:00:00+14:00", "in"),
    Stamp("2020-06-15T12:00:00-14:00", "in"),
    Stamp("2020-06-15T12:00:00", "out"),  # no offset
    Stamp("9999-12-29T23:59:59Z", "in"),
    Stamp("9999-12-30T12:00:00+14:00", "in"),
    Stamp("9999-12-30T12:00:00Z", "either"),
    Stamp("9999-12-30T23:00:00-14:00", "out"),  # 9999-12-31 in UTC
    Stamp("9999-12-31T23:59:59Z", "out"),
    Stamp("9999-12-31T23:59:59-01:00", "out"),  # year 10000 in UTC
    Stamp("10000-01-01T00:00:00Z", "out"),
)
PERIODS = ("CURRENT", "0000-01", "1969-12", "1970-01", "9999-12", "10000-01", "2025-13")
BAD_PERIODS = {"0000-01", "1969-12", "10000-01", "2025-13"}
DATES = (
    "2020-01-01",
    "0001-01-01",
    "0000-01-01",
    "1969-12-31",
    "1970-01-01",
    "9999-12-30",
    "9999-12-31",
    "10000-01-01",
    "2020-01-01T00:00:00Z",
    "9999-12-31T23:59:59-01:00",
)
UNIX_TIMES: tuple[int | float, ...] = (
    1_700_000_000,
    0,
    -1,
    -62135596800,  # 0001-01-01
    LAST_DAY - 1,
    LAST_DAY + 43200,
    BEYOND,
    253402300800,  # 10000-01-01
    2**63,
    2**64,
    1.5e9,
)
SETTING_BOUNDS = {
    "commission_bps": (0, 10_000),
    "platform_fee_bps": (0, 10_000),
    "commission_flat": (0, MAX_AMOUNT),
    "recurring_months": (0, 1200),
    "holding_days": (0, 3650),
}
SETTING_NORMAL = {
    "commission_bps": 3000,
    "platform_fee_bps": 500,
    "commission_flat": 500,
    "recurring_months": 12,
    "holding_days": 30,
}


def combine(*fits: Fit) -> Fit:
    if "out" in fits:
        return "out"
    return "either" if "either" in fits else "in"


def number_fit(value: Any, low: int, high: int) -> Fit:
    if isinstance(value, bool) or not isinstance(value, int):
        return "out"
    return "in" if low <= value <= high else "out"


def text_fit(value: Text | None, limit: int = 255, soft: int | None = None) -> Fit:
    """Strings: 1..255 in; longer out (or `either` up to a `soft` limit); empty: either."""
    if value is None:
        return "in"
    if value.length == 0:
        return "either"
    if value.length <= limit:
        return "in"
    return "either" if soft is not None and value.length <= soft else "out"


def unix_fit(value: Any) -> Fit:
    if value is None:
        return "in"
    if isinstance(value, bool) or not isinstance(value, int):
        return "either"
    if value < 0 or value >= BEYOND:
        return "out"
    return "in" if value < LAST_DAY else "either"


def webhook_amount_fit(value: Any) -> Fit:
    if isinstance(value, bool) or not isinstance(value, int):
        return "either"
    if value < 0 or value > MAX_AMOUNT:
        return "out"
    return "in" if value > 0 else "either"


def setting_fit(key: str, value: Any) -> Fit:
    if key == "commission_type":
        return "in" if value in ("percent", "flat") else "out"
    if value is None:
        return "in" if key == "recurring_months" else "either"
    return number_fit(value, *SETTING_BOUNDS[key])


def name_fit(value: Text | None) -> Fit:
    return "in" if value is None or 1 <= value.length <= 200 else "either"


# -- generated requests ------------------------------------------------------------------------
@dataclass
class Act:
    """One request of a batch: its kind, the tenant (0 or 1) it acts for, and its hostile fields."""

    kind: str
    tenant: int
    args: dict[str, Any]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.kind}@{self.tenant}({inner})"


def texts(normal: int = 12, chars: str = "aé😀") -> st.SearchStrategy[Text]:
    return st.builds(Text, st.sampled_from((normal, 0, 255, 256, 10_000)), st.sampled_from(chars))


AMOUNTS: st.SearchStrategy[int | float] = st.one_of(st.just(1000), st.sampled_from(NUMBERS))
STAMP = st.sampled_from(STAMPS)
EMAILS = st.sampled_from((24, 0, 255, 256, 10_000))
ADDITIONAL: st.SearchStrategy[Any] = st.one_of(
    st.just({"test_mode": True}),
    st.builds(lambda t: {"note": t}, texts()),
    st.just({"n": 2**64, "f": 1e20, "when": "10000-01-01T00:00:00Z"}),
)


def act(
    kind: str, required: dict[str, Any], optional: dict[str, Any] | None = None
) -> st.SearchStrategy[Act]:
    args = st.fixed_dictionaries(required, optional=optional or {})
    return st.builds(Act, st.just(kind), st.integers(0, 1), args)


def settings_patch() -> st.SearchStrategy[dict[str, Any]]:
    optional: dict[str, st.SearchStrategy[Any]] = {
        key: st.one_of(
            st.just(SETTING_NORMAL[key]), st.sampled_from((*bounds, bounds[1] + 1, *NUMBERS, None))
        )
        for key, bounds in SETTING_BOUNDS.items()
    }
    optional["commission_type"] = st.sampled_from(("flat", "percent", "bogus"))
    return st.fixed_dictionaries({}, optional=optional)


BY = st.sampled_from(("owner", "operator"))
ACTS = st.one_of(
    act(
        "sale",
        {"txn": st.one_of(st.just("fresh"), st.sampled_from(("dup", "connect")), texts()), "amount": AMOUNTS},
        {
            "customer": texts(),
            "occurred_at": STAMP,
            "email": EMAILS,
            "click": st.one_of(st.just("ack"), texts()),
            "subscription_id": texts(),
            "sale_type": texts(),
            "currency": st.sampled_from(("jpy", "USD")),
            "additional_data": ADDITIONAL,
        },
    ),
    act(
        "refund",
        {
            "txn": st.one_of(st.just("unknown"), st.sampled_from(("sale", "connect")), texts()),
            "refund_id": st.one_of(st.just("fresh"), st.just("dup"), texts()),
            "amount": AMOUNTS,
        },
        {"occurred_at": STAMP, "reason": texts()},
    ),
    act(
        "webhook",
        {
            "type": st.sampled_from(("checkout.session.completed", "invoice.paid", "charge.refunded")),
            "amount": st.one_of(st.just(1500), st.sampled_from(NUMBERS)),
            "created": st.sampled_from(UNIX_TIMES),
        },
        {
            "paid_at": st.sampled_from(UNIX_TIMES),
            "livemode": st.booleans(),
            "routed": st.booleans(),
            "object_id": texts(chars="a"),
        },
    ),
    act("patch", {"settings": settings_patch()}, {"name": texts(), "stripe_account_id": texts(chars="a")}),
    act("agent_patch", {"settings": settings_patch()}, {"name": texts()}),
    act("dashboard_settings", {"settings": settings_patch()}),
    act("create_program", {"settings": settings_patch()}, {"name": texts()}),
    act("click", {"partner": st.one_of(st.just("own"), texts())}, {"url": texts(), "referrer": texts()}),
    act(
        "lead",
        {"mode": st.sampled_from(("browser", "server")), "customer": texts()},
        {"email": EMAILS, "click": st.one_of(st.just("ack"), texts()), "name": texts()},
    ),
    act("rotation", {"deadline": STAMP}),
    act("regenerate", {}),
    act("legacy_key", {"value": texts(normal=40, chars="k")}),
    act("partner", {"code": texts(chars="p")}, {"name": texts(), "email": EMAILS}),
    act("member", {"email": EMAILS, "role": st.sampled_from(("member", "owner"))}),
    act(
        "agent_key",
        {"name": texts(), "workspace": st.one_of(st.just("own"), texts())},
        {"scopes": st.sampled_from((["programs:read"], ["programs:read", "programs:write"]))},
    ),
    act(
        "metadata_fix",
        {"target": st.one_of(st.just("sale"), texts()), "key": texts(), "by": BY},
        {"click": texts()},
    ),
    act(
        "backfill",
        {"dry_run": st.booleans(), "by": BY},
        {"from": st.sampled_from(DATES), "to": st.sampled_from(DATES)},
    ),
    act("close", {"period": st.sampled_from(PERIODS), "by": BY}),
    act(
        "read",
        {"what": st.sampled_from(("finance", "commissions", "double-counting", "sales"))},
        {
            "period": st.sampled_from(PERIODS),
            "format": st.sampled_from(("csv", "html", "xlsx")),
            "from": st.sampled_from(DATES),
            "to": st.sampled_from(DATES),
        },
    ),
)
BATCHES = st.lists(st.lists(ACTS, min_size=1, max_size=10), min_size=1, max_size=3)


# -- failures, one class per endpoint or phase ---------------------------------------------------
@cache
def broken(where: str) -> type[AssertionError]:
    """An AssertionError subclass named for what broke, so Hypothesis keeps the bugs apart."""
    name = "Broken_" + re.sub(r"\W", "_", where)
    return type(name, (AssertionError,), {})


def clip(data: bytes | str, limit: int = 300) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def describe(r: httpx2.Response) -> str:
    req = r.request
    query = f"?{clip(req.url.query.decode())}" if req.url.query else ""
    return f"{req.method} {req.url.path}{query} {clip(req.content)} -> {r.status_code} {clip(r.content)}"


def error_code(r: httpx2.Response) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    return err.get("code") if isinstance(err, dict) else None


# -- the tenants and the running server --------------------------------------------------------
@dataclass
class Tenant:
    """One account owning a workspace with a program, its key, an agent key and a partner, plus
    every write the server acknowledged for it."""

    index: int
    account_token: str
    workspace_id: str
    program_id: str
    api_key: str
    agent_key: str
    partner_code: str
    stripe_account: str
    rotation: Rotation = "none"
    sales: list[str] = field(default_factory=list)
    connect_sales: list[str] = field(default_factory=list)
    refunds: list[dict[str, Any]] = field(default_factory=list)
    clicks: list[str] = field(default_factory=list)

    @property
    def owner(self) -> dict[str, str]:
        return bearer(self.account_token)

    @property
    def key(self) -> dict[str, str]:
        return bearer(self.api_key)

    @property
    def key_state(self) -> Literal["usable", "rotated", "unknown"]:
        if self.rotation in ("none", "future"):
            return "usable"
        return "rotated" if self.rotation == "past" else "unknown"


def app_settings(database: Path) -> Settings:
    return load_settings(
        database=str(database),
        operator_token=OPERATOR_TOKEN,
        base_url="http://testserver",
        stripe_webhook_secrets=WEBHOOK_SECRET,
        reconcile_interval_seconds=0,
        public_rate_burst=100_000,
        refusal_rate_burst=100_000,
    )


class Server:
    """The app on one DuckDB file: requests with the universal checks, restarts, bookkeeping."""

    def __init__(self, database: Path) -> None:
        self.settings = app_settings(database)
        self.client = self._open()
        self.tenants: list[Tenant] = []
        self.events: list[bytes] = []  # acknowledged webhook bodies
        self.serial = 0

    def _open(self) -> TestClient:
        client = TestClient(create_app(self.settings), raise_server_exceptions=False)
        client.__enter__()
        return client

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def restart(self) -> None:
        try:
            self.close()
        except Exception as exc:
            raise broken("restart")(f"shutting the server down failed: {exc!r}") from exc
        try:
            self.client = self._open()
        except Exception as exc:
            raise broken("restart")(f"the server did not start again on its file: {exc!r}") from exc

    def tag(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}-"

    def send(
        self,
        where: str,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        raw: bytes | None = None,
        form: dict[str, str] | None = None,
    ) -> httpx2.Response:
        content = raw if raw is not None else None if body is None else json.dumps(body).encode()
        assert content is None or len(content) < MIB, f"test bug: a {len(content)}-byte request"
        sent = dict(headers or {})
        if content is not None:
            sent.setdefault("Content-Type", "application/json")
        if form is not None:  # a dashboard form: its errors are HTML pages, not the JSON envelope
            r = self.client.request(method, path, data=form, params=params, follow_redirects=False)
        else:
            r = self.client.request(method, path, content=content, headers=sent, params=params)
        if r.status_code >= 500:
            raise broken(f"{where}_5xx")(describe(r))
        if "x-request-id" not in r.headers:
            raise broken(f"{where}_request_id")(f"no X-Request-Id: {describe(r)}")
        if r.status_code >= 400 and form is None:
            check_envelope(where, r)
        return r

    def expect(self, where: str, r: httpx2.Response, status: int, code: str | None = None) -> None:
        if r.status_code != status or (code is not None and error_code(r) != code):
            raise broken(f"{where}_contract")(f"expected {status} {code or ''}: {describe(r)}")


def check_envelope(where: str, r: httpx2.Response) -> None:
    fail = broken(f"{where}_envelope")
    try:
        body = r.json()
    except ValueError:
        raise fail(f"not JSON: {describe(r)}") from None
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        raise fail(f"no error object: {describe(r)}")
    code = err.get("code")
    if not (isinstance(code, str) and SNAKE.match(code)):
        raise fail(f"error.code: {describe(r)}")
    if not isinstance(err.get("message"), str) or not str(err.get("doc_url", "")).endswith(f"#{code}"):
        raise fail(f"error.message/doc_url: {describe(r)}")
    if code == "validation_error":
        fields = err.get("fields")
        if not isinstance(fields, list) or not fields or not all(field_shape(f) for f in fields):
            raise fail(f"validation_error without fields: {describe(r)}")


def field_shape(item: Any) -> bool:
    return (
        isinstance(item, dict) and isinstance(item.get("field"), str) and isinstance(item.get("message"), str)
    )


def data(r: httpx2.Response) -> Any:
    return r.json()["data"]


def make_tenant(server: Server, index: int) -> Tenant:
    def ok(r: httpx2.Response, status: int) -> Any:
        assert r.status_code == status, describe(r)
        return data(r)

    s = server.send
    acct = ok(
        s(
            "setup",
            "POST",
            "/api/v1/operator/accounts",
            {"email": f"owner{index}@brand.test", "workspace_name": f"W{index}"},
            OP,
        ),
        201,
    )
    owner = bearer(acct["token"])
    account = f"acct_tenant{index}"
    body = {"workspace_id": acct["workspace_id"], "name": f"Program {index}", "stripe_account_id": account}
    program_id = ok(s("setup", "POST", "/api/v1/programs", body, owner), 201)["program_id"]
    api_key = ok(s("setup", "POST", f"/api/v1/programs/{program_id}/api-key", None, owner), 201)["api_key"]
    partner = f"partner{index}"
    partner_body = {"code": partner, "name": "Partner", "email": f"{partner}@partner.test"}
    ok(s("setup", "POST", f"/api/v1/programs/{program_id}/partners", partner_body, owner), 201)
    agent_body = {
        "name": f"agent {index}",
        "scopes": ["programs:read", "programs:write"],
        "workspace_ids": [acct["workspace_id"]],
    }
    agent_key = ok(s("setup", "POST", "/api/v1/operator/agent-keys", agent_body, OP), 201)["agent_key"]
    return Tenant(
        index, acct["token"], acct["workspace_id"], program_id, api_key, agent_key, partner, account
    )


def current_period() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


def period_text(period: str) -> str:
    return current_period() if period == "CURRENT" else period


# -- the requests ------------------------------------------------------------------------------
def email_of(length: int, tag: str) -> str:
    domain = "@example.com"
    if length <= len(domain):
        return "x" * length
    return Text(length - len(domain), "b").render(tag.replace("-", "")) + domain


def email_fit(length: int | None) -> Fit:
    if length is None:
        return "in"
    return "either" if length <= 12 else "in" if length <= 255 else "out"


def pick(items: list[str], fallback: str) -> str:
    return items[-1] if items else fallback


def do_sale(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("s")
    txn_choice = a["txn"]
    duplicate = False
    if isinstance(txn_choice, Text):
        txn = txn_choice.render(tag)
    elif txn_choice == "dup" and t.sales:
        txn, duplicate = t.sales[0], True
    elif txn_choice == "connect" and t.connect_sales:
        txn, duplicate = t.connect_sales[0], True
    else:
        txn = f"txn{tag}"
    customer = a.get("customer", Text(12)).render(tag)
    body: dict[str, Any] = {"transaction_id": txn, "customer_external_id": customer, "amount": a["amount"]}
    fits: list[Fit] = [
        number_fit(a["amount"], 1, MAX_AMOUNT),
        text_fit(txn_choice if isinstance(txn_choice, Text) else None),
        text_fit(a.get("customer")),
        email_fit(a.get("email")),
        text_fit(a.get("subscription_id")),
        text_fit(a.get("sale_type")),
    ]
    if "occurred_at" in a:
        body["occurred_at"] = a["occurred_at"].text
        fits.append(a["occurred_at"].fit)
    if "email" in a:
        body["email"] = email_of(a["email"], tag)
    for name in ("subscription_id", "sale_type"):
        if name in a:
            body[name] = a[name].render(tag)
    if "currency" in a:
        body["currency"] = a["currency"]
    click = a.get("click")
    if isinstance(click, Text):
        body["click_id"] = click.render(tag)
        fits.append(combine(text_fit(click), "either"))  # an unknown click id
    elif click == "ack" and t.clicks:
        body["click_id"] = t.clicks[-1]
    test_mode = False
    if "additional_data" in a:
        extra = a["additional_data"]
        note = extra.get("note")
        body["additional_data"] = {"note": note.render(tag)} if isinstance(note, Text) else extra
        test_mode = extra.get("test_mode") is True
        fits.append("either" if "n" in extra or test_mode else text_fit(note, 10_000))
    fit = combine(*fits)
    r = server.send("track_sale", "POST", "/api/v1/track/sale", body, t.key)
    if t.key_state == "rotated":
        server.expect("track_sale", r, 401, "api_key_rotation_required")
    elif t.key_state == "usable" and fit == "out":
        server.expect("track_sale", r, 422, "validation_error")
    elif t.key_state == "usable" and fit == "in":
        server.expect("track_sale", r, *((409, "duplicate_transaction") if duplicate else (200, None)))
    if r.status_code == 200 and not test_mode and not data(r).get("test_mode"):
        t.sales.append(txn)


def do_refund(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("r")
    txn_choice, refund_choice = a["txn"], a["refund_id"]
    unknown_sale = False
    if isinstance(txn_choice, Text):
        txn = txn_choice.render(tag)
        unknown_sale = True
    elif txn_choice == "sale" and t.sales:
        txn = t.sales[-1]
    elif txn_choice == "connect" and t.connect_sales:
        txn = t.connect_sales[-1]
    else:
        txn, unknown_sale = f"nosale{tag}", True
    duplicate = False
    if isinstance(refund_choice, Text):
        refund_id = refund_choice.render(tag)
    elif refund_choice == "dup" and t.refunds:
        refund_id, duplicate = t.refunds[0]["refund_id"], True
    else:
        refund_id = f"re{tag}"
    body: dict[str, Any] = {"transaction_id": txn, "refund_id": refund_id, "amount": a["amount"]}
    fits: list[Fit] = [
        number_fit(a["amount"], 1, MAX_AMOUNT),
        text_fit(txn_choice if isinstance(txn_choice, Text) else None),
        text_fit(refund_choice if isinstance(refund_choice, Text) else None),
        text_fit(a.get("reason")),
    ]
    if "occurred_at" in a:
        body["occurred_at"] = a["occurred_at"].text
        fits.append(a["occurred_at"].fit)
    if "reason" in a:
        body["reason"] = a["reason"].render(tag)
    fit = combine(*fits)
    r = server.send("track_refund", "POST", "/api/v1/track/refund", body, t.key)
    if t.key_state == "rotated":
        server.expect("track_refund", r, 401, "api_key_rotation_required")
    elif t.key_state == "usable" and fit == "out":
        server.expect("track_refund", r, 422, "validation_error")
    elif t.key_state == "usable" and fit == "in" and duplicate:
        server.expect("track_refund", r, 409, "duplicate_refund")
    elif t.key_state == "usable" and fit == "in" and unknown_sale:
        server.expect("track_refund", r, 200)
    if r.status_code == 200:
        t.refunds.append(body)


def stripe_event(
    event_id: str, a: dict[str, Any], obj_id: str, account: str, refund_of: str
) -> dict[str, Any]:
    kind, amount = a["type"], a["amount"]
    obj: dict[str, Any]
    if kind == "checkout.session.completed":
        obj = {
            "id": obj_id,
            "object": "checkout.session",
            "mode": "payment",
            "amount_total": amount,
            "currency": "usd",
            "customer": "cus_hostile",
            "customer_details": {"email": "buyer@example.com"},
            "metadata": {},
        }
    elif kind == "invoice.paid":
        obj = {
            "id": obj_id,
            "object": "invoice",
            "amount_paid": amount,
            "currency": "usd",
            "customer": "cus_hostile",
            "billing_reason": "manual",
            "status_transitions": {"paid_at": a.get("paid_at")},
        }
    else:
        obj = {
            "id": obj_id,
            "object": "charge",
            "amount_refunded": amount,
            "currency": "usd",
            "invoice": refund_of,
            "refunds": {"data": [{"id": f"re_{obj_id}", "created": a["created"]}]},
        }
    return {
        "id": event_id,
        "object": "event",
        "type": kind,
        "created": a["created"],
        "livemode": a.get("livemode", True),
        "account": account,
        "data": {"object": obj},
    }


def deliver(server: Server, where: str, body: bytes) -> httpx2.Response:
    headers = {"Stripe-Signature": sign(body, WEBHOOK_SECRET, int(time.time())), "User-Agent": "Stripe/1.0"}
    return server.send(where, "POST", "/webhooks/stripe", headers=headers, raw=body)


def do_webhook(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("w")
    prefix = {"checkout.session.completed": "cs_", "invoice.paid": "in_", "charge.refunded": "ch_"}[a["type"]]
    obj_id = prefix + a["object_id"].render(tag) if "object_id" in a else f"{prefix}{tag}"
    account = t.stripe_account if a.get("routed", True) else "acct_nobody"
    event = stripe_event(f"evt_{tag}", a, obj_id, account, pick(t.connect_sales, f"in_unknown{tag}"))
    body = json.dumps(event).encode()
    times = [unix_fit(a["created"])]
    if a["type"] == "invoice.paid":
        times.append(unix_fit(a.get("paid_at")))
    fit = combine(webhook_amount_fit(a["amount"]), *times)
    r = deliver(server, "webhook", body)
    if fit == "out":
        server.expect("webhook", r, 422, "validation_error")
        if r.json()["error"].get("stored") is not True:
            raise broken("webhook_contract")(f"error.stored is not true: {describe(r)}")
    if r.status_code != 200:
        return
    server.events.append(body)
    got = data(r)
    usable = fit == "in" and "object_id" not in a and a.get("livemode", True)
    if usable and a["type"] != "charge.refunded" and got.get("program_id") == t.program_id:
        t.connect_sales.append(obj_id)


def settings_body(server: Server, a: dict[str, Any], tag: str) -> tuple[dict[str, Any], Fit]:
    body = dict(a["settings"])
    fits = [setting_fit(k, v) for k, v in body.items()]
    if "name" in a:
        body["name"] = a["name"].render(tag)
        fits.append(name_fit(a["name"]))
    if "stripe_account_id" in a:
        body["stripe_account_id"] = "acct_" + a["stripe_account_id"].render(tag)
        fits.append("either")
    return body, combine(*fits)


def do_patch(server: Server, t: Tenant, a: dict[str, Any], agent: bool = False) -> None:
    body, fit = settings_body(server, a, server.tag("p"))
    where = "agent_patch" if agent else "patch_program"
    prefix = "/api/agent/v1/programs" if agent else "/api/v1/programs"
    r = server.send(
        where, "PATCH", f"{prefix}/{t.program_id}", body, bearer(t.agent_key) if agent else t.owner
    )
    if fit == "out":
        server.expect(where, r, 422, "validation_error")
    elif fit == "in":
        server.expect(where, r, 200)
    if r.status_code == 200 and "stripe_account_id" in body:
        t.stripe_account = body["stripe_account_id"]


CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(where: str, r: httpx2.Response) -> str:
    found = CSRF.search(r.text)
    if found is None:
        raise broken(where)(f"no CSRF field: {describe(r)}")
    return found.group(1)


# The dashboard's settings form takes rates as percent and the flat commission as money (USD here).
FORM_FIELDS = {"commission_bps": "commission_percent", "platform_fee_bps": "platform_fee_percent"}


def as_typed(key: str, value: Any) -> str:
    """A setting's value as a person types it on the form: 3000 bps -> `30.00` (percent), 500
    minor units -> `5.00` (USD); a value that is not a whole number stays one that is not
    (1.5 bps -> `0.015`, three decimals), so what the API refuses the form refuses too."""
    if value is None:
        return ""
    if key not in ("commission_bps", "platform_fee_bps", "commission_flat"):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"{value // 100}.{value % 100:02d}"
    if isinstance(value, float):
        return repr(value / 100)
    return str(value)


def do_dashboard_settings(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    """The settings form of the dashboard feeds the same settings: hostile digits as text."""
    where = "dashboard_settings"
    server.client.cookies.clear()  # the other tenant's session, if any
    page = server.send(where, "GET", "/dashboard/login")
    login = {"token": t.account_token, "csrf_token": csrf_of(where, page)}
    server.expect(where, server.send(where, "POST", "/dashboard/login", form=login), 303)
    form = {
        "csrf_token": csrf_of(where, server.send(where, "GET", "/dashboard")),
        "name": f"Program {t.index}",
        "commission_type": "percent",
        "stripe_account_id": t.stripe_account,
        "flat_currency": "usd",
    }
    for key, value in {**SETTING_NORMAL, **a["settings"]}.items():
        form[FORM_FIELDS.get(key, key)] = as_typed(key, value)
    fit = combine(*(setting_fit(k, v) for k, v in a["settings"].items()))
    r = server.send(where, "POST", f"/dashboard/programs/{t.program_id}/settings", form=form)
    if fit == "out":
        server.expect(where, r, 422)
    elif fit == "in":
        server.expect(where, r, 303)


def do_create_program(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("c")
    body, fit = settings_body(server, a, tag)
    body = {"workspace_id": t.workspace_id, "name": f"extra {tag}", **body}
    r = server.send("create_program", "POST", "/api/v1/programs", body, t.owner)
    if fit == "out":
        server.expect("create_program", r, 422, "validation_error")
    elif fit == "in":
        server.expect("create_program", r, 201)


def do_click(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("k")
    partner = a["partner"]
    body: dict[str, Any] = {"program_id": t.program_id, "partner_code": t.partner_code}
    fits: list[Fit] = ["in"]
    if isinstance(partner, Text):
        body["partner_code"] = partner.render(tag)
        fits.append(combine(text_fit(partner), "either"))  # an unknown partner: 404
    for name in ("url", "referrer"):
        if name in a:
            body[name] = a[name].render(tag)
            fits.append(text_fit(a[name], 255, soft=2048))
    fit = combine(*fits)
    r = server.send("track_click", "POST", "/api/v1/track/click", body)
    if fit == "out":
        server.expect("track_click", r, 422, "validation_error")
    elif fit == "in":
        server.expect("track_click", r, 201)
    if r.status_code == 201:
        t.clicks.append(data(r)["click_id"])


def do_lead(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("l")
    browser = a["mode"] == "browser"
    body: dict[str, Any] = {"customer_external_id": a["customer"].render(tag)}
    fits: list[Fit] = [text_fit(a["customer"]), email_fit(a.get("email")), text_fit(a.get("name"))]
    if browser:
        body["program_id"] = t.program_id
    if "email" in a:
        body["email"] = email_of(a["email"], tag)
    if "name" in a:
        body["name"] = a["name"].render(tag)
    click = a.get("click")
    if isinstance(click, Text):
        body["click_id"] = click.render(tag)
        fits.append(combine(text_fit(click), "either"))
    elif click == "ack" and t.clicks:
        body["click_id"] = t.clicks[-1]
    fit = combine(*fits)
    r = server.send("track_lead", "POST", "/api/v1/track/lead", body, None if browser else t.key)
    state = "usable" if browser else t.key_state
    if state == "rotated":
        server.expect("track_lead", r, 401, "api_key_rotation_required")
    elif state == "usable" and fit == "out":
        server.expect("track_lead", r, 422, "validation_error")
    elif state == "usable" and fit == "in":
        server.expect("track_lead", r, 200)


def regenerate(server: Server, t: Tenant, where: str = "regenerate_key") -> None:
    r = server.send(where, "POST", f"/api/v1/programs/{t.program_id}/api-key", None, t.owner)
    server.expect(where, r, 201)
    t.api_key, t.rotation = data(r)["api_key"], "none"


def do_rotation(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    stamp: Stamp = a["deadline"]
    path = f"/api/v1/operator/programs/{t.program_id}/api-key/rotation"
    r = server.send("rotation", "POST", path, {"deadline": stamp.text}, OP)
    if stamp.fit == "out":
        server.expect("rotation", r, 422, "validation_error")
    if r.status_code == 200:
        t.rotation = "past" if stamp.past else "future"


def do_legacy_key(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    value = a["value"].render(server.tag(f"legacy{t.index}x"))
    path = f"/api/v1/operator/programs/{t.program_id}/legacy-key"
    r = server.send("legacy_key", "POST", path, {"api_key": value}, OP)
    if r.status_code == 201:
        t.api_key, t.rotation = value, "unknown"


def do_partner(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("q")
    body: dict[str, Any] = {
        "code": a["code"].render(tag.replace("-", "")),
        "name": a.get("name", Text(8)).render(tag),
    }
    if "email" in a:
        body["email"] = email_of(a["email"], tag)
    server.send("add_partner", "POST", f"/api/v1/programs/{t.program_id}/partners", body, t.owner)


def do_member(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    body = {"email": email_of(a["email"], server.tag("m")), "role": a["role"]}
    server.send("add_member", "POST", f"/api/v1/workspaces/{t.workspace_id}/members", body, t.owner)


def do_agent_key(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("g")
    workspace = t.workspace_id if a["workspace"] == "own" else a["workspace"].render(tag)
    body = {
        "name": a["name"].render(tag),
        "scopes": a.get("scopes", ["programs:read"]),
        "workspace_ids": [workspace],
    }
    server.send("agent_key", "POST", "/api/v1/operator/agent-keys", body, OP)


def engineer(t: Tenant, by: str) -> dict[str, str]:
    return OP if by == "operator" else t.owner


def do_metadata_fix(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    tag = server.tag("f")
    target = a["target"]
    fix: dict[str, Any] = {
        "transaction_id": target.render(tag) if isinstance(target, Text) else pick(t.sales, f"txn{tag}"),
        "svc_customer_key": a["key"].render(tag),
    }
    if "click" in a:
        fix["svc_click_id"] = a["click"].render(tag)
    path = f"/api/v1/programs/{t.program_id}/metadata-fixes"
    server.send("metadata_fixes", "POST", path, {"fixes": [fix]}, engineer(t, a["by"]))


def do_backfill(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    body: dict[str, Any] = {"dry_run": a["dry_run"]}
    body.update({k: a[k] for k in ("from", "to") if k in a})
    server.send("backfill", "POST", f"/api/v1/programs/{t.program_id}/backfill", body, engineer(t, a["by"]))


def do_close(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    period = period_text(a["period"])
    path = f"/api/v1/programs/{t.program_id}/periods/{period}/close"
    r = server.send("close_period", "POST", path, None, engineer(t, a["by"]))
    if period in BAD_PERIODS:
        server.expect("close_period", r, 422, "validation_error")


def do_read(server: Server, t: Tenant, a: dict[str, Any]) -> None:
    what = a["what"]
    params: dict[str, str] = {}
    if what == "sales":
        params.update({k: a[k] for k in ("from", "to") if k in a})
        path = "sales"
    else:
        path = "commissions" if what == "commissions" else f"reports/{what}"
        if "period" in a or what == "finance":
            params["period"] = period_text(a.get("period", "CURRENT"))
        if "format" in a and what != "commissions":
            params["format"] = a["format"] if what == "finance" else "csv"
    server.send(f"read_{what}", "GET", f"/api/v1/programs/{t.program_id}/{path}", None, t.owner, params)


HANDLERS = {
    "sale": do_sale,
    "refund": do_refund,
    "webhook": do_webhook,
    "patch": do_patch,
    "agent_patch": lambda s, t, a: do_patch(s, t, a, agent=True),
    "dashboard_settings": do_dashboard_settings,
    "create_program": do_create_program,
    "click": do_click,
    "lead": do_lead,
    "rotation": do_rotation,
    "regenerate": lambda s, t, a: regenerate(s, t),
    "legacy_key": do_legacy_key,
    "partner": do_partner,
    "member": do_member,
    "agent_key": do_agent_key,
    "metadata_fix": do_metadata_fix,
    "backfill": do_backfill,
    "close": do_close,
    "read": do_read,
}


# -- after each batch --------------------------------------------------------------------------
def reconcile(server: Server, where: str) -> None:
    r = server.send(where, "POST", "/api/v1/operator/reconcile", None, OP)
    server.expect(where, r, 200)


def reads(server: Server, where: str) -> None:
    """Every tenant still reads: its program, lists, sales, commissions, reports and log."""
    for t in server.tenants:
        base = f"/api/v1/programs/{t.program_id}"
        for path, params in (
            ("/api/v1/programs", {}),
            (base, {}),
            (f"{base}/partners", {}),
            (f"{base}/sales", {}),
            (f"{base}/commissions", {}),
            (f"{base}/reports/finance", {"period": current_period(), "format": "json"}),
            (f"{base}/reports/double-counting", {}),
            (f"{base}/tracking-log", {}),
            (f"{base}/checklist", {}),
        ):
            r = server.send(where, "GET", path, None, t.owner, params)
            server.expect(where, r, 200)


def fresh_sale(server: Server, t: Tenant, click_id: str | None = None) -> httpx2.Response:
    tag = server.tag("z")
    body: dict[str, Any] = {
        "transaction_id": f"fresh{tag}",
        "customer_external_id": f"c{tag}",
        "amount": 1000,
    }
    if click_id is not None:
        body["click_id"] = click_id
    return server.send("after_restart_sale", "POST", "/api/v1/track/sale", body, t.key)


def everything_acknowledged_is_back(server: Server) -> None:
    for body in server.events:
        r = deliver(server, "lost_webhook_event", body)
        server.expect("lost_webhook_event", r, 200)
        if data(r).get("duplicate") is not True:
            raise broken("lost_webhook_event")(f"a redelivery is not a duplicate: {describe(r)}")
    for t in server.tenants:
        r = fresh_sale(server, t)
        if t.rotation == "past" or (t.rotation == "unknown" and r.status_code == 401):
            server.expect("after_restart_sale", r, 401, "api_key_rotation_required")
            regenerate(server, t, "after_restart_regenerate")
            r = fresh_sale(server, t)
        server.expect("after_restart_sale", r, 200)
        for click_id in t.clicks:
            r = fresh_sale(server, t, click_id)
            server.expect("after_restart_sale", r, 200)
            if data(r)["attributed"] is not True:
                raise broken("lost_click")(f"click {click_id} no longer attributes: {describe(r)}")
        for refund in t.refunds:
            r = server.send("lost_refund", "POST", "/api/v1/track/refund", refund, t.key)
            server.expect("lost_refund", r, 409, "duplicate_refund")
        for txn in t.sales + t.connect_sales:
            params = {"transaction_id": txn}
            r = server.send(
                "lost_sale", "GET", f"/api/v1/programs/{t.program_id}/sales", None, t.owner, params
            )
            server.expect("lost_sale", r, 200)
            if txn not in {row["transaction_id"] for row in data(r)}:
                raise broken("lost_sale")(f"acknowledged sale {txn!r} is missing: {describe(r)}")


def settle(server: Server) -> None:
    reconcile(server, "after_batch_reconcile")
    reads(server, "after_batch_read")
    server.restart()
    r = server.send("after_restart_health", "GET", "/healthz")
    server.expect("after_restart_health", r, 200)
    reconcile(server, "after_restart_reconcile")
    reads(server, "after_restart_read")
    everything_acknowledged_is_back(server)


@contextmanager
def running_server() -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="tally-hardening-", ignore_cleanup_errors=True) as tmp:
        server = Server(Path(tmp) / "tally.duckdb")
        try:
            server.tenants = [make_tenant(server, 0), make_tenant(server, 1)]
            yield server
        finally:
            server.close()
