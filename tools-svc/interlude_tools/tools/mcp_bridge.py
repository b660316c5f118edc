"""MCP servers' tools as interlude tools: one long-lived client session per declared server.

A server declared in the tools file (stdio: a command to spawn; or streamable HTTP: a URL) is
connected when the worker starts; each tool it lists becomes a `Tool` named `<prefix>.<tool>`
(or its bare name), with the server's input schema as its argument schema, so the registry
checks arguments before a call reaches the server. A call is `call_tool`; a result flagged
`isError` becomes a RuntimeError, i.e. a `tool_error` result whose message the model sees.

Session lifetime: an MCP client is an anyio context manager (task groups inside), which must be
entered and left by the same task. So each connection is held open by a task of its own
(`_hold`) that enters the client, hands it over, and waits to be told to stop; calls from any
task go through the handed-over client. A connection that breaks (the server process died, the
HTTP server went away) is dropped and the call raises `RetriableToolError`: the registry tries
again after its backoff, and that attempt opens a new connection (a fresh server process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import anyio
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client import Transport
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent
from mcp_types import Tool as McpToolInfo

from interlude.api.names import TOOL_NAME
from interlude_tools.registry import RetriableToolError, Tool
from interlude_tools.tools.http_tool import named_tool_class

log = logging.getLogger(__name__)

_MAX_PAGES = 100  # of a tools/list: a server that pages forever cannot hang the start
# Errors that mean the connection is gone (not that the call was wrong).
_LOST = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server as declared (`[[mcp]]` in the tools file): stdio or streamable HTTP."""

    name: str  # the server's name here: the default prefix, and in every message
    command: str = ""  # stdio: the program to spawn (exactly one of command and url)
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)  # set for the server
    pass_env: tuple[str, ...] = ()  # the worker's variables passed on (secrets stay out of files)
    cwd: Path | None = None  # where the server runs (the tools file's folder when loaded)
    url: str = ""  # streamable HTTP endpoint, e.g. http://mcp.svc:8000/mcp
    prefix: str = ""  # tools are named "<prefix>.<tool>"; "" means the server's name
    bare: bool = False  # name tools by their own name, no prefix
    tools: tuple[str, ...] = ()  # only these of the server's tools (all when empty)
    connect_timeout_s: float = 20.0
    max_concurrency: int = 0
    retries: int = 2

    def __post_init__(self) -> None:
        if not TOOL_NAME.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} must match {TOOL_NAME.pattern}")
        if bool(self.command) == bool(self.url):
            raise ValueError("give exactly one of command (stdio) and url (streamable HTTP)")
        if self.url:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"url {self.url!r} must be an http:// or https:// URL")
            if self.args or self.env or self.pass_env or self.cwd is not None:
                raise ValueError("args, env, pass_env and cwd are for stdio servers only")
        if self.bare and self.prefix:
            raise ValueError("give prefix or bare = true, not both")
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {self.connect_timeout_s}")
        if self.max_concurrency < 0 or self.retries < 0:
            raise ValueError("max_concurrency and retries must be >= 0")

    def tool_name(self, remote: str) -> str:
        """The name the server's tool `remote` is registered under."""
        return remote if self.bare else f"{self.prefix or self.name}.{remote}"


@dataclass
class _Connection:
    client: Client
    stop: asyncio.Event
    holder: asyncio.Task[None]


