"""Schemathesis, driven by the app's own `/openapi.json`, against the real ASGI app on a real
DuckDB file with real credentials: every operation gets generated requests (valid and invalid),
each sent with the credential its `security` names (an account token, the program API key, an
agent key, the operator token, the dashboard's session cookie; webhook deliveries carry a real
Stripe signature over the exact bytes sent). Every response must be no 5xx and must conform to
the document: a documented status, content type, headers and schema (for errors, the envelope
with one of the codes that operation lists).

Examples per operation follow `tests/hypothesis_profiles.py` (`TALLY_HYPOTHESIS=ci` runs more).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CheckFunction
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from api.openapi import build
from api.settings import load_settings
from ingest.stripe import sign
from tests.conftest import OPERATOR_TOKEN, WEBHOOK_SECRET
from tests.helpers import csrf_of
from tests.hypothesis_profiles import examples


def not_a_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """Bad input gets the contract's 4xx, never a 5xx (503 would mean the database failed)."""
    assert response.status_code < 500, f"{response.status_code}: {response.content[:500]!r}"
    return None


CHECKS: list[CheckFunction] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@dataclass
class Credentials:
    """The world schemathesis calls into: the app, a client of it, and live credentials."""

    app: Any
    session: requests.Session
    account_token: str
    workspace_id: str
    program_id: str
    api_key: str
    agent_key: str
    dashboard_cookie: str


