"""Tool-executor workers: run the tool calls engines post on the Redis Streams tool bus.

`python -m interlude_tools --redis-url URL` runs one worker; the protocol is `interlude.bus`.
"""

from interlude_tools.context import ToolEnv, current_call
from interlude_tools.registry import (
    Calculator,
    Echo,
    Fail,
    Registry,
    RetriableToolError,
    Scripted,
    Tool,
    ToolArgumentError,
    default_registry,
)
from interlude_tools.worker import Worker

__all__ = [
    "Calculator",
    "Echo",
    "Fail",
    "Registry",
    "RetriableToolError",
    "Scripted",
    "Tool",
    "ToolArgumentError",
    "ToolEnv",
    "Worker",
    "current_call",
    "default_registry",
]
