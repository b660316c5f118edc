"""Request validation, wire models and events: no engine needed."""

from __future__ import annotations

from typing import Any

import pytest

from interlude.api.engine import SubmitBody
from interlude.api.events import Done, ToolResultEvent
from interlude.api.wire import SSE_DONE, sse
from interlude.engine.request import ChatRequest, RequestError
from interlude.engine.state import SessionState

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


def call(cid: str = "c1", **fn: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}", **fn}}


def asked(*calls: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The user's question and an assistant turn making `calls`."""
    return (*USER, {"role": "assistant", "content": None, "tool_calls": list(calls)})


def answer(cid: str = "c1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": "5"}


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        (
            {"messages": asked({"id": "c1", "type": "function"})},
            "messages[1].tool_calls[0].function",
        ),
        ({"messages": asked(call(name=""))}, "messages[1].tool_calls[0].function.name"),
        ({"messages": asked(call(arguments=None))}, "messages[1].tool_calls[0].function.arguments"),
        (
            {"messages": asked(call(arguments={"a": 1}))},
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            {"messages": asked(call(arguments="[1]"))},
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"messages": asked(call(arguments="{"))}, "messages[1].tool_calls[0].function.arguments"),
        ({"messages": asked(call(cid=""))}, "messages[1].tool_calls[0].id"),
        ({"messages": asked({**call(), "type": "code"})}, "messages[1].tool_calls[0].type"),
        ({"messages": asked(["not", "a", "call"])}, "messages[1].tool_calls[0]"),  # type: ignore[arg-type]
        (
            {"messages": ({"role": "user", "content": "x", "tool_calls": []},)},
            "messages[0].tool_calls",
        ),
        ({"messages": ({"role": "assistant", "tool_calls": {"a": 1}},)}, "messages[0].tool_calls"),
        ({"messages": ({"role": "user", "content": "x", "name": 5},)}, "messages[0].name"),
        ({"messages": (*USER, {"role": "tool", "content": "5"})}, "messages[1].tool_call_id"),
        ({"messages": (*USER, answer())}, "messages[1].tool_call_id"),
        ({"messages": (*asked(call()), answer("c2"))}, "messages[2].tool_call_id"),
        ({"messages": ("hi",)}, "messages[0]"),
        ({"tools": ({"type": "function", "function": {"name": "a b"}},)}, "tools[0].function.name"),
        ({"tools": (CALC, CALC)}, "tools[1].function.name"),
        (
            {"tools": ({"type": "function", "function": {"name": "f", "parameters": [1]}},)},
            "tools[0].function.parameters",
        ),
        (
            {"tools": ({"type": "function", "function": {"name": "f", "description": 1}},)},
            "tools[0].function.description",
        ),
        ({"session_id": "a/b"}, "session_id"),
        ({"session_id": "x" * 129}, "session_id"),
        ({"seed": 2**64}, "seed"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_malformed_shapes_are_refused_naming_the_field(kw: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        make(**kw)
    assert info.value.param == param
    assert param in str(info.value)


def test_a_whole_tool_conversation_is_accepted() -> None:
    # Two parallel calls, both answered, then the user again: all well-formed.
    messages = (*asked(call("c1"), call("c2", arguments='{"x": 1}')), answer("c1"), answer("c2"))
    req = make(messages=(*messages, {"role": "user", "content": None}), tools=(CALC,))
    assert len(req.messages) == 5 and req.uses_tools


def test_tool_use_follows_tool_choice() -> None:
    assert make(tools=(CALC,)).uses_tools
    assert make(tools=(CALC,), tool_choice="calculator").uses_tools
    assert not make(tools=(CALC,), tool_choice="none").uses_tools
    assert not make().uses_tools


def test_named_tool_choice_object() -> None:
    named = {"type": "function", "function": {"name": "calculator"}}
    assert SubmitBody(messages=list(USER), tool_choice=named).choice() == "calculator"
    for bad in ({"type": "function"}, {"type": "function", "function": "calculator"}):
        with pytest.raises(RequestError) as info:
            SubmitBody(messages=list(USER), tool_choice=bad).choice()
        assert info.value.param == "tool_choice"


def test_states_are_ordered_and_finished_is_a_comparison() -> None:
    assert [s.finished for s in SessionState] == [False] * 4 + [True] * 3
    assert SessionState.AWAITING_CLIENT < SessionState.FINISHED


def test_event_wire_form_and_sse_frames() -> None:
    done = Done("s", "stop", 3, 4, 5, 1, 2)
    assert done.to_json()["type"] == "done" and done.to_json()["tool_tokens"] == 5
    assert ToolResultEvent("c", False, "", "timeout: late").model_text == "error: timeout: late"
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert SSE_DONE == b"data: [DONE]\n\n"
