"""What routing reads from a chat completion's body: its model and the engine its tool results
name. Shared by the gateway (`relay`) and the endpoint picker (`interlude.picker`), which read
the body once each, for this alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from interlude.api.names import call_tag
from interlude.api.openai import Unsupported, benchmark_only


@dataclass(frozen=True)
class Hint:
    """What routing needs from a request: its model and the engine tag its tool results name
    (and whether it asks for a stream, which the gateway's metrics label)."""

    model: str
    tag: str | None
    stream: bool = False

    @classmethod
    def of(cls, raw: bytes, benchmark_mode: bool = False, server: str = "gateway") -> Hint:
        """Read from the body; Unsupported (400) when it is not a JSON object with a model, or
        it carries `interlude_script` and the `server` is not in `benchmark_mode`. Everything
        else is the engine's to check."""
        try:
            body = json.loads(raw)
        except ValueError:
            raise Unsupported("body", "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise Unsupported("body", "the body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise Unsupported("model", "model: a model name is required")
        if not benchmark_mode and body.get("interlude_script") is not None:
            raise benchmark_only("interlude_script", server)
        return cls(model, _result_tag(body.get("messages")), body.get("stream") is True)


def _result_tag(messages: Any) -> str | None:
    """The engine tag of the first tool result the conversation ends with, if any."""
    if not isinstance(messages, list):
        return None
    for m in reversed(messages):
        if not isinstance(m, dict) or m.get("role") != "tool":
            return None
        tag = call_tag(str(m.get("tool_call_id", "")))
        if tag is not None:
            return tag
    return None
