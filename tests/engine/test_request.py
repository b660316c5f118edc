"""Request validation, wire models and events: no engine needed."""

from __future__ import annotations

from typing import Any

import pytest

from interlude.engine.api import SSE_DONE, SubmitBody, sse
from interlude.engine.events import Done, SessionState, ToolResultEvent
from interlude.engine.request import ChatRequest, RequestError

USER = ({"role": "user", "content": "hi"},)
CALC = {"type": "function", "function": {"name": "calculator", "parameters": {}}}


def make(**kw: Any) -> ChatRequest:
    return ChatRequest(**{"session_id": "s", "messages": USER, **kw})


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"session_id": ""}, "session_id"),
        ({"messages": ()}, "messages"),
        ({"messages": ({"role": "robot", "content": "x"},)}, "role"),
        ({"messages": ({"role": "user", "content": 3},)}, "content"),
        ({"tools": ({"type": "function"},)}, "tools[0]"),
        ({"tools": ({"type": "function", "function": {}},)}, "name"),
        ({"tools": (CALC,), "tool_choice": "search"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 2.5}, "temperature"),
    ],
)
def test_bad_requests_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError, match=field.replace("[", r"\[")):
        make(**kw)


def test_tool_use_follows_tool_choice() -> None:
    assert make(tools=(CALC,)).uses_tools
    assert make(tools=(CALC,), tool_choice="calculator").uses_tools
    assert not make(tools=(CALC,), tool_choice="none").uses_tools
    assert not make().uses_tools


def test_named_tool_choice_object() -> None:
    named = {"type": "function", "function": {"name": "calculator"}}
    assert SubmitBody(messages=list(USER), tool_choice=named).choice() == "calculator"
    with pytest.raises(ValueError, match="tool_choice"):
        SubmitBody(messages=list(USER), tool_choice={"type": "function"}).choice()


def test_states_are_ordered_and_finished_is_a_comparison() -> None:
    assert [s.finished for s in SessionState] == [False] * 4 + [True] * 3
    assert SessionState.AWAITING_CLIENT < SessionState.FINISHED


def test_event_wire_form_and_sse_frames() -> None:
    done = Done("s", "stop", 3, 4, 5, 1, 2)
    assert done.to_json()["type"] == "done" and done.to_json()["tool_tokens"] == 5
    assert ToolResultEvent("c", False, "", "timeout: late").model_text == "error: timeout: late"
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert SSE_DONE == b"data: [DONE]\n\n"
