"""`tally webhooks list|create|update|delete|rotate|ping|deliveries|resend` against a live server
with its delivery worker on and a real receiver (CONTRACT sections 10 and 13)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import OP, LiveServer, start_server
from tests.processes import wait_until
from tests.receiver import Receiver
from tests.test_cli_ops import tally


@pytest.fixture
def hooks_server(tmp_path: Path) -> Iterator[LiveServer]:
    server = start_server(tmp_path / "cli.duckdb", TALLY_WEBHOOKS_ALLOW_PRIVATE="1")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_the_webhooks_commands(hooks_server: LiveServer, tmp_path: Path) -> None:
    url = hooks_server.url
    with httpx.Client(base_url=url, timeout=30) as c:
        acct = c.post(
            "/api/v1/operator/accounts", json={"email": "w@x.test", "workspace_name": "W"}, headers=OP
        ).json()["data"]
        auth = {"Authorization": f"Bearer {acct['token']}"}
        pid = c.post(
            "/api/v1/programs", json={"workspace_id": acct["workspace_id"], "name": "P"}, headers=auth
        ).json()["data"]["program_id"]
    home = tmp_path / "cfg"
    assert tally(home, "login", "--url", url, "--token", acct["token"]).returncode == 0
    receiver = Receiver()
    try:
        prog = ("--program", pid)
        r = tally(
            home, "webhooks", "create", *prog, "--url", receiver.url + "/in", "--event", "ping,sale.created"
        )
        assert r.returncode == 0, r.stderr
        secret = r.stdout.split("signing secret (shown once): ")[1].split()[0]
        assert secret.startswith("whsec_")
        r = tally(home, "webhooks", "list", *prog, "--json")
        [endpoint] = json.loads(r.stdout)
        assert endpoint["events"] == ["ping", "sale.created"] and secret not in r.stdout
        ep = ("--endpoint", endpoint["endpoint_id"])
        r = tally(home, "webhooks", "list", *prog)  # a pipe: tab-separated rows
        assert r.stdout.split("\t")[0] == endpoint["endpoint_id"]

        r = tally(home, "webhooks", "ping", *prog, *ep)
        assert r.returncode == 0 and "ping queued" in r.stdout, r.stderr
        receiver.wait_for(1)
        assert (
            Webhook(secret).verify(receiver.received[0].body, receiver.received[0].headers)["type"] == "ping"
        )

        def succeeded() -> list[dict[str, object]]:
            out = tally(home, "webhooks", "deliveries", *prog, *ep, "--status", "succeeded", "--json")
            found: list[dict[str, object]] = json.loads(out.stdout)
            return found

        wait_until(lambda: len(succeeded()) == 1, "the ping recorded as succeeded", 30, 0.2)
        [delivery] = succeeded()
        r = tally(home, "webhooks", "resend", *prog, *ep, "--delivery", str(delivery["delivery_id"]))
        assert r.returncode == 0, r.stderr
        receiver.wait_for(2)
        assert receiver.ids() == [delivery["event_id"]] * 2

        r = tally(home, "webhooks", "rotate", *prog, *ep)
        assert r.returncode == 0 and "new signing secret (shown once): whsec_" in r.stdout
        r = tally(home, "webhooks", "update", *prog, *ep, "--disable", "--json")
        assert json.loads(r.stdout)["enabled"] is False
        r = tally(home, "webhooks", "update", *prog, *ep)
        assert r.returncode == 2 and "nothing to change" in r.stderr
        r = tally(home, "webhooks", "create", *prog, "--url", "ftp://x.test", "--event", "ping")
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "url" in r.stderr
        r = tally(home, "webhooks", "delete", *prog, *ep)
        assert r.returncode == 0 and "deleted" in r.stdout
        assert json.loads(tally(home, "webhooks", "list", *prog, "--json").stdout) == []
    finally:
        receiver.close()
