"""Where a delivery may go (CONTRACT section 13): `https://` URLs only, and never to a private,
loopback, link-local or otherwise non-public address. The URL is checked when an endpoint is
saved (`url_problem`) and the address again when a delivery connects, after the name is
resolved (api/outbound/transport.py asks `address_allowed` of every address the name gives), so
a name that points inside, or is made to later, is refused. IPv6 addresses that carry an IPv4
one are judged by it or refused outright (`address_allowed` says which), so NAT64, IPv4-mapped or
6to4 spellings of an inside IPv4 address do not pass. `TALLY_WEBHOOKS_ALLOW_PRIVATE=1` lifts
both rules (`http://` and local addresses) for development and tests.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

# Names that are local whatever a resolver says.
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


# IPv6 forms that stand for an IPv4 address in their last 32 bits, and that a delivery may meet
# for a public receiver: judged by that IPv4 address alone, which is where the connection goes.
# A dual-stack resolver answers IPv4-mapped addresses (RFC 4291 2.5.5.2; the kernel connects over
# IPv4); DNS64 on an IPv6-only host answers the NAT64 well-known prefix for every IPv4-only name
# (RFC 6052: the gateway connects to the embedded address, private ones included if it lets them).
JUDGED_BY_IPV4 = (ipaddress.IPv6Network("::ffff:0:0/96"), ipaddress.IPv6Network("64:ff9b::/96"))

# IPv6 forms refused whatever they carry: deprecated or local forms no public receiver is reached
# by, and whose embedded IPv4 address is not where the connection goes or cannot be read.
REFUSED_FORMS = (
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (RFC 4291 2.5.5.1, deprecated), :: and ::1
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated (RFC 2765, SIIT)
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # NAT64 local use (RFC 8215): the operator's layout
    ipaddress.IPv6Network("2001::/32"),  # Teredo (RFC 4380): the client's address is obfuscated
)


def address_allowed(address: str, allow_private: bool) -> bool:
    """Whether a delivery may connect to `address` (an IP address as text): a globally routable
    unicast address, or anything with `allow_private`. An IPv6 address that stands for an IPv4
    one (IPv4-mapped, NAT64 `64:ff9b::/96`) is judged by that IPv4 address; one that carries an
    IPv4 address it is routed by (6to4 `2002::/16`) is judged by both; IPv4-compatible
    (`::a.b.c.d`), IPv4-translated, NAT64 local-use (`64:ff9b:1::/48`) and Teredo addresses are
    refused whatever they carry. The rule is written out here rather than left to `is_global`,
    whose tables differ between Python releases."""
    if allow_private:
        return True
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in form for form in JUDGED_BY_IPV4):
            return _public(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if any(ip in form for form in REFUSED_FORMS):
            return False
        if ip.sixtofour is not None and not _public(ip.sixtofour):
            return False
    return _public(ip)


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast


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
