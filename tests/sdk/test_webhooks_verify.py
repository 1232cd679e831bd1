"""`tally_sdk.webhooks.verify` against real deliveries from the app, beside the `standardwebhooks`
package, and the example receiver (sdk/examples/webhook_receiver.py) run as a process of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tally_sdk.webhooks import WebhookVerificationError, sign, verify
from tests.conftest import ROOT, World, free_port, make_world
from tests.processes import wait_until
from tests.receiver import Receiver


@pytest.fixture
def app_client(settings: Settings) -> Iterator[TestClient]:
    changed = settings.model_copy(update={"webhooks_allow_private": True, "webhooks_delivery": False})
    with TestClient(create_app(changed)) as c:
        yield c


def _ping_to(world: World, url: str) -> tuple[str, str]:
    base = f"/api/v1/programs/{world.program_id}/webhook-endpoints"
    made = world.client.post(base, json={"url": url, "events": ["ping"]}, headers=world.owner).json()["data"]
    assert world.client.post(f"{base}/{made['endpoint_id']}/ping", headers=world.owner).status_code == 202
    world.client.app.state.webhooks.deliver_due()  # type: ignore[attr-defined]
    return str(made["secret"]), str(made["endpoint_id"])


def test_verify_accepts_tallys_deliveries_and_refuses_anything_else(app_client: TestClient) -> None:
    receiver = Receiver()
    try:
        world = make_world(app_client)
        secret, _ = _ping_to(world, receiver.url)
        [got] = receiver.received
    finally:
        receiver.close()
    event: dict[str, Any] = verify(got.body, got.headers, secret)
    assert event == Webhook(secret).verify(got.body, got.headers)
    assert event["type"] == "ping" and event["id"] == got.headers["webhook-id"]
    other = "whsec_" + "A" * 43 + "="
    assert verify(got.body.decode(), got.headers, [other, secret]) == event  # one of several secrets
    upper = {k.upper(): v for k, v in got.headers.items()}
    assert verify(got.body, upper, secret) == event
    stamp = int(got.headers["webhook-timestamp"])
    refusals = [
        (got.body, got.headers, other),
        (got.body.replace(b"ping", b"pong"), got.headers, secret),
        (got.body, {k: v for k, v in got.headers.items() if k != "webhook-signature"}, secret),
        (got.body, {**got.headers, "webhook-timestamp": "soon"}, secret),
        (got.body, {**got.headers, "webhook-id": "evt_other"}, secret),
        (got.body, got.headers, "whsec_not base64!"),
    ]
    for body, headers, key in refusals:
        with pytest.raises(WebhookVerificationError):
            verify(body, headers, key)
    with pytest.raises(WebhookVerificationError, match="too far"):
        verify(got.body, got.headers, secret, now=stamp + 301)
    assert verify(got.body, got.headers, secret, now=stamp + 299) == event
    assert (
        sign(secret, got.headers["webhook-id"], stamp, got.body) in got.headers["webhook-signature"].split()
    )


@pytest.mark.slow
def test_the_example_receiver_takes_a_delivery_once(app_client: TestClient) -> None:
    world = make_world(app_client)
    port = free_port()
    base = f"/api/v1/programs/{world.program_id}/webhook-endpoints"
    made = app_client.post(
        base, json={"url": f"http://127.0.0.1:{port}/tally", "events": ["ping"]}, headers=world.owner
    )
    secret, endpoint_id = made.json()["data"]["secret"], made.json()["data"]["endpoint_id"]
    example = subprocess.Popen(
        [sys.executable, "sdk/examples/webhook_receiver.py", str(port)],
        cwd=ROOT,
        env={"TALLY_WEBHOOK_SECRET": secret, "PYTHONUNBUFFERED": "1", "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _listening(port), "the example receiver to listen", 30, 0.05)
        delivery = app_client.post(f"{base}/{endpoint_id}/ping", headers=world.owner).json()["data"]
        app_client.app.state.webhooks.deliver_due()  # type: ignore[attr-defined]
        resend = f"{base}/{endpoint_id}/deliveries/{delivery['delivery_id']}/resend"
        assert app_client.post(resend, headers=world.owner).status_code == 202  # the same event again
        app_client.app.state.webhooks.deliver_due()  # type: ignore[attr-defined]
        [found] = app_client.get(f"{base}/{endpoint_id}/deliveries", headers=world.owner).json()["data"]
        assert (found["status"], found["response_status"], found["attempt"]) == ("succeeded", 204, 2)
        forged = httpx.post(
            f"http://127.0.0.1:{port}/tally",
            content=b'{"id": "evt_x", "type": "ping"}',
            headers={
                "webhook-id": "evt_x",
                "webhook-timestamp": str(int(time.time())),
                "webhook-signature": "v1,AAAA",
            },
        )
        assert forged.status_code == 400
    finally:
        example.terminate()
        out, _ = example.communicate(timeout=10)
    assert out.count("ping: evt_") == 1  # handled once, though delivered twice


def _listening(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
    except httpx.HTTPError:
        return False
    return True
