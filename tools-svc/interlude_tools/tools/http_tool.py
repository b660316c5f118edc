"""Tools that call an HTTP endpoint: one declared endpoint per tool, on a host allow-list.

The model chooses the arguments, so a tool must not become a way to reach arbitrary hosts from
inside the cluster: every request, and every redirect hop of it, is checked against the tool's
`allowed_hosts` and held to the URL's scheme, host and port before it is sent (an httpx request
hook, which runs for each hop), and every connection goes to a public address only unless the
tool allows private networks (`http_guard`, which resolves names itself). The URL is checked
when the tool is configured too, so a typo fails at start instead of at the first call.
Failures are sorted the way the registry retries them: no answer, a timeout, a 5xx or a 429 is
worth another try (`RetriableToolError`), sent with the same `Idempotency-Key` (the call's id);
any other 4xx is the call's own fault and is reported with the status and the start of the body
(a `tool_error` the model sees), as is a refusal.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import httpx

from interlude.api.names import TOOL_NAME
from interlude_tools.context import current_call
from interlude_tools.registry import RetriableToolError, Tool
from interlude_tools.schema import check_schema
from interlude_tools.tools.http_guard import (
    GuardedBackend,
    GuardedTransport,
    RedirectNotAllowed,
    Resolver,
    redirect_refusal,
)

ToolT = TypeVar("ToolT", bound=Tool)

MAX_RESPONSE_BYTES = 16 * 1024
METHODS = ("GET", "POST")
_EXCERPT_CHARS = 200


def named_tool_class(
    base: type[ToolT],
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    *,
    max_concurrency: int = 0,
    retries: int = 2,
) -> type[ToolT]:
    """A subclass of `base` that is the tool `name`, with this description and schema.

    A `Tool`'s name, description, schema and limits are class variables: one class, one tool,
    as the built-ins are. A class that makes many tools at run time (one per declared endpoint,
    one per tool an MCP server lists) gets one subclass per tool from here, so every reader of
    the tool (the registry, the published specs) sees the same values and no instance shadows a
    class variable. ValueError if the name is not one the engine accepts.
    """
    if not TOOL_NAME.fullmatch(name):
        raise ValueError(f"tool name {name!r} must match {TOOL_NAME.pattern}")
    check_schema(name, parameters)
    namespace = {
        "name": name,
        "description": description,
        "parameters": dict(parameters),
        "max_concurrency": max_concurrency,
        "retries": retries,
        "__module__": base.__module__,
    }
    made = types.new_class(
        f"{base.__name__}[{name}]", (base,), exec_body=lambda ns: ns.update(namespace)
    )
    return cast(type[ToolT], made)


def check_endpoint(url: str, allowed_hosts: Sequence[str], timeout_s: float) -> None:
    """ValueError unless `url` is http(s) on a host in `allowed_hosts` and the timeout is sane."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url {url!r} must be an http:// or https:// URL with a host")
    if not allowed_hosts:
        raise ValueError("allowed_hosts must name at least one host")
    if parts.hostname not in _normalized(allowed_hosts):
        raise ValueError(
            f"url host {parts.hostname!r} is not in allowed_hosts {list(allowed_hosts)}"
        )
    if isinstance(timeout_s, bool) or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")


def _normalized(hosts: Sequence[str]) -> frozenset[str]:
    # URL hosts compare case-insensitively; httpx and urlsplit give them lower-cased.
    return frozenset(h.strip().lower().strip("[]") for h in hosts)


@dataclass(frozen=True)
class HttpToolConfig:
    """One HTTP tool as declared (`[[http]]` in the tools file); checked when made.

    `parameters` and `headers` are dicts: frozen stops rebinding them, so treat them as read-only.
    """

    name: str
    description: str
    url: str
    # Hosts (exact names, no wildcards) the URL and any redirect may go to.
    allowed_hosts: tuple[str, ...]
    method: str = "POST"  # POST sends the arguments as the JSON body, GET as the query
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    timeout_s: float = 10.0  # the whole exchange, redirects included
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets
    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_concurrency: int = 0
    retries: int = 2
    # Let it reach loopback and private addresses (an internal service, on purpose); off,
    # only public addresses are connected to. Link-local (cloud metadata) stays refused.
    allow_private_networks: bool = False

    def __post_init__(self) -> None:
        if not TOOL_NAME.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} must match {TOOL_NAME.pattern}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        check_endpoint(self.url, self.allowed_hosts, self.timeout_s)
        check_schema(self.name, self.parameters)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()):
            raise ValueError("headers must map strings to strings")
        if self.max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be >= 1, got {self.max_response_bytes}")
        if self.max_concurrency < 0 or self.retries < 0:
            raise ValueError("max_concurrency and retries must be >= 0")


class HostNotAllowed(RuntimeError):
    """A request (or a redirect hop) would go to a host not on the tool's allow-list."""


@dataclass(frozen=True)
class Reply:
    """The start of a response body: `text` is at most the cap, `cut` says whether more came."""

    status: int
    text: str
    cut: bool


