"""A delivery never reaches inside (CONTRACT section 13): the address is checked when the
connection is made, after the name is resolved (a stub resolver plays the DNS), so a name that
resolves to a private address is refused before anything is sent; redirects are never followed;
an answer slower than the timeout fails the attempt; 4 KiB of an answer are kept."""

from __future__ import annotations

import asyncio
from typing import Any

import httpcore
import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.outbound import transport
from api.outbound.worker import Deliverer
from api.settings import Settings
from ingest.webhooks_out import schedule
from tests.conftest import World, make_world
from tests.receiver import Receiver


def _app(settings: Settings, allow_private: bool) -> TestClient:
    return TestClient(
        create_app(
            settings.model_copy(update={"webhooks_allow_private": allow_private, "webhooks_delivery": False})
        )
    )


def _ping(world: World, url: str) -> str:
    base = f"/api/v1/programs/{world.program_id}/webhook-endpoints"
    r = world.client.post(base, json={"url": url, "events": ["ping"]}, headers=world.owner)
    assert r.status_code == 201, r.text
    endpoint_id = str(r.json()["data"]["endpoint_id"])
    assert world.client.post(f"{base}/{endpoint_id}/ping", headers=world.owner).status_code == 202
    return endpoint_id


def _last(world: World, endpoint_id: str) -> dict[str, Any]:
    base = f"/api/v1/programs/{world.program_id}/webhook-endpoints/{endpoint_id}/deliveries"
    found: dict[str, Any] = world.client.get(base, headers=world.owner).json()["data"][0]
    return found


