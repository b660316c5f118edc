"""The HTTP tool refuses to be a way into the cluster: private addresses, however the URL or
the DNS spells them, and redirects that leave the configured scheme, host and port.

Real servers (uvicorn on threads: IPv4, IPv6 and TLS with a CA made here), the real check.
Each refusal is also shown to be the only thing in the way: the same request with
`allow_private_networks` reaches the server, so a refusal is not a connection that would have
failed anyway.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from interlude.api.bus import ToolCall, ToolResult
from interlude_tools import Registry
from interlude_tools.config import load_config
from interlude_tools.registry import RetriableToolError
from interlude_tools.tools.http_guard import (
    AddressNotAllowed,
    Resolver,
    address_kind,
    redirect_refusal,
)
from interlude_tools.tools.http_tool import HttpEndpoint, HttpTool, HttpToolConfig

MakeCall = Callable[..., ToolCall]
LOOPBACK = "refused: 127.0.0.1 is a loopback address"


@dataclass
class Seen:
    """Every request a test server got: (path, Host header, X-Token header)."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)


def _app(seen: Seen) -> Starlette:
    async def echo(request: Request) -> Response:
        entry = (request.url.path, request.headers["host"], request.headers.get("x-token"))
        seen.requests.append(entry)
        return JSONResponse({"host": request.headers["host"]})

    async def redirect(request: Request) -> Response:
        await echo(request)
        return RedirectResponse(request.query_params["to"], status_code=307)

    methods = ["GET", "POST"]
    return Starlette(
        routes=[
            Route("/echo", echo, methods=methods),
            Route("/redirect", redirect, methods=methods),
        ]
    )


@contextmanager
def serve(host: str, tls: tuple[Path, Path] | None = None) -> Iterator[tuple[int, Seen]]:
    """An app on `host` (IPv4 or IPv6), TLS with (cert, key) if given: (port, what it saw)."""
    seen = Seen()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, 0), family=family)
    cert, key = tls or (None, None)
    config = uvicorn.Config(
        _app(seen),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
        ssl_certfile=cert,
        ssl_keyfile=key,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, f"no server on {host}"
        time.sleep(0.005)
    try:
        yield sock.getsockname()[1], seen
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


@pytest.fixture(scope="module")
def v4() -> Iterator[tuple[int, Seen]]:
    with serve("127.0.0.1") as served:
        yield served


@pytest.fixture(scope="module")
def v4_other() -> Iterator[tuple[int, Seen]]:
    with serve("127.0.0.1") as served:
        yield served


def tool(url: str, host: str, **fields: Any) -> HttpToolConfig:
    """A POST tool on `url`, `host` the only one allowed, no retries (a refusal is not one)."""
    base: dict[str, Any] = {"timeout_s": 2.0, "retries": 0}
    return HttpToolConfig("probe", "d", url, allowed_hosts=(host,), **(base | fields))


def execute(config: HttpToolConfig, make_call: MakeCall) -> ToolResult:
    async def scenario() -> ToolResult:
        made = HttpTool.from_config(config)
        try:
            return await Registry([made]).execute(make_call("c1", made.name, {}))
        finally:
            await made.aclose()

    return asyncio.run(scenario())


def refused(result: ToolResult, message: str) -> None:
    assert result.error_kind == "tool_error", result
    assert message in result.error, result.error
    assert "attempts" not in result.error  # refused once, not retried


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "0x7f000001", "127.1"])
def test_the_default_refuses_127_0_0_1_however_it_is_written(
    host: str, v4: tuple[int, Seen], make_call: MakeCall
) -> None:
    port, seen = v4
    seen.requests.clear()
    url = f"http://{host}:{port}/echo"
    refused(execute(tool(url, host), make_call), LOOPBACK)
    assert seen.requests == []
    # The same spelling does reach the server when the tool is allowed to.
    opened = execute(tool(url, host, allow_private_networks=True), make_call)
    assert opened.ok, opened.error
    assert [path for path, _, _ in seen.requests] == ["/echo"]


def test_the_default_refuses_an_ipv4_mapped_ipv6_loopback(
    v4: tuple[int, Seen], make_call: MakeCall
) -> None:
    port, seen = v4
    seen.requests.clear()
    url = f"http://[::ffff:127.0.0.1]:{port}/echo"
    result = execute(tool(url, "::ffff:127.0.0.1"), make_call)
    refused(result, "refused: ::ffff:7f00:1 (IPv4 127.0.0.1) is a loopback address")
    assert seen.requests == []
    opened = execute(tool(url, "::ffff:127.0.0.1", allow_private_networks=True), make_call)
    assert opened.ok and len(seen.requests) == 1, opened.error


