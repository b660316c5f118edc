"""Scripted tool calls: make a random-weight model intercept where a workload says, over the API.

A benchmark replays traces of augmented requests: generate N tokens, call tool T, get K tokens
back after D seconds, go on. A real model decides by itself when to call a tool; a random-weight
one never writes a call. The InferCept harness scripts those calls inside its engine (our
`session.ScriptedSession` does too); `script` lets a client do the same through the public API,
so a load generator can replay a trace against the whole stack (gateway, sessions, resume).

A request's script is a list of calls. Turn i of a scripted request generates exactly
`after_tokens` tokens (end-of-sequence ignored, the model's own call markers not parsed), and
then the engine ends the turn with a synthetic call of `tool` with `arguments`, exactly as if
the model had written it: the call's markup is appended to the context, a server-side tool runs
on the bus, a client-side one pauses the session for the client. After the last scripted call
the turn runs to the request's `max_tokens`. A resume may bring a new script for its own turns.

A session is scripted when its first request carries a script (an empty one too); requests
without one are served exactly as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interlude.api.messages import RequestError
from interlude.api.names import TOOL_NAME

MAX_SCRIPTED_CALLS = 64


@dataclass(frozen=True)
class ScriptedCall:
    """Generate exactly `after_tokens` tokens, then call `tool` with `arguments` (JSON text)."""

    tool: str
    after_tokens: int
    arguments: str = "{}"

    def __post_init__(self) -> None:
        if not TOOL_NAME.fullmatch(self.tool):
            raise ValueError(f"ScriptedCall.tool {self.tool!r} is not a function name")
        if isinstance(self.after_tokens, bool) or self.after_tokens < 1:
            raise ValueError("ScriptedCall.after_tokens must be >= 1")


def parse_script(
    raw: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], max_tokens: int | None
) -> tuple[ScriptedCall, ...]:
    """A request's script, checked against its declared `tools` and token limit.

    RequestError naming `script[i].<field>` for a call of an undeclared tool, a count below 1,
    arguments that are not an object, or a script that leaves no token for the turn after its
    last call (`max_tokens` must exceed the sum of `after_tokens`; None: not checked here).
    """
    if len(raw) > MAX_SCRIPTED_CALLS:
        raise RequestError(f"script takes at most {MAX_SCRIPTED_CALLS} calls", "script")
    declared = {str((t.get("function") or {}).get("name")) for t in tools}
    out: list[ScriptedCall] = []
    for i, item in enumerate(raw):
        where = f"script[{i}]"
        tool, after, args = item.get("tool"), item.get("after_tokens"), item.get("arguments", {})
        if not isinstance(tool, str) or tool not in declared:
            raise RequestError(f"{where}.tool {tool!r} is not one of the request's tools", where)
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise RequestError(f"{where}.after_tokens must be an integer >= 1", where)
        if not isinstance(args, Mapping):
            raise RequestError(f"{where}.arguments must be a JSON object", where)
        out.append(ScriptedCall(tool, after, json.dumps(args)))
    if max_tokens is not None and sum(c.after_tokens for c in out) >= max_tokens:
        raise RequestError(
            "max_tokens must exceed the sum of the script's after_tokens (the turn after the "
            "last call generates at least one token)",
            "max_tokens",
        )
    return tuple(out)


__all__ = ["MAX_SCRIPTED_CALLS", "ScriptedCall", "parse_script"]
