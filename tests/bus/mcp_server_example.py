"""A tiny real MCP server for the bridge tests: `python mcp_server_example.py` speaks stdio.

Tools: `add(a, b)`, `shout(text)`, `refuse(reason)` (always an error result, with the reason),
`pid()` (the server's process id, so a test can kill it and watch the bridge reconnect) and,
with `--long-name`, a tool whose name is 64 characters (too long for the engine once prefixed).
`build_server()` is also served in-process over streamable HTTP by the tests.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LONG_NAME = "l" * 64


def build_server(long_name: bool = False) -> MCPServer:
    server = MCPServer("example", log_level="WARNING")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def shout(text: str) -> str:
        """The text in capitals, with an exclamation mark."""
        return text.upper() + "!"

    @server.tool()
    def refuse(reason: str = "no reason given") -> str:
        """Always fails, saying why."""
        raise ToolError(f"refused: {reason}")

    @server.tool()
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    if long_name:
        server.add_tool(lambda: "ok", name=LONG_NAME, description="a name at the engine's limit")
    return server


if __name__ == "__main__":
    build_server(long_name="--long-name" in sys.argv).run("stdio")