def test_the_default_refuses_ipv6_loopback(make_call: MakeCall) -> None:
    with serve("::1") as (port, seen):
        url = f"http://[::1]:{port}/echo"
        refused(execute(tool(url, "::1"), make_call), "refused: ::1 is a loopback address")
        assert seen.requests == []
        opened = execute(tool(url, "::1", allow_private_networks=True), make_call)
        assert opened.ok and len(seen.requests) == 1, opened.error


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("169.254.169.254", "a link-local address"),
        # AWS's IPv6 endpoint is unique-local (fc00::/7): "private" would otherwise open it.
        ("fd00:ec2::254", "a cloud metadata address"),
    ],
)
def test_the_metadata_address_is_refused_even_with_private_networks_allowed(
    allow: bool, host: str, kind: str, make_call: MakeCall
) -> None:
    url = f"http://{'[' + host + ']' if ':' in host else host}/latest/meta-data/"
    config = tool(url, host, allow_private_networks=allow, timeout_s=0.5)
    refused(execute(config, make_call), f"refused: {host} is {kind}")


def test_a_name_that_resolves_to_loopback_is_refused(
    v4: tuple[int, Seen], make_call: MakeCall
) -> None:
    port, seen = v4
    seen.requests.clear()
    result = execute(tool(f"http://localhost:{port}/echo", "localhost"), make_call)
    refused(result, f"{LOOPBACK} (localhost resolves to it)")
    assert seen.requests == []


def _resolver(table: dict[str, list[str]]) -> Resolver:
    """Names answered from `table`: DNS the test controls; the guard's check is unchanged."""

    async def resolve(host: str, port: int) -> list[str]:
        return table[host]

    return resolve


def test_an_allowed_name_that_resolves_to_the_metadata_service_is_refused() -> None:
    # DNS rebinding: the name is on the list, its answer is not what it was when listed.
    async def scenario(answer: list[str]) -> str:
        endpoint = HttpEndpoint(
            "http://api.example/v1",
            allowed_hosts=("api.example",),
            method="GET",
            resolver=_resolver({"api.example": answer}),
        )
        try:
            with pytest.raises(AddressNotAllowed) as caught:
                await endpoint.send({}, 100)
            return str(caught.value)
        finally:
            await endpoint.aclose()

    rebound = asyncio.run(scenario(["169.254.169.254"]))
    assert (
        rebound == "refused: 169.254.169.254 is a link-local address (api.example resolves to it)"
    )
    # One bad address among good ones is enough: were the first not to answer, the next
    # would be tried.
    mixed = asyncio.run(scenario(["8.8.8.8", "10.0.0.5"]))
    assert mixed == "refused: 10.0.0.5 is a private address (api.example resolves to it)"


def test_the_address_checked_is_the_one_connected_to_and_the_name_is_kept(
    v4: tuple[int, Seen],
) -> None:
    # The system's DNS knows no "api.internal.example": reaching the server proves the
    # connection went to the address the guard resolved and checked.
    port, seen = v4
    seen.requests.clear()

    async def scenario() -> str:
        endpoint = HttpEndpoint(
            f"http://api.internal.example:{port}/echo",
            allowed_hosts=("api.internal.example",),
            method="GET",
            allow_private_networks=True,
            resolver=_resolver({"api.internal.example": ["127.0.0.1"]}),
        )
        try:
            return (await endpoint.send({}, 1000)).text
        finally:
            await endpoint.aclose()

    assert asyncio.run(scenario()) == f'{{"host":"api.internal.example:{port}"}}'
    assert seen.requests == [("/echo", f"api.internal.example:{port}", None)]


def test_a_redirect_to_another_port_of_the_same_host_is_refused(
    v4: tuple[int, Seen], v4_other: tuple[int, Seen], make_call: MakeCall
) -> None:
    (port, seen), (other, elsewhere) = v4, v4_other
    seen.requests.clear()
    elsewhere.requests.clear()
    start = f"http://127.0.0.1:{port}"

    def redirecting(target: str) -> HttpToolConfig:
        url = f"{start}/redirect?to={target}"
        token = {"X-Token": "s3cret"}
        return tool(url, "127.0.0.1", allow_private_networks=True, headers=token)

    result = execute(redirecting(f"http://127.0.0.1:{other}/echo"), make_call)
    refused(
        result,
        f"refused: a redirect from {start} to http://127.0.0.1:{other} changes the port",
    )
    assert [path for path, _, _ in seen.requests] == ["/redirect"]
    assert elsewhere.requests == []  # neither the request nor its token reached it
    followed = execute(redirecting(f"{start}/echo"), make_call)
    assert followed.ok, followed.error  # within the origin a redirect is followed
    assert seen.requests[-1] == ("/echo", f"127.0.0.1:{port}", "s3cret")