class Stub:
    """A resolver that answers from a table and remembers what it was asked."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return self.table[host]


# IPv6 forms of inside IPv4 addresses (NAT64 well-known and local-use prefixes, IPv4-compatible,
# IPv4-mapped, IPv4-translated, 6to4, Teredo), each as a resolver might answer it.
INSIDE_IN_IPV6 = [
    "64:ff9b::a00:1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::a00:1",
    "::a00:1",
    "::7f00:1",
    "::ffff:a9fe:a9fe",
    "::ffff:0:a00:1",
    "2002:a00:1::1",
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",
]


@pytest.mark.parametrize(
    "addresses",
    [["10.0.0.1"], ["93.184.216.34", "10.0.0.1"], ["169.254.169.254"], ["::1"]]
    + [["2606:2800:220:1:248:1893:25c8:1946", a] for a in INSIDE_IN_IPV6],
)
def test_a_name_resolving_to_a_private_address_is_refused_at_connect_time(
    settings: Settings, addresses: list[str]
) -> None:
    with _app(settings, allow_private=False) as client:
        world = make_world(client)
        endpoint_id = _ping(world, "https://hooks.brand.test/tally")  # a name: taken when saved
        stub = Stub({"hooks.brand.test": addresses})
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        assert Deliverer(store, False, resolver=stub).deliver_due() == 1
        found = _last(world, endpoint_id)
    assert stub.asked == ["hooks.brand.test"]
    assert found["status"] == "pending" and found["response_status"] is None
    assert "private, loopback or link-local" in found["error"]
    assert addresses[-1] in found["error"]


def test_the_guard_refuses_before_connecting() -> None:
    stub = Stub({"evil.test": ["10.1.2.3"]})
    backend = transport.GuardedBackend(allow_private=False, resolver=stub)
    with pytest.raises(transport.AddressRefused, match=r"10\.1\.2\.3"):
        asyncio.run(backend.connect_tcp("evil.test", 443))
    with pytest.raises(transport.AddressRefused):
        asyncio.run(backend.connect_unix_socket("/run/docker.sock"))
    empty = transport.GuardedBackend(allow_private=False, resolver=Stub({"none.test": []}))
    with pytest.raises(httpcore.ConnectError):
        asyncio.run(empty.connect_tcp("none.test", 443))


@pytest.mark.parametrize("address", INSIDE_IN_IPV6)
def test_an_address_written_in_the_url_is_refused_when_saved_and_when_sent(
    settings: Settings, address: str
) -> None:
    """Literally in the URL: refused when the endpoint is saved, and, for one saved while the
    setting was on, again by the guard when it is sent (the address is its own resolution)."""
    url = f"https://[{address}]:8443/tally"
    with _app(settings, allow_private=False) as client:
        world = make_world(client)
        base = f"/api/v1/programs/{world.program_id}/webhook-endpoints"
        r = client.post(base, json={"url": url, "events": ["ping"]}, headers=world.owner)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["fields"] == [
            {"field": "url", "message": "must not reach a private, loopback or link-local address"}
        ]
    with pytest.raises(transport.AddressRefused, match=address):
        asyncio.run(transport.GuardedBackend(allow_private=False).connect_tcp(address, 8443))
    with _app(settings, allow_private=True) as client:
        world = make_world(client)
        endpoint_id = _ping(world, url)
    with _app(settings, allow_private=False) as client:
        world.client = client
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        assert Deliverer(store, False).deliver_due() == 1
        found = _last(world, endpoint_id)
    assert found["status"] == "pending" and found["response_status"] is None
    assert found["error"] == "url must not reach a private, loopback or link-local address"


def test_the_connection_goes_to_the_address_that_was_checked(settings: Settings, receiver: Receiver) -> None:
    """With the setting, a name is still resolved by the resolver the check used, and the
    connection is made to that address (here the receiver's, under a name that is not its own)."""
    with _app(settings, allow_private=True) as client:
        world = make_world(client)
        endpoint_id = _ping(world, f"http://hooks.brand.test:{receiver.port}/in")
        stub = Stub({"hooks.brand.test": ["127.0.0.1"]})
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        Deliverer(store, True, resolver=stub).deliver_due()
        assert _last(world, endpoint_id)["status"] == "succeeded"
    [got] = receiver.received
    assert got.path == "/in" and got.headers["host"] == f"hooks.brand.test:{receiver.port}"


def test_http_and_local_addresses_need_the_setting_even_when_sending(
    settings: Settings, receiver: Receiver
) -> None:
    """An endpoint saved while the setting was on is refused when sent once it is off."""
    with _app(settings, allow_private=True) as client:
        world = make_world(client)
        endpoint_id = _ping(world, receiver.url)
    with _app(settings, allow_private=False) as client:
        world.client = client
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        Deliverer(store, False).deliver_due()
        found = _last(world, endpoint_id)
    assert receiver.received == []
    assert found["error"].startswith("url must be an https:// URL")


def test_redirects_are_not_followed(settings: Settings, receiver: Receiver) -> None:
    inside = Receiver()  # where the redirect points: it must never hear from tally
    try:
        with _app(settings, allow_private=True) as client:
            world = make_world(client)
            for target in (f"{inside.url}/admin", "http://10.0.0.1/latest/meta-data"):
                receiver.answer((302, {"location": target}, b""))
                endpoint_id = _ping(world, receiver.url)
                client.app.state.webhooks.deliver_due()  # type: ignore[attr-defined]
                found = _last(world, endpoint_id)
                assert found["response_status"] == 302 and found["status"] == "pending"
                assert found["error"] == "HTTP 302 (redirects are not followed)"
        assert inside.received == []
        assert len(receiver.received) == 2
    finally:
        inside.close()


def test_an_answer_slower_than_the_timeout_fails_and_4_kib_of_a_body_are_kept(
    settings: Settings, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule, "TIMEOUT_SECONDS", 0.5)
    with _app(settings, allow_private=True) as client:
        world = make_world(client)
        receiver.hang.set()
        endpoint_id = _ping(world, receiver.url)
        client.app.state.webhooks.deliver_due()  # type: ignore[attr-defined]
        receiver.release()
        slow = _last(world, endpoint_id)
        receiver.answer((200, {}, "é".encode() * 5000))
        endpoint_id = _ping(world, receiver.url)
        client.app.state.webhooks.deliver_due()  # type: ignore[attr-defined]
        big = _last(world, endpoint_id)
    assert slow["error"] == "no complete answer within 0.5 s" and slow["status"] == "pending"
    assert big["status"] == "succeeded"
    assert len(big["attempt_log"][0]["response_body"].encode()) <= schedule.BODY_KEPT + 3
