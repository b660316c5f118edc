"""What a chat session is asked to do: `ChatRequest`, validated once when it is built.

Messages and tools have OpenAI's chat shapes, so the gateway passes them through; a bad field
raises `RequestError` naming it (the service answers HTTP 400 in the error envelope).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
CHOICES = ("auto", "none", "required")


class RequestError(ValueError):
    """The request is invalid (HTTP 400); the text names the field (`param`, when known)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _check_message(m: Mapping[str, Any], where: str) -> None:
    """RequestError naming the first field of one OpenAI chat message that cannot be used."""
    if not isinstance(m, Mapping):
        raise RequestError(f"{where} must be an object", where)
    if m.get("role") not in ROLES:
        raise RequestError(f"{where}.role must be one of {ROLES}", f"{where}.role")
    if m.get("content") is not None and not isinstance(m.get("content"), str):
        raise RequestError(f"{where}.content must be a string or null", f"{where}.content")
    if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise RequestError(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
    calls = m.get("tool_calls")
    if calls is None:
        return
    if m["role"] != "assistant" or not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list on an assistant message", where)
    for j, c in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping):
            raise RequestError(f"{at} must be {{'id', 'type': 'function', 'function'}}", at)
        if not isinstance(c.get("id", ""), str):
            raise RequestError(f"{at}.id must be a string", f"{at}.id")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(
                f"{at}.function.name must be a non-empty string", f"{at}.function.name"
            )
        args = fn.get("arguments", "{}")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = None
        if not isinstance(parsed, Mapping):
            raise RequestError(
                f"{at}.function.arguments must be a JSON object (as text)",
                f"{at}.function.arguments",
            )


@dataclass(frozen=True)
class ChatRequest:
    """One session as the gateway submits it (OpenAI chat shapes for messages and tools)."""

    session_id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    # "auto" | "none" | "required" | a tool's name. A forced choice constrains the first turn
    # only: later turns follow the tool results ("auto").
    tool_choice: str = "auto"
    max_tokens: int = 256  # generated tokens over the whole session
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tool_calls: int = 16
    kind: str = "unknown"  # augmentation kind, for the policy's predictions
    trace: Mapping[str, str] = field(default_factory=dict)  # caller's W3C trace context

    def __post_init__(self) -> None:
        if not self.session_id:
            raise RequestError("session_id must not be empty")
        if not self.messages:
            raise RequestError("messages must not be empty")
        for i, m in enumerate(self.messages):
            _check_message(m, f"messages[{i}]")
        for i, t in enumerate(self.tools):
            if t.get("type") != "function" or not isinstance(t.get("function"), Mapping):
                raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': ...}}")
            if not t["function"].get("name"):
                raise RequestError(f"tools[{i}].function.name must not be empty")
        names = {t["function"]["name"] for t in self.tools}
        if self.tool_choice not in CHOICES and self.tool_choice not in names:
            raise RequestError(
                f"tool_choice {self.tool_choice!r} is not {CHOICES} or a tool name", "tool_choice"
            )
        if self.tool_choice != "auto" and self.tool_choice != "none" and not self.tools:
            raise RequestError(
                "tool_choice forces a tool call but no tools were given", "tool_choice"
            )
        if self.max_tokens < 1 or self.max_tool_calls < 0:
            raise RequestError("max_tokens must be >= 1 and max_tool_calls >= 0")
        if not 0.0 <= self.temperature <= 2.0:
            raise RequestError("temperature must be in [0, 2]", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError("top_p must be in (0, 1]", "top_p")

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"