def _tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signed for 127.0.0.1 and tls.example: (ca, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "interlude test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("tls.example"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tls.example")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def test_an_https_to_http_redirect_is_refused(
    tmp_path: Path,
    v4: tuple[int, Seen],
    make_call: MakeCall,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca, cert, key = _tls_files(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # how httpx is told which CA to trust
    plain, seen = v4
    seen.requests.clear()
    with serve("127.0.0.1", (cert, key)) as (port, secure):
        start = f"https://127.0.0.1:{port}"
        through = execute(
            tool(f"{start}/echo", "127.0.0.1", allow_private_networks=True), make_call
        )
        assert through.ok, through.error  # TLS works, so the refusal below is the redirect's
        target = f"http://127.0.0.1:{plain}/echo"
        config = tool(
            f"{start}/redirect?to={target}",
            "127.0.0.1",
            allow_private_networks=True,
            headers={"X-Token": "s3cret"},
        )
        result = execute(config, make_call)
    refused(
        result, f"refused: a redirect from {start} to http://127.0.0.1:{plain} changes the scheme"
    )
    assert [path for path, _, _ in secure.requests] == ["/echo", "/redirect"]
    assert seen.requests == []  # nothing, the token included, went out in clear text


def test_tls_verifies_the_name_while_connecting_to_the_checked_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = _tls_files(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))

    async def scenario(port: int, name: str) -> str:
        endpoint = HttpEndpoint(
            f"https://{name}:{port}/echo",
            allowed_hosts=(name,),
            method="GET",
            allow_private_networks=True,
            resolver=_resolver({name: ["127.0.0.1"]}),
        )
        try:
            return (await endpoint.send({}, 1000)).text
        finally:
            await endpoint.aclose()

    with serve("127.0.0.1", (cert, key)) as (port, secure):
        assert asyncio.run(scenario(port, "tls.example")) == f'{{"host":"tls.example:{port}"}}'
        # A name the certificate does not hold fails verification: SNI is the name, not the IP.
        with pytest.raises(RetriableToolError, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(scenario(port, "other.example"))
    assert len(secure.requests) == 1


@pytest.mark.parametrize(
    ("hop", "reason"),
    [
        ("https://api.example:443/v2", None),  # a default port written out is the same port
        ("https://api.example/v1?page=2", None),
        ("http://api.example/v1", "changes the scheme"),
        ("https://other.example/v1", "changes the host"),
        ("https://api.example:8443/v1", "changes the port"),
    ],
)
def test_the_redirect_policy(hop: str, reason: str | None) -> None:
    refusal = redirect_refusal(httpx.URL("https://api.example/v1"), httpx.URL(hop))
    if reason is None:
        assert refusal is None
    else:
        assert refusal == f"refused: a redirect from https://api.example to {hop[:-3]} {reason}"


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd00::1", "a private address"),
        ("fe80::1", "a link-local address"),
        ("224.0.0.1", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("100.64.0.1", "a non-public address"),
        ("64:ff9b::a9fe:a9fe", "a link-local address"),  # NAT64 of 169.254.169.254
    ],
)
def test_what_kind_of_address_each_is(address: str, kind: str | None) -> None:
    assert address_kind(ipaddress.ip_address(address)) == kind


def test_a_tools_file_opts_in_to_private_networks(tmp_path: Path) -> None:
    table = '[[http]]\nname = "t"\ndescription = "d"\nurl = "http://h/"\nallowed_hosts = ["h"]\n'
    path = tmp_path / "tools.toml"
    path.write_text(table)
    assert not load_config(path).http[0].allow_private_networks  # off unless asked for
    path.write_text(table + "allow_private_networks = true\n")
    assert load_config(path).http[0].allow_private_networks
    path.write_text(table + 'allow_private_networks = "yes"\n')
    with pytest.raises(ValueError, match="allow_private_networks: must be true or false"):
        load_config(path)
