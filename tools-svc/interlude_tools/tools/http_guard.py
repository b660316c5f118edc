"""Where an HTTP tool may connect: public addresses only, and only the origin it was given.

An allow-list of host names does not stop server-side request forgery on its own: an allowed
name can resolve to 169.254.169.254 (the cloud's metadata service) or to 127.0.0.1 (DNS
rebinding), a URL can spell 127.0.0.1 as `2130706433`, `0x7f000001`, `127.1` or
`[::ffff:127.0.0.1]`, and a redirect can move a request, headers and all, to another scheme
or port of an allowed host. So the tool's connections are made by `GuardedBackend`: it resolves
the name itself, refuses the connection if any address it resolves to is not public, and
connects to the address it checked, never to the name again (TLS still verifies the name, and
the Host header stays the name). Redirects are held to the first URL's scheme, host and port
(`redirect_refusal`). Every refusal is an exception whose message starts with "refused:",
which the registry turns into a `tool_error` the model sees; none is retried.

`allow_private_networks` lets a tool reach loopback, private (RFC 1918, ULA) and other
non-public unicast addresses, for an internal service an operator chose and for tests.
Unspecified, link-local (the metadata service), multicast and reserved addresses stay refused,
and so do metadata services at private addresses (AWS's fd00:ec2::254).
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterable
from ipaddress import IPv4Address, IPv6Address, IPv6Network, ip_address

import anyio
import httpcore
import httpx

IPAddress = IPv4Address | IPv6Address
# (host, port) -> the addresses to try, in order.
Resolver = Callable[[str, int], Awaitable[list[str]]]

# DNS64 answers with this prefix for IPv4-only hosts, and a NAT64 gateway turns it back into the
# IPv4 address at its end, so the embedded IPv4 address is what gets reached.
_NAT64 = IPv6Network("64:ff9b::/96")
# Kinds that `allow_private_networks` opens; every other kind is refused whatever the config.
_PRIVATE_KINDS = frozenset(
    {"a loopback address", "a private address", "a site-local address", "a non-public address"}
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Cloud metadata services at addresses that are not link-local, so "private" would open them:
# AWS's IPv6 endpoint sits in fc00::/7 (unique local). Refused whatever the config.
_METADATA = frozenset({IPv6Address("fd00:ec2::254")})


class AddressNotAllowed(RuntimeError):
    """A connection would go to an address the tool may not reach."""


class RedirectNotAllowed(RuntimeError):
    """A redirect would leave the scheme, host and port the tool was configured with."""


def _embedded_ipv4(ip: IPAddress) -> IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: "::ffff:127.0.0.1" reaches 127.0.0.1 on a
    dual-stack socket, and a NAT64 address the IPv4 one in its last 32 bits."""
    if not isinstance(ip, IPv6Address):
        return None
    return ip.ipv4_mapped or (IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)


def address_kind(ip: IPAddress) -> str | None:
    """What makes `ip` unfit for a tool to reach ("a loopback address"), or None if public."""
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        return address_kind(embedded)
    # The order matters: 127.0.0.1 and 169.254.169.254 are "private" to `ipaddress` too.
    checks = (
        (ip in _METADATA, "a cloud metadata address"),
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_reserved, "a reserved address"),
        (ip.is_private, "a private address"),
        (isinstance(ip, IPv6Address) and ip.is_site_local, "a site-local address"),
        (not ip.is_global, "a non-public address"),  # 100.64/10 (carrier NAT) and the like
    )
    return next((kind for matched, kind in checks if matched), None)


def address_refusal(address: str, allow_private_networks: bool) -> str | None:
    """Why a tool may not connect to `address` (an IP literal), or None if it may."""
    ip = ip_address(address)
    kind = address_kind(ip)
    if kind is None or (allow_private_networks and kind in _PRIVATE_KINDS):
        return None
    embedded = _embedded_ipv4(ip)
    shown = f"{ip} (IPv4 {embedded})" if embedded else str(ip)
    return f"refused: {shown} is {kind}"


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme)


def redirect_refusal(start: httpx.URL, hop: httpx.URL) -> str | None:
    """Why a request to `hop` may not follow from the configured URL `start`, or None.

    Scheme, host and port must stay the same (a default port counts as written out): an
    https -> http hop would send the body and headers in clear text, and another port of the
    same host is another service, which the headers (credentials) were not meant for.
    """
    parts = zip(("scheme", "host", "port"), _origin(start), _origin(hop), strict=True)
    changed = next((what for what, was, now in parts if was != now), None)
    if changed is None:
        return None
    begun = f"{start.scheme}://{start.netloc.decode('ascii')}"
    shown = f"{hop.scheme}://{hop.netloc.decode('ascii')}"
    return f"refused: a redirect from {begun} to {shown} changes the {changed}"


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system's resolver gives for `host`, in its order, each once."""
    found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(entry[4][0]) for entry in found))


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend for TCP, refusing addresses the tool may not reach.

    `resolver` exists so a test can make a name resolve where it needs; the check is the same.
    """

    def __init__(self, allow_private_networks: bool, resolver: Resolver | None = None) -> None:
        self.allow_private_networks = allow_private_networks
        self._resolve = resolver or system_resolver
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._checked(host, port, timeout)
        failure: httpcore.ConnectError | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:  # the next address may answer
                failure = exc
        assert failure is not None  # `_checked` gives at least one address
        raise failure

    async def _checked(self, host: str, port: int, timeout: float | None) -> list[str]:
        """`host`'s addresses, all of them allowed; AddressNotAllowed naming the first that
        is not (one bad answer among good ones is how a rebinding attack would look)."""
        try:
            with anyio.fail_after(timeout):
                addresses = await self._resolve(host, port)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host} took over {timeout} s") from exc
        except OSError as exc:  # no such name: as unreachable as a refused connection
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        for address in addresses:
            reason = address_refusal(address, self.allow_private_networks)
            if reason is not None:
                named = "" if _same_address(host, address) else f" ({host} resolves to it)"
                raise AddressNotAllowed(reason + named)
        return addresses

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise AddressNotAllowed(f"refused: the unix socket {path}")  # a tool speaks TCP only

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _same_address(host: str, address: str) -> bool:
    try:
        return ip_address(host) == ip_address(address)
    except ValueError:
        return False


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport (TLS, pooling, HTTP/1.1), its connections made by `backend`.

    Side effects: a connection pool, open until `aclose`. Environment proxies are not used by a
    client given a transport, which is what the check needs: through a proxy it could not see
    the address connected to.
    """

    def __init__(self, backend: GuardedBackend) -> None:
        ssl_context = httpx.create_ssl_context()  # certifi, or $SSL_CERT_FILE as httpx reads it
        super().__init__(verify=ssl_context)
        # httpx takes no network backend, so its pool is made again with ours. Were `_pool`
        # to go in another httpx, requests must fail here rather than go out unchecked.
        if not isinstance(getattr(self, "_pool", None), httpcore.AsyncConnectionPool):
            raise RuntimeError(f"httpx {httpx.__version__}: no connection pool to guard")
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )
