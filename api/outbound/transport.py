"""The HTTP client deliveries go out with: no redirects followed, no proxies from the
environment, and every address checked when the connection is made, after the name is resolved.

httpx resolves and connects inside its connection pool; `GuardedBackend` is that pool's network
backend: it resolves the host itself (`Resolver`: the system's resolver, or a stub in tests),
refuses the connection when any address the name gives is one a delivery may not reach
(`ingest.webhooks_out.addresses.address_allowed`), and otherwise connects to the checked address,
so a name cannot pass the check and then point elsewhere. TLS is still verified against the
name (httpcore sends it as the server name).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable

import httpcore
import httpx

from ingest.webhooks_out.addresses import address_allowed

Resolver = Callable[[str, int], Awaitable[list[str]]]


class AddressRefused(Exception):
    """Raised by `GuardedBackend.connect_tcp` when a delivery's host resolves to an address it may
    not reach (private, loopback, link-local...), before anything is sent."""


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (an address stays itself), in the resolver's order."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [host]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in found:
            found.append(address)
    return found


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, resolving and checking each host before it connects."""

    def __init__(self, allow_private: bool, resolver: Resolver = system_resolver) -> None:
        self._allow_private = allow_private
        self._resolver = resolver
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self._resolver(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        refused = [a for a in addresses if not address_allowed(a, self._allow_private)]
        if refused:
            raise AddressRefused(
                f"{host} resolves to {refused[0]}, a private, loopback or link-local address"
                " (refused; TALLY_WEBHOOKS_ALLOW_PRIVATE=1 allows it for development)"
            )
        last: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise AddressRefused("deliveries never go to a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool whose network backend is `GuardedBackend`."""

    def __init__(
        self, allow_private: bool, resolver: Resolver = system_resolver, connections: int = 50
    ) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=connections,
            max_keepalive_connections=connections,
            keepalive_expiry=30.0,
            network_backend=GuardedBackend(allow_private, resolver),
        )


def client(
    allow_private: bool, resolver: Resolver = system_resolver, timeout: float = 10.0
) -> httpx.AsyncClient:
    """The client deliveries are sent with: guarded, no redirects, no environment proxies."""
    return httpx.AsyncClient(
        transport=GuardedTransport(allow_private, resolver),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(timeout),
        headers={"user-agent": "tally-webhooks/1"},
    )
