"""The rules of webhooks to brand servers that need no server (ingest/webhooks_out/): signatures
that the `standardwebhooks` package accepts, stable event ids, the retry schedule, and which URLs
and addresses a delivery may reach."""

from __future__ import annotations

import random
import typing
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import time_machine
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ingest.webhooks_out import events, schedule, signing
from ingest.webhooks_out.addresses import address_allowed, url_problem
from ingest.webhooks_out.inputs import EventType

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def test_the_event_types_are_the_contracts_and_the_models_take_them_all() -> None:
    assert list(typing.get_args(EventType)) == list(events.EVENT_TYPES)
    assert set(events.DESCRIPTIONS) == set(events.EVENT_TYPES)
    assert len(events.EVENT_TYPES) == 11


def test_signatures_verify_with_the_standard_webhooks_package() -> None:
    secret, other = signing.new_secret(), signing.new_secret()
    assert secret.startswith("whsec_") and len(signing.key_of(secret)) == 32 and secret != other
    body = events.body("evt_1", "ping", NOW, "prog_1", {"message": "héllo"})
    with time_machine.travel(NOW, tick=False):
        headers = signing.headers("evt_1", int(NOW.timestamp()), body, [secret, other])
        assert headers["webhook-timestamp"] == str(int(NOW.timestamp()))
        for each in (secret, other):
            assert Webhook(each)._whsecret == signing.key_of(each)
            assert Webhook(each).verify(body, headers)["data"] == {"message": "héllo"}
            assert Webhook(each).sign("evt_1", NOW, body.decode()) in headers["webhook-signature"].split(" ")
        with pytest.raises(WebhookVerificationError):
            Webhook(signing.new_secret()).verify(body, headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(body.replace(b"prog_1", b"prog_2"), headers)
    assert signing.mask(secret) == "whsec_••••••••" + secret[-4:]


def test_event_ids_follow_from_what_the_event_says() -> None:
    a = events.event_id("sale.created", "prog_1", "sale_1")
    assert a == events.event_id("sale.created", "prog_1", "sale_1")
    assert a.startswith("evt_") and len(a) == 36
    others = {
        events.event_id("sale.refunded", "prog_1", "sale_1"),
        events.event_id("sale.created", "prog_2", "sale_1"),
        events.event_id("sale.created", "prog_1", "sale_2"),
        events.event_id("sale.created", "prog_1", "sale_1", 1),
    }
    assert a not in others and len(others) == 4
    body = orjson.loads(events.body(a, "sale.created", NOW, "prog_1", {"at": NOW}))
    at = "2026-11-21T10:00:00Z"
    assert body == {
        "id": a,
        "type": "sale.created",
        "timestamp": at,
        "program_id": "prog_1",
        "data": {"at": at},
    }


def test_the_retry_schedule_backs_off_with_jitter_for_three_days() -> None:
    rng = random.Random(7)
    first = NOW
    at, failed, waits = NOW, 0, []
    while True:
        failed += 1
        nxt = schedule.next_attempt(first, failed, at, rng)
        if nxt is None:
            break
        waits.append(nxt - at)
        at = nxt
    assert at <= first + schedule.RETRY_WINDOW
    assert 15 <= len(waits) <= 25
    for n, wait in enumerate(waits[:10]):
        nominal = timedelta(seconds=30 * 2**n)
        assert nominal * 0.8 <= wait <= nominal * 1.2
    assert all(timedelta(hours=6) * 0.8 <= w <= timedelta(hours=6) * 1.2 for w in waits[10:])
    table = schedule.schedule_table()
    assert table[0] == (2, timedelta(seconds=30)) and table[-1][1] == timedelta(hours=6)
    assert sum((w for _, w in table), timedelta()) <= schedule.RETRY_WINDOW


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("10.0.0.1", False),
        ("172.16.5.4", False),
        ("192.168.1.1", False),
        ("127.0.0.1", False),
        ("0.0.0.0", False),  # noqa: S104 (an address refused, not bound)
        ("169.254.169.254", False),
        ("100.64.0.1", False),  # carrier-grade NAT
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:10.0.0.1", False),  # IPv4-mapped
        ("::ffff:93.184.216.34", True),
        ("2002:0a00:0001::1", False),  # 6to4 of 10.0.0.1
        ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", False),  # 6to4 of 169.254.169.254
        ("2002:5db8:d822::1", True),  # 6to4 of 93.184.216.34
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::ffff:100.64.0.1", False),
        ("::ffff:224.0.0.1", False),
        ("64:ff9b::10.0.0.1", False),  # NAT64 well-known prefix: judged by the IPv4 address
        ("64:ff9b::a00:1", False),
        ("64:ff9b::127.0.0.1", False),
        ("64:ff9b::169.254.169.254", False),
        ("64:ff9b::192.168.1.1", False),
        ("64:ff9b::100.64.0.1", False),
        ("64:ff9b::0.0.0.0", False),
        ("64:ff9b::224.0.0.1", False),
        ("64:ff9b::93.184.216.34", True),  # what DNS64 answers for a public IPv4-only name
        ("64:ff9b:1::a00:1", False),  # NAT64 local-use prefix: refused whatever it carries
        ("64:ff9b:1:5db8:d8:2200::", False),  # 93.184.216.34 in RFC 6052's /48 layout
        ("64:ff9b:1:ffff::5db8:d822", False),
        ("::10.0.0.1", False),  # IPv4-compatible (deprecated): refused whatever it carries
        ("::127.0.0.1", False),
        ("::169.254.169.254", False),
        ("::93.184.216.34", False),
        ("::ffff:0:10.0.0.1", False),  # IPv4-translated (SIIT): likewise
        ("::ffff:0:93.184.216.34", False),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False),  # Teredo, client 10.0.0.1
        ("2001:0:5db8:d822:8000:63bf:a247:27dd", False),  # Teredo, client 93.184.216.34
        ("::", False),
        ("224.0.0.1", False),
        ("not an address", False),
    ],
)
def test_which_addresses_a_delivery_may_reach(address: str, allowed: bool) -> None:
    assert address_allowed(address, allow_private=False) is allowed
    assert address_allowed(address, allow_private=True) is True


def test_which_urls_an_endpoint_may_have() -> None:
    assert url_problem("https://hooks.brand.test/tally?x=1", False) is None
    assert url_problem("https://93.184.216.34:8443/x", False) is None
    refused = [
        "http://hooks.brand.test/x",
        "https://127.0.0.1/x",
        "https://localhost:8443/x",
        "https://api.localhost/x",
        "https://[fe80::1]/x",
        "https://u:p@hooks.brand.test/",
        "https://hooks.brand.test/#frag",
        "https:///nohost",
        "hooks.brand.test/x",
        "https://hooks.brand.test:0/",
        "https://hooks.brand.test:99999/",
    ]
    for url in refused:
        assert url_problem(url, False) is not None, url
    assert url_problem("http://127.0.0.1:8000/x", True) is None
    assert url_problem("https://[64:ff9b::5db8:d822]/x", False) is None
    for host in ("64:ff9b::a00:1", "64:ff9b:1::a00:1", "::a00:1", "::ffff:7f00:1", "2002:a00:1::1"):
        problem = url_problem(f"https://[{host}]:8443/x", False)
        assert problem == "must not reach a private, loopback or link-local address", host
        assert url_problem(f"http://[{host}]:8443/x", True) is None
    assert url_problem("ftp://127.0.0.1/x", True) is not None
