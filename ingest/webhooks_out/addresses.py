"""Where a delivery may go (CONTRACT section 13): `https://` URLs only, and never to a private,
loopback, link-local or otherwise non-public address. The URL is checked when an endpoint is
saved (`url_problem`) and the address again when a delivery connects, after the name is
resolved (api/outbound/transport.py asks `address_allowed` of every address the name gives), so
a name that points inside, or is made to later, is refused. `TALLY_WEBHOOKS_ALLOW_PRIVATE=1`
lifts both rules (`http://` and local addresses) for development and tests.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

# Names that are local whatever a resolver says.
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def address_allowed(address: str, allow_private: bool) -> bool:
    """Whether a delivery may connect to `address` (an IP address as text): a globally routable
    unicast address, or anything with `allow_private`. An IPv6 address that carries an IPv4 one
    (mapped, 6to4, Teredo) is judged by the IPv4 address too."""
    if allow_private:
        return True
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in (ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None):
            if inner is not None:
                candidates.append(inner)
    return all(c.is_global and not c.is_multicast for c in candidates)


def url_problem(url: str, allow_private: bool) -> str | None:
    """Why `url` cannot be an endpoint, or None: an absolute `https://` URL (or `http://` with
    `allow_private`) with a host, no user or password, no fragment, and, when its host is an
    address or a local name, one a delivery may reach."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    schemes = ("https", "http") if allow_private else ("https",)
    if parts.scheme.lower() not in schemes:
        if parts.scheme.lower() == "http":
            return "must be an https:// URL (http:// only with TALLY_WEBHOOKS_ALLOW_PRIVATE=1)"
        return "must be an https:// URL"
    host = parts.hostname
    if not host:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password"
    if parts.fragment:
        return "must not have a #fragment"
    if port == 0:
        return "must not use port 0"
    if any(ch.isspace() for ch in url):
        return "must not contain spaces"
    if allow_private:
        return None
    if host.lower().rstrip(".") in LOCAL_NAMES or host.lower().rstrip(".").endswith(".localhost"):
        return "must not reach a loopback address"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: its addresses are checked when a delivery connects
    if not address_allowed(host, allow_private=False):
        return "must not reach a private, loopback or link-local address"
    return None
