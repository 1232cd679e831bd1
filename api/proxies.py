"""The client's address: the peer's, unless the peer is a trusted proxy (`TALLY_TRUSTED_PROXIES`),
in which case `X-Forwarded-For` is walked from the right past trusted hops.

uvicorn runs with its own proxy-header handling off (`api.serving`), so `scope["client"]` is the
socket's peer and nothing a client writes in a header is believed unless a trusted proxy wrote it.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from starlette.types import Scope

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_networks(value: str) -> tuple[Network, ...]:
    """`"10.0.0.1, 192.168.0.0/16, ::1"` as networks (a single address is a /32 or /128 network).
    Raises ValueError naming the first malformed entry (host bits set in a network included)."""
    networks: list[Network] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=True))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not an IP address or network ({exc})") from None
    return tuple(networks)


@lru_cache(maxsize=8)
def _trusted(value: str) -> tuple[Network, ...]:
    return parse_networks(value)


def _address(text: str) -> Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]" or "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_trusted(address: Address | None, networks: tuple[Network, ...]) -> bool:
    return address is not None and any(address in network for network in networks)


def client_address(scope: Scope, trusted_proxies: str) -> str:
    """The address a rate limit should key on.

    The peer address, unless the peer is trusted: then `X-Forwarded-For` (every such header, in
    order) is read right to left, skipping trusted hops; the first untrusted address is the client.
    When every hop is trusted the leftmost is taken; an entry that is not an address ends the walk
    at the trusted hop that reported it (only a trusted proxy could have written it there).
    """
    peer = scope.get("client")
    host = peer[0] if peer else "unknown"
    if not trusted_proxies:
        return str(host)
    networks = _trusted(trusted_proxies)
    current = _address(host)
    if not _is_trusted(current, networks):
        return str(current) if current is not None else str(host)
    hops: list[str] = []
    for name, value in scope["headers"]:
        if name == b"x-forwarded-for":
            hops.extend(value.decode("latin-1").split(","))
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            break
        current = address
        if not _is_trusted(current, networks):
            break
    return str(current)
