"""The client address behind the public rate limit: the peer's, unless a trusted proxy forwarded it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.proxies import client_address, parse_networks
from api.settings import SettingsError, load_settings
from tests.conftest import OPERATOR_TOKEN

CLICK = "/api/v1/track/click"


def scope(peer: str, *forwarded: str) -> dict[str, Any]:
    return {"client": (peer, 5000), "headers": [(b"x-forwarded-for", v.encode()) for v in forwarded]}


def test_untrusted_peer_is_the_client_whatever_it_forwards() -> None:
    assert client_address(scope("203.0.113.9", "198.51.100.1"), "") == "203.0.113.9"
    assert client_address(scope("203.0.113.9", "198.51.100.1"), "127.0.0.1") == "203.0.113.9"


def test_trusted_peer_walks_forwarded_for_from_the_right() -> None:
    trusted = "127.0.0.1,10.0.0.0/8"
    # client, then a proxy inside 10/8 appended what it saw; 127.0.0.1 is the last hop
    assert client_address(scope("127.0.0.1", "6.6.6.6, 198.51.100.1, 10.1.2.3"), trusted) == "198.51.100.1"
    # several header lines read as one list, in order
    assert client_address(scope("127.0.0.1", "6.6.6.6", "198.51.100.1, 10.1.2.3"), trusted) == "198.51.100.1"
    assert client_address(scope("127.0.0.1"), trusted) == "127.0.0.1"  # nothing forwarded
    assert client_address(scope("127.0.0.1", "10.0.0.1"), trusted) == "10.0.0.1"  # all trusted: leftmost
    # garbage can only have come from the trusted hop's peer: the walk stops at that hop
    assert client_address(scope("127.0.0.1", "not-an-ip, 10.0.0.2"), trusted) == "10.0.0.2"
    assert client_address(scope("127.0.0.1", "[2001:db8::1]"), trusted) == "2001:db8::1"


def test_ipv4_mapped_peer_matches_ipv4_networks() -> None:
    assert client_address(scope("::ffff:127.0.0.1", "198.51.100.1"), "127.0.0.1") == "198.51.100.1"


def test_trusted_proxies_setting_parses_or_refuses() -> None:
    assert [str(n) for n in parse_networks(" 127.0.0.1, 10.0.0.0/8 ,::1")] == [
        "127.0.0.1/32",
        "10.0.0.0/8",
        "::1/128",
    ]
    for bad in ("localhost", "10.0.0.1/8", "10.0.0.0/33", "1.2.3"):
        with pytest.raises(SettingsError, match=r"^TALLY_TRUSTED_PROXIES: .*not an IP address"):
            load_settings(operator_token=OPERATOR_TOKEN, trusted_proxies=bad)


@contextmanager
def app_with(tmp_path: Path, **settings: Any) -> Iterator[Any]:
    s = load_settings(
        database=str(tmp_path / "tally.duckdb"),
        operator_token=OPERATOR_TOKEN,
        base_url="http://testserver",
        reconcile_interval_seconds=0,
        public_rate_per_second=0.001,
        public_rate_burst=3,
        **settings,
    )
    app = create_app(s)
    with TestClient(app):  # runs the lifespan once; clients below share it
        yield app


def click(app: Any, peer: str, forwarded: str | None = None) -> int:
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    client = TestClient(app, client=(peer, 40000))
    return client.post(CLICK, json={}, headers=headers).status_code


def test_spoofed_forwarded_for_neither_escapes_nor_locks_out(tmp_path: Path) -> None:
    with app_with(tmp_path) as app:
        statuses = [click(app, "203.0.113.9", f"198.51.100.{i}") for i in range(5)]
        assert statuses[3:] == [429, 429]  # a new X-Forwarded-For each time is still the same client
        assert 429 not in statuses[:3]
        # another peer naming the victim in X-Forwarded-For uses up only its own bucket
        for _ in range(5):
            click(app, "198.51.100.66", "203.0.113.10")
        assert click(app, "203.0.113.10") != 429


def test_trusted_proxy_forwarded_address_is_the_client(tmp_path: Path) -> None:
    with app_with(tmp_path, trusted_proxies="127.0.0.1") as app:
        # five clients behind the proxy, one request each: none limited
        assert 429 not in [click(app, "127.0.0.1", f"198.51.100.{i}") for i in range(5)]
        # one client behind the proxy: limited after its burst, others still served
        statuses = [click(app, "127.0.0.1", "192.0.2.1") for _ in range(4)]
        assert statuses[-1] == 429
        assert click(app, "127.0.0.1", "192.0.2.2") != 429
