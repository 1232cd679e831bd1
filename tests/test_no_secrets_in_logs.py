"""No credential, key, token, session cookie or webhook signing secret reaches a log line: every
kind of request, failures, an unexpected error, key regeneration and a reconcile go through the
real app with logging at DEBUG in both formats, and the whole output is searched for each secret
and for pieces of it."""

from __future__ import annotations

import io
import time

import orjson
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from api import observability
from api.app import create_app
from api.settings import Settings
from ingest.stripe import sign
from tests.conftest import OP, OPERATOR_TOKEN, bearer, make_world
from tests.helpers import login


async def boom(request: Request) -> Response:
    raise RuntimeError("boom while handling a credentialed request")


def pieces(secret: str) -> list[str]:
    """The secret, its part after a type prefix (`acct_`, `whsec_`...), and every 10-character
    window of that part: a truncated or re-prefixed secret is still caught."""
    body = secret.split("_", 1)[1] if "_" in secret[:8] else secret
    return [secret, body, *(body[i : i + 10] for i in range(len(body) - 9))]


def drive(client: TestClient, settings: Settings) -> list[str]:
    """Every kind of request the service answers, with credentials, failing ones too; the
    secrets that were in play."""
    secrets = [OPERATOR_TOKEN, *settings.webhook_secrets()]
    world = make_world(client, stripe_account_id="acct_logs_test")
    secrets += [world.account_token, world.api_key]
    old_key = world.api_key
    # key regeneration: the new key is answered once; the old one is refused afterwards
    r = client.post(f"/api/v1/programs/{world.program_id}/api-key", headers=world.owner)
    assert r.status_code == 201, r.text
    new_key = r.json()["data"]["api_key"]
    secrets.append(new_key)
    assert world.sale(transaction_id="in_old").status_code == 401
    world.api_key = new_key
    assert world.sale(transaction_id="in_new").status_code == 200
    assert world.sale(transaction_id="in_new").status_code == 409
    for path in ("sale", "refund", "lead"):
        client.post(f"/api/v1/track/{path}", content=b"{not json", headers=bearer(new_key))
        client.post(f"/api/v1/track/{path}", json={"transaction_id": "t"}, headers=bearer(old_key))
    client.post("/api/v1/track/click", json={"program_id": world.program_id, "partner_code": "alice"})
    # members, agent keys, operator failures
    r = client.post(
        f"/api/v1/workspaces/{world.workspace_id}/members",
        json={"email": "m@x.test", "role": "member"},
        headers=world.owner,
    )
    member = r.json()["data"]["token"]
    secrets.append(member)
    client.get("/api/v1/programs", headers=bearer(member))
    r = client.post(
        "/api/v1/operator/agent-keys",
        json={"name": "t", "scopes": ["programs:read"], "workspace_ids": [world.workspace_id]},
        headers=OP,
    )
    agent = r.json()["data"]["agent_key"]
    secrets.append(agent)
    client.get(f"/api/agent/v1/programs/{world.program_id}", headers=bearer(agent))
    client.patch(f"/api/agent/v1/programs/{world.program_id}", json={"x": 1}, headers=bearer(agent))
    wrong = "op-wrong-token-0123456789abcdef"
    secrets.append(wrong)
    client.post("/api/v1/operator/reconcile", headers=bearer(wrong))
    client.get("/metrics", headers=bearer(wrong))
    client.get("/metrics", headers=OP)
    client.get("/api/v1/programs", headers={"Authorization": f"Basic {world.account_token}"})
    # webhooks: signed, wrongly signed, signed with an unknown secret
    body = orjson.dumps(
        {"id": "evt_logs_1", "object": "event", "type": "customer.created", "data": {}, "account": "acct_x"}
    )
    now = int(time.time())
    for signature in (sign(body, secrets[1], now), "t=1,v1=deadbeef", sign(body, "whsec_unknown_12345", now)):
        client.post("/webhooks/stripe", content=body, headers={"Stripe-Signature": signature})
    secrets.append("whsec_unknown_12345")
    # the dashboard: a session cookie, pages read with it, a failed login
    r = login(client, world.account_token)
    cookie = next(
        h.split(";", 1)[0].removeprefix("tally_session=")
        for h in r.headers.get_list("set-cookie")
        if h.startswith("tally_session=")
    )
    secrets.append(cookie)
    client.get("/dashboard")
    client.get(f"/dashboard/programs/{world.program_id}")
    login(client, "acct_not_a_real_token_0123456789")
    secrets.append("acct_not_a_real_token_0123456789")
    # an unexpected error on a credentialed request, and a reconcile
    client.get("/test/boom", headers=world.owner)
    assert client.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
    return secrets


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_no_secret_reaches_a_log_line(settings: Settings, log_format: str) -> None:
    out = io.StringIO()
    observability.configure_logging(
        settings.model_copy(update={"log_format": log_format, "log_level": "DEBUG"}), out
    )
    try:
        app = create_app(settings)
        app.router.routes.append(Route("/test/boom", boom, methods=["GET"]))
        with TestClient(app) as client:
            secrets = drive(client, settings)
    finally:
        observability.stop_logging()
    text = out.getvalue()
    assert text.count("tally.access") >= 30 and "boom while handling" in text  # the log was written
    for secret in secrets:
        for piece in pieces(secret):
            assert piece not in text, f"a log line holds (part of) a secret: {piece!r}"
