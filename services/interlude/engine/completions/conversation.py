"""Conversations as the engine reads them, and the keys that find a paused session again.

A client that ran a tool sends the whole conversation back: everything it sent before, the
assistant message we returned (with its `tool_calls`), then one `tool` message per call. The
engine resumes the paused session only if that conversation *extends the paused one
exactly*: the part up to and including the assistant message must hash to the key stored at
the pause, and the tool messages after it must answer exactly the calls the session waits for.
Anything else (an edited history, an extra user turn, other tools) is served by recompute.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from interlude.api.openai import ChatCompletionRequest, Message


def engine_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The request's messages in the engine's shape: text content, `developer` as `system`."""
    return [_engine_message(m, f"messages[{i}]") for i, m in enumerate(req.messages)]


def _engine_message(m: Message, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": "system" if m.role == "developer" else m.role,
        "content": m.text(where),
    }
    if m.name:
        out["name"] = m.name
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
    return out


def tool_defs(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    return [t.model_dump(exclude_none=True) for t in req.tools or ()]


def conversation_key(
    model: str, tools: Sequence[dict[str, Any]], messages: Sequence[dict[str, Any]]
) -> str:
    """A digest of what the engine's context was built from: model, tools and messages.

    Content `None` and `""` hash alike (clients send either for a tool-calling turn).
    """
    canon = [
        {**m, "content": m.get("content") or ""} if m.get("role") == "assistant" else m
        for m in messages
    ]
    blob = json.dumps([model, list(tools), canon], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class ToolReturn:
    """A conversation that ends with tool results after an assistant's calls."""

    prefix_len: int  # messages up to and including the assistant message with the calls
    results: tuple[tuple[str, str], ...]  # (tool_call_id, content) in the client's order


def tool_return(messages: Sequence[dict[str, Any]]) -> ToolReturn | None:
    """How `messages` ends: tool results answering the last assistant's calls, or None."""
    i = len(messages)
    while i > 0 and messages[i - 1]["role"] == "tool":
        i -= 1
    if i == len(messages) or i == 0:
        return None
    assistant = messages[i - 1]
    if assistant["role"] != "assistant" or not assistant.get("tool_calls"):
        return None
    results = tuple((m.get("tool_call_id") or "", m.get("content") or "") for m in messages[i:])
    return ToolReturn(i, results)


def answers_exactly(ret: ToolReturn, call_ids: Sequence[str]) -> bool:
    """True if the results answer each awaited call once, and nothing else."""
    ids = [cid for cid, _ in ret.results]
    return len(ids) == len(set(ids)) and set(ids) == set(call_ids)