class McpBridge:
    """One MCP server: `await start()` connects and returns its tools; `await close()` ends it.

    Side effects: spawns the server process (stdio) or holds an HTTP session; reconnects (a new
    process) on the first call after the connection broke. Not reusable after `close`.
    """

    def __init__(self, config: McpServerConfig, *, errlog: TextIO | None = None) -> None:
        self.config = config
        self.tools: list[McpTool] = []
        self._errlog = errlog  # the server's stderr (stdio); None: this process's
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> list[McpTool]:
        """Connect, list the server's tools, and make one `McpTool` each.

        Raises ConnectionError (no connection within connect_timeout_s, or the server failed
        to start) or ValueError (a tool name the engine would refuse, a wanted tool missing).
        """
        conn = await self._connection()
        try:
            listed = await _list_tools(conn.client)
            self.tools = self._make_tools(listed)
        except BaseException:
            await self.close()
            raise
        return self.tools

    def _make_tools(self, listed: list[McpToolInfo]) -> list[McpTool]:
        offered = {t.name: t for t in listed}
        missing = sorted(set(self.config.tools) - set(offered))
        if missing:
            raise ValueError(
                f"MCP server {self.config.name!r} offers no tool {missing} "
                f"(it offers {sorted(offered)})"
            )
        wanted = [offered[n] for n in self.config.tools] if self.config.tools else listed
        tools = []
        for info in wanted:
            local = self.config.tool_name(info.name)
            if not TOOL_NAME.fullmatch(local):
                raise ValueError(
                    f"MCP server {self.config.name!r}: tool {info.name!r} would be named "
                    f"{local!r}, which is not a valid tool name; leave it out with `tools`"
                )
            description = info.description or f"{info.name} (MCP server {self.config.name})"
            made = named_tool_class(
                McpTool,
                local,
                description,
                info.input_schema,
                max_concurrency=self.config.max_concurrency,
                retries=self.config.retries,
            )
            tools.append(made(self, info.name))
        return tools

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        """The text of the server's answer; RuntimeError for an error result,
        RetriableToolError when the connection is gone (the next call reconnects)."""
        if self._closed:
            raise RuntimeError(f"MCP server {self.config.name!r}: the bridge is closed")
        try:
            conn = await self._connection()
        except ConnectionError as exc:
            raise RetriableToolError(str(exc)) from exc
        try:
            result = await conn.client.call_tool(tool, dict(arguments))
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise RuntimeError(f"MCP server {self.config.name!r}: {exc.message}") from exc
            lost: Exception = exc
        except _LOST as exc:
            lost = exc
        else:
            return _answer(result)
        await self._drop(conn)
        raise RetriableToolError(
            f"MCP server {self.config.name!r}: connection lost ({type(lost).__name__}: {lost})"
        )

    async def close(self) -> None:
        """End the session (and the server process); waits for it to be gone."""
        self._closed = True
        async with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            await _shut(conn)

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.holder.done():
            return conn
        async with self._lock:
            if self._closed:
                raise ConnectionError(f"MCP server {self.config.name!r}: the bridge is closed")
            if self._conn is not None and self._conn.holder.done():
                await _shut(self._conn)  # it ended on its own: collect it
                self._conn = None
            if self._conn is None:
                self._conn = await self._open()
            return self._conn

    async def _drop(self, conn: _Connection) -> None:
        async with self._lock:
            if self._conn is conn:
                self._conn = None
        await _shut(conn)

    async def _open(self) -> _Connection:
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        holder = asyncio.create_task(self._hold(ready, stop), name=f"mcp:{self.config.name}")
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                client = await ready
        except BaseException as exc:
            holder.cancel()
            with contextlib.suppress(BaseException):
                await holder
            if isinstance(exc, TimeoutError):
                raise ConnectionError(
                    f"MCP server {self.config.name!r} did not connect within "
                    f"{self.config.connect_timeout_s} s"
                ) from exc
            if isinstance(exc, Exception):
                raise ConnectionError(
                    f"MCP server {self.config.name!r} failed to connect: {_describe(exc)}"
                ) from exc
            raise
        return _Connection(client, stop, holder)

    async def _hold(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Enter the client, hand it over, keep it open until `stop` (same task throughout)."""
        try:
            async with Client(self._target(), cache=None) as client:
                if ready.done():  # the opener gave up waiting
                    return
                ready.set_result(client)
                await stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("MCP server %s: session ended: %s", self.config.name, _describe(exc))

    def _target(self) -> Transport | str:
        if self.config.url:
            return self.config.url  # the client speaks streamable HTTP to a URL
        env = dict(self.config.env)
        env.update({k: os.environ[k] for k in self.config.pass_env if k in os.environ})
        params = StdioServerParameters(
            command=self.config.command, args=list(self.config.args), env=env, cwd=self.config.cwd
        )
        return stdio_client(params, errlog=self._errlog or sys.stderr)


async def _shut(conn: _Connection) -> None:
    conn.stop.set()
    try:
        async with asyncio.timeout(10):  # the stdio shutdown is bounded at about 6 s
            await conn.holder
    except TimeoutError:
        conn.holder.cancel()


async def _list_tools(client: Client) -> list[McpToolInfo]:
    tools: list[McpToolInfo] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _answer(result: CallToolResult) -> str:
    """The result's text blocks joined; other blocks named, not inlined (the model reads text)."""
    parts = [
        block.text if isinstance(block, TextContent) else f"[{block.type} content omitted]"
        for block in result.content
    ]
    text = "\n".join(parts)
    if not parts and result.structured_content is not None:
        text = json.dumps(result.structured_content)
    if result.is_error:
        raise RuntimeError(text or "the MCP tool reported an error")
    return text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"


class McpTool(Tool):
    """One tool of an MCP server; made by `McpBridge.start` (one subclass per tool).

    Side effects: the server tool's own; a call may reach the server more than once (retries
    after a lost connection, a reclaimed call).
    """

    def __init__(self, bridge: McpBridge, remote: str) -> None:
        if "name" not in type(self).__dict__:
            raise TypeError("McpTools are made by McpBridge.start()")
        self.bridge = bridge
        self.remote = remote  # the tool's name on its server

    async def run(self, arguments: dict[str, Any]) -> str:
        return await self.bridge.call(self.remote, arguments)
