"""OpenAI chat shapes as the engine accepts them: messages and function tools, checked whole.

The chat route passes messages and tools on (text parts already joined into one string), so
everything the chat template and the tool parser will read is checked here, once, before a
session starts: a malformed field is a `RequestError` naming it (HTTP 400), never an exception
deep in a template or a parser (HTTP 500).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from interlude.api.names import TOOL_NAME

ROLES = ("system", "user", "assistant", "tool")


class RequestError(ValueError):
    """The request is invalid (HTTP 400); the text names the field (`param`, when known)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _fail(where: str, message: str) -> RequestError:
    return RequestError(f"{where} {message}", where)


def check_messages(messages: Sequence[Any]) -> None:
    """RequestError naming the first unusable field of OpenAI chat `messages`.

    Beyond each message's own shape: a `tool` message answers a call of the latest assistant
    message that made calls (as OpenAI requires), since the template renders it as that answer.
    """
    if not messages:
        raise RequestError("messages must not be empty", "messages")
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        _check_message(m, where)
        if m["role"] == "assistant" and m.get("tool_calls"):
            open_calls = {c["id"] for c in m["tool_calls"]}
        elif m["role"] == "tool" and m["tool_call_id"] not in open_calls:
            raise _fail(
                f"{where}.tool_call_id",
                f"{m['tool_call_id']!r} answers no call of the assistant message before it",
            )


def _check_message(m: Any, where: str) -> None:
    if not isinstance(m, Mapping):
        raise _fail(where, "must be an object")
    if m.get("role") not in ROLES:
        raise _fail(f"{where}.role", f"must be one of {ROLES}")
    if m.get("content") is not None and not isinstance(m["content"], str):
        raise _fail(f"{where}.content", "must be a string or null")
    if m.get("name") is not None and not isinstance(m["name"], str):
        raise _fail(f"{where}.name", "must be a string")
    if m["role"] == "tool" and not (isinstance(m.get("tool_call_id"), str) and m["tool_call_id"]):
        raise _fail(f"{where}.tool_call_id", "must be a non-empty string")
    calls = m.get("tool_calls")
    if calls is None:
        return
    if m["role"] != "assistant":
        raise _fail(f"{where}.tool_calls", "is only allowed on an assistant message")
    if not isinstance(calls, list):
        raise _fail(f"{where}.tool_calls", "must be a list")
    for j, c in enumerate(calls):
        _check_call(c, f"{where}.tool_calls[{j}]")


def _check_call(c: Any, at: str) -> None:
    if not isinstance(c, Mapping):
        raise _fail(at, "must be {'id', 'type': 'function', 'function': {'name', 'arguments'}}")
    if not isinstance(c.get("id"), str) or not c["id"]:
        raise _fail(f"{at}.id", "must be a non-empty string")
    if c.get("type", "function") != "function":
        raise _fail(f"{at}.type", "must be 'function'")
    fn = c.get("function")
    if not isinstance(fn, Mapping):
        raise _fail(f"{at}.function", "must be an object {'name', 'arguments'}")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _fail(f"{at}.function.name", "must be a non-empty string")
    args = fn.get("arguments")
    try:
        # OpenAI's shape: the arguments as JSON text, the model's own words.
        parsed = json.loads(args) if isinstance(args, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _fail(f"{at}.function.arguments", "must be a JSON object as a string")


def check_tools(tools: Sequence[Any]) -> frozenset[str]:
    """The names of OpenAI function `tools`; RequestError naming the first bad field."""
    names: set[str] = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(fn, Mapping):
            raise _fail(where, "must be {'type': 'function', 'function': {'name', ...}}")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise _fail(f"{where}.function.name", "must be 1-64 of A-Z a-z 0-9 _ . -")
        if name in names:
            raise _fail(f"{where}.function.name", f"repeats the tool name {name!r}")
        names.add(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise _fail(f"{where}.function.description", "must be a string")
        # The template, the tool parsers and the forced-call grammar read it as an object.
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
            raise _fail(f"{where}.function.parameters", "must be a JSON schema object")
    return frozenset(names)