def _ok(r: requests.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def _world(app: Any) -> Credentials:
    s = asgi.get_client(app).__enter__()  # starts the app's lifespan (stopped by `shutdown_lifespans`)
    op = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    acct = _ok(
        s.post(
            "/api/v1/operator/accounts", json={"email": "o@brand.test", "workspace_name": "B"}, headers=op
        ),
        201,
    )
    owner = {"Authorization": f"Bearer {acct['token']}"}
    program = _ok(
        s.post("/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "P"}, headers=owner),
        201,
    )
    pid = program["program_id"]
    key = _ok(s.post(f"/api/v1/programs/{pid}/api-key", headers=owner), 201)["api_key"]
    partner = {"code": "alice", "name": "Alice", "email": "alice@partner.test"}
    _ok(s.post(f"/api/v1/programs/{pid}/partners", json=partner, headers=owner), 201)
    agent = _ok(
        s.post(
            "/api/v1/operator/agent-keys",
            json={
                "name": "bot",
                "scopes": ["programs:read", "programs:write"],
                "workspace_ids": [acct["workspace_id"]],
            },
            headers=op,
        ),
        201,
    )
    form = s.get("/dashboard/login")
    r = s.post(
        "/dashboard/login",
        data={"token": acct["token"], "csrf_token": csrf_of(form.text)},
        allow_redirects=False,
    )
    assert r.status_code == 303, r.text
    cookie = s.cookies["tally_session"]
    s.cookies.clear()
    return Credentials(app, s, acct["token"], acct["workspace_id"], pid, key, agent["agent_key"], cookie)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Credentials]:
    database = tmp_path_factory.mktemp("schemathesis") / "tally.duckdb"
    app = create_app(
        load_settings(
            database=str(database),
            operator_token=OPERATOR_TOKEN,
            base_url="http://testserver",
            stripe_webhook_secrets=WEBHOOK_SECRET,
            reconcile_interval_seconds=0,
            public_rate_per_second=0,  # else mostly 429s; tests/api/test_ratelimit.py has those
            refusal_rate_per_second=0,  # likewise (tests/api/test_refusals.py)
        )
    )
    try:
        yield _world(app)
    finally:
        asgi.shutdown_lifespans()


@pytest.fixture(scope="module")
def api_schema(target: Credentials) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", target.app)


def _operations() -> list[str]:
    """`METHOD /path` of every documented operation, listed at collection (no database opened):
    the test checks the list against the /openapi.json it loads."""
    app = create_app(load_settings(database="unused.duckdb", operator_token=OPERATOR_TOKEN))
    doc = build(app.routes, "http://testserver", "0")
    found = [f"{method.upper()} {path}" for path, item in doc["paths"].items() for method in item]
    return [label for label in found if label not in NOT_FUZZED]


# Operations not fuzzed, and why:
# - `GET /openapi.json` is where schemathesis loads the document from (tests/api/test_openapi.py);
# - `POST /api/v1/operator/backup` writes a database copy to any new file the server may create:
#   fuzzed paths would land all over this machine. tests/test_backup.py covers its refusals
#   (bad bodies, bad paths, full disks: 4xx, never 5xx) and its copies.
NOT_FUZZED = ("GET /openapi.json", "POST /api/v1/operator/backup")


def _security(operation: Any) -> list[str]:
    """The schemes of the operation's first `security` requirement ([] when public)."""
    requirements = operation.definition.raw.get("security", [])
    return list(requirements[0]) if requirements else []


def _auth(world: Credentials, schemes: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    tokens = {
        "accountToken": world.account_token,
        "programKey": world.api_key,
        "operatorToken": OPERATOR_TOKEN,
        "agentKey": world.agent_key,
    }
    for scheme in schemes:
        if scheme in tokens:
            return {"Authorization": f"Bearer {tokens[scheme]}"}, {}
        if scheme == "dashboardSession":
            return {}, {"tally_session": world.dashboard_cookie}
    return {}, {}


def _signed_webhook(case: Any, headers: dict[str, str]) -> dict[str, Any]:
    """The delivery's exact bytes, and a real signature over them."""
    sent = case.as_transport_kwargs()
    if "json" in sent:
        raw = json.dumps(sent["json"]).encode()
    else:
        body = sent.get("data") or b""
        raw = body if isinstance(body, bytes) else str(body).encode()
    headers["Stripe-Signature"] = sign(raw, WEBHOOK_SECRET, int(time.time()))
    headers["Content-Type"] = "application/json"
    return {"data": raw, "json": None}


def _after(case: Any, response: requests.Response, world: Credentials) -> None:
    """Keep the program key usable when a call replaced or flagged it."""
    path, method = case.operation.path, case.operation.method.upper()
    if method != "POST" or response.status_code >= 300:
        return
    owner = {"Authorization": f"Bearer {world.account_token}"}
    if path == "/api/v1/programs/{program_id}/api-key":
        world.api_key = response.json()["data"]["api_key"]
    elif path.startswith("/api/v1/operator/programs/{program_id}/"):  # legacy import or rotation flag
        r = world.session.post(f"/api/v1/programs/{world.program_id}/api-key", headers=owner)
        world.api_key = _ok(r, 201)["api_key"]


def _strategy(operation: Any, world: Credentials) -> Any:
    """Valid and invalid requests (where the operation has inputs to break), aimed at the world's
    program and workspace so calls reach past the 404 (tests/api/test_tenancy.py has those)."""
    names = {p.name for p in operation.path_parameters}
    fixed = {
        name: value
        for name, value in (("program_id", world.program_id), ("workspace_id", world.workspace_id))
        if name in names
    }
    strategy = operation.as_strategy(GenerationMode.POSITIVE, path_parameters=fixed or None)
    has_inputs = operation.body or operation.query or set(names) - set(fixed)
    if has_inputs:
        strategy |= operation.as_strategy(GenerationMode.NEGATIVE, path_parameters=fixed or None)
    return strategy


@pytest.mark.parametrize("label", _operations())
def test_every_operation_answers_as_documented(label: str, target: Credentials, api_schema: Any) -> None:
    method, path = label.split(" ", 1)
    operation = api_schema[path][method]
    schemes = _security(operation)
    seen: dict[int, int] = {}

    @given(case=_strategy(operation, target))
    @settings(max_examples=examples(6, 60), suppress_health_check=list(HealthCheck), deadline=None)
    def run(case: Any) -> None:
        headers, cookies = _auth(target, schemes)
        extra: dict[str, Any] = {}
        if path == "/webhooks/stripe":
            extra = _signed_webhook(case, headers)
        response = case.call(session=target.session, headers=headers, cookies=cookies, **extra)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        case.validate_response(response, checks=CHECKS)
        _after(case, response, target)

    run()
    calls = sum(seen.values())
    print(f"{label}: {calls} calls, by status {dict(sorted(seen.items()))}")
    assert calls >= 1
    if schemes and schemes != ["stripeSignature"]:  # the credential sent was taken: not all refused
        assert seen.get(401, 0) < calls, "every call was refused its credential"


def test_the_operations_tried_are_those_of_the_served_document(api_schema: Any) -> None:
    served = {f"{op.ok().method.upper()} {op.ok().path}" for op in api_schema.get_all_operations()}
    assert served == set(_operations()) | {"POST /api/v1/operator/backup"}
