"""MCP servers' tools through the bridge: a real server over stdio (a subprocess) and over
streamable HTTP (in-process), driven through `Registry.execute` as a worker would.

Starting the stdio server costs most of a second (importing the SDK), so the module shares one
bridge, on an event loop of its own (an anyio portal), across the tests that only call it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from interlude.api.bus import ToolCall, ToolResult
from interlude_tools import Registry, RetriableToolError
from interlude_tools.tools.mcp_bridge import McpBridge, McpServerConfig, McpTool
from interlude_tools.tools.simulated_models import ServerThread

SERVER = Path(__file__).with_name("mcp_server_example.py")
MakeCall = Callable[..., ToolCall]


@pytest.fixture(scope="module")
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal("asyncio") as portal:
        yield portal


@pytest.fixture(scope="module")
def bridge(portal: BlockingPortal) -> Iterator[McpBridge]:
    bridge = McpBridge(McpServerConfig("example", command=sys.executable, args=(str(SERVER),)))
    portal.call(bridge.start)
    yield bridge
    portal.call(bridge.close)


@pytest.fixture
def execute(
    portal: BlockingPortal, bridge: McpBridge, make_call: MakeCall
) -> Callable[[str, dict[str, Any]], ToolResult]:
    registry = Registry(bridge.tools)

    def run(tool: str, arguments: dict[str, Any]) -> ToolResult:
        return portal.call(registry.execute, make_call("c1", tool, arguments))

    return run


def test_the_servers_tools_are_registered_under_its_prefix_with_its_schemas(
    bridge: McpBridge,
) -> None:
    tools = {tool.name: tool for tool in bridge.tools}
    assert set(tools) == {"example.add", "example.shout", "example.refuse", "example.pid"}
    add = tools["example.add"]
    assert isinstance(add, McpTool) and add.remote == "add"
    assert add.description == "Add two integers."
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"]["type"] == "integer"


def test_a_call_returns_the_tools_text(execute: Callable[..., ToolResult]) -> None:
    added = execute("example.add", {"a": 2, "b": 40})
    assert added.ok and added.content == "42"
    shouted = execute("example.shout", {"text": "hello"})
    assert shouted.ok and shouted.content == "HELLO!"


def test_arguments_are_checked_against_the_servers_schema(
    execute: Callable[..., ToolResult],
) -> None:
    result = execute("example.add", {"a": "two", "b": 1})
    assert result.error_kind == "bad_arguments" and "'two' is not of type 'integer'" in result.error


def test_an_error_result_is_a_tool_error_the_model_can_read(
    execute: Callable[..., ToolResult],
) -> None:
    result = execute("example.refuse", {"reason": "the moon is full"})
    assert result.error_kind == "tool_error"
    assert "refused: the moon is full" in result.error


def test_a_dead_server_is_restarted_and_the_call_retried(
    execute: Callable[..., ToolResult],
) -> None:
    first = execute("example.pid", {})
    assert first.ok
    os.kill(int(first.content), signal.SIGKILL)
    time.sleep(0.05)
    result = execute("example.add", {"a": 1, "b": 2})  # lost connection, retried, reconnected
    assert result.ok and result.content == "3", result.error
    second = execute("example.pid", {})
    assert second.ok and second.content != first.content


def test_a_closed_bridge_refuses_calls_without_retrying(portal: BlockingPortal) -> None:
    bridge = McpBridge(McpServerConfig("gone", command=sys.executable, args=(str(SERVER),)))
    portal.call(bridge.close)
    with pytest.raises(RuntimeError, match="the bridge is closed") as caught:
        portal.call(bridge.call, "add", {"a": 1, "b": 2})
    assert not isinstance(caught.value, RetriableToolError)  # nothing to wait for
    with pytest.raises(TypeError, match=r"made by McpBridge\.start"):
        McpTool(bridge, "add")


def _example_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mcp_server_example", SERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The example server (with its 64-character tool) over streamable HTTP, in-process."""
    app = _example_module().build_server(long_name=True).streamable_http_app()
    with ServerThread(app) as server:
        yield f"{server.url}/mcp"


def test_over_http_tools_can_be_chosen_and_named_bare(
    portal: BlockingPortal, http_url: str, make_call: MakeCall
) -> None:
    long_name = "l" * 64
    bridge = McpBridge(McpServerConfig("web", url=http_url, bare=True, tools=("add", long_name)))
    try:
        tools = portal.call(bridge.start)
        assert [t.name for t in tools] == ["add", long_name]
        result = portal.call(Registry(tools).execute, make_call("c1", "add", {"a": 5, "b": 6}))
        assert result.ok and result.content == "11"
    finally:
        portal.call(bridge.close)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "would be named 'web.llll"),  # prefixed, the long name is over 64 characters
        ({"tools": ("add", "multiply")}, r"offers no tool \['multiply'\]"),
    ],
)
def test_over_http_a_tool_that_cannot_be_registered_fails_the_start(
    portal: BlockingPortal, http_url: str, fields: dict[str, Any], message: str
) -> None:
    bridge = McpBridge(McpServerConfig("web", url=http_url, **fields))
    with pytest.raises(ValueError, match=message):
        portal.call(bridge.start)


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("/nonexistent/mcp-server", (), "failed to connect: FileNotFoundError"),
        (sys.executable, ("-c", "pass"), "failed to connect: MCPError: Connection closed"),
        (sys.executable, ("-c", "import sys; sys.stdin.read()"), "did not connect within 0.3 s"),
    ],
)
def test_a_server_that_does_not_connect_fails_the_start(
    portal: BlockingPortal, command: str, args: tuple[str, ...], message: str
) -> None:
    config = McpServerConfig("broken", command=command, args=args, connect_timeout_s=0.3)
    bridge = McpBridge(config)
    with pytest.raises(ConnectionError, match=message):
        portal.call(bridge.start)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of command"),
        ({"command": "x", "url": "http://h/mcp"}, "exactly one of command"),
        ({"url": "ftp://h/mcp"}, "http:// or https://"),
        ({"url": "http://h/mcp", "args": ("a",)}, "stdio servers only"),
        ({"command": "x", "bare": True, "prefix": "p"}, "not both"),
        ({"command": "x", "connect_timeout_s": 0}, "connect_timeout_s"),
    ],
)
def test_a_server_declaration_is_checked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        McpServerConfig("srv", **fields)
    assert McpServerConfig("srv", command="x").tool_name("t") == "srv.t"
    assert McpServerConfig("srv", command="x", prefix="p").tool_name("t") == "p.t"
