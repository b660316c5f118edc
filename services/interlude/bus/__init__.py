"""The tool bus: engines and tool workers talk over Redis Streams (DESIGN sections 1 and 6).

`protocol` is the wire format, defined once for both sides; `client` is the engine's side. The
worker's side is `interlude_tools` (tools-svc/).
"""

from interlude.bus.client import Delivery, EngineBus
from interlude.bus.protocol import (
    CALL_STREAM,
    ENGINE_GROUP,
    ERROR_KINDS,
    PROTOCOL_VERSION,
    TOOL_GROUP,
    ProtocolError,
    ToolCall,
    ToolResult,
    done_key,
    result_stream,
)

__all__ = [
    "CALL_STREAM",
    "ENGINE_GROUP",
    "ERROR_KINDS",
    "PROTOCOL_VERSION",
    "TOOL_GROUP",
    "Delivery",
    "EngineBus",
    "ProtocolError",
    "ToolCall",
    "ToolResult",
    "done_key",
    "result_stream",
]