class HttpEndpoint:
    """One endpoint, its own `httpx.AsyncClient`, the allow-list checked on every hop.

    Connections go only to public addresses unless `allow_private_networks`; `resolver`
    replaces the system's name lookup (tests), not the check of what it answers.

    Side effects: keeps a connection pool open until `aclose`. Safe to use from concurrent
    calls in one event loop (the pool is per loop: make and use it in the worker's loop).
    """

    def __init__(
        self,
        url: str,
        *,
        allowed_hosts: Sequence[str],
        method: str = "POST",
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        max_redirects: int = 5,
        allow_private_networks: bool = False,
        resolver: Resolver | None = None,
    ) -> None:
        check_endpoint(url, allowed_hosts, timeout_s)
        self.url = url
        self.method = method
        self.timeout_s = timeout_s
        self._start = httpx.URL(url)
        self._allowed = _normalized(allowed_hosts)
        backend = GuardedBackend(allow_private_networks, resolver)
        self._client = httpx.AsyncClient(
            transport=GuardedTransport(backend),
            timeout=timeout_s,
            headers=dict(headers or {}),
            follow_redirects=True,
            max_redirects=max_redirects,
            event_hooks={"request": [self._check_request]},
        )

    async def _check_request(self, request: httpx.Request) -> None:
        # Before each hop is sent, so the body and the configured headers (credentials) never
        # reach another origin.
        if request.url.host not in self._allowed:
            raise HostNotAllowed(
                f"refused to send a request to host {request.url.host!r}: not in allowed_hosts"
                f" (from {self.url})"
            )
        reason = redirect_refusal(self._start, request.url)
        if reason is not None:
            raise RedirectNotAllowed(reason)

    async def send(self, arguments: Mapping[str, Any], max_bytes: int) -> Reply:
        """The reply to `arguments` (JSON body for POST, query for GET), its body capped.

        Raises RetriableToolError (no answer, timeout, 5xx, 429), RuntimeError (other 4xx,
        too many redirects), HostNotAllowed (a hop to a host off the list), RedirectNotAllowed
        (a hop to another scheme, host or port), AddressNotAllowed (an address not allowed).
        """
        host = urlsplit(self.url).hostname
        try:
            async with asyncio.timeout(self.timeout_s):
                reply = await self._exchange(arguments, max_bytes)
        except TimeoutError as exc:  # ours: the outer deadline cancels instead
            raise RetriableToolError(f"{host} did not answer within {self.timeout_s} s") from exc
        except httpx.TooManyRedirects as exc:
            raise RuntimeError(f"{host} redirected too many times") from exc
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise RetriableToolError(f"{host} unreachable: {type(exc).__name__}: {exc}") from exc
        excerpt = reply.text[:_EXCERPT_CHARS]
        if reply.status >= 500 or reply.status == 429:
            raise RetriableToolError(f"HTTP {reply.status} from {host}: {excerpt}")
        if reply.status >= 400:
            raise RuntimeError(f"HTTP {reply.status} from {host}: {excerpt}")
        return reply

    async def _exchange(self, arguments: Mapping[str, Any], max_bytes: int) -> Reply:
        headers = _call_headers()
        if self.method == "GET":
            request = self._client.build_request(
                "GET", self.url, params=_query(arguments), headers=headers
            )
        else:
            request = self._client.build_request(
                self.method, self.url, json=dict(arguments), headers=headers
            )
        response = await self._client.send(request, stream=True)
        try:
            # The final hop is checked by the hook too; this guards a hook that was bypassed.
            await self._check_request(response.request)
            return await _read_capped(response, max_bytes)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()


def _call_headers() -> dict[str, str]:
    """`Idempotency-Key: <call id>` inside a call: every attempt of a call (a retry, a call
    reclaimed from a dead worker) carries the same key, so an endpoint that honours it acts
    once per call."""
    try:
        return {"Idempotency-Key": current_call().call_id}
    except LookupError:  # used outside a registry's call
        return {}


def _query(arguments: Mapping[str, Any]) -> dict[str, str]:
    """Query parameters: strings as they are, anything else as its JSON text (true, 3, [1])."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}


async def _read_capped(response: httpx.Response, max_bytes: int) -> Reply:
    """Read at most `max_bytes` of the body: a huge answer must not fill the pod's memory."""
    decoder = codecs.getincrementaldecoder(response.encoding or "utf-8")(errors="replace")
    parts: list[str] = []
    size = 0
    async for chunk in response.aiter_bytes():
        room = max_bytes - size
        if len(chunk) > room:
            parts.append(decoder.decode(chunk[:room]))  # a cut character is dropped, not mangled
            return Reply(response.status_code, "".join(parts), cut=True)
        size += len(chunk)
        parts.append(decoder.decode(chunk))
    parts.append(decoder.decode(b"", final=True))
    return Reply(response.status_code, "".join(parts), cut=False)


class HttpTool(Tool):
    """A declared HTTP endpoint as a tool: the response body (text) is the answer.

    Make one with `HttpTool.from_config(config)`: each configured tool is its own subclass
    (`named_tool_class`). Side effects: whatever the endpoint does; a call may be sent more than
    once (retries, a reclaimed call), so declare only endpoints that tolerate that.
    """

    def __init__(self, config: HttpToolConfig) -> None:
        if type(self).__dict__.get("name") != config.name:
            raise TypeError("make an HttpTool with HttpTool.from_config(config)")
        self.config = config
        self._endpoint = HttpEndpoint(
            config.url,
            allowed_hosts=config.allowed_hosts,
            method=config.method,
            timeout_s=config.timeout_s,
            headers=config.headers,
            allow_private_networks=config.allow_private_networks,
        )

    @classmethod
    def from_config(cls, config: HttpToolConfig) -> HttpTool:
        made = named_tool_class(
            cls,
            config.name,
            config.description,
            config.parameters,
            max_concurrency=config.max_concurrency,
            retries=config.retries,
        )
        return made(config)

    async def run(self, arguments: dict[str, Any]) -> str:
        limit = self.config.max_response_bytes
        reply = await self._endpoint.send(arguments, limit)
        if reply.cut:
            return f"{reply.text}\n[response cut: only its first {limit} bytes are shown]"
        return reply.text

    async def aclose(self) -> None:
        """Close the HTTP client (its pooled connections)."""
        await self._endpoint.aclose()
