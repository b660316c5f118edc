"""Scripted tool calls (`api/script.py`): the script's checks, without an engine."""

from __future__ import annotations

import pytest

from interlude.api.script import ScriptedCall, parse_script
from interlude.engine.request import ChatRequest, RequestError

TOOLS = ({"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},)
MSGS = ({"role": "user", "content": "hi"},)


def test_a_script_reads_in_order_with_arguments_as_json_text() -> None:
    raw = [
        {"tool": "lookup", "after_tokens": 3, "arguments": {"q": 1}},
        {"tool": "lookup", "after_tokens": 2},
    ]
    assert parse_script(raw, TOOLS, 6) == (
        ScriptedCall("lookup", 3, '{"q": 1}'),
        ScriptedCall("lookup", 2, "{}"),
    )


@pytest.mark.parametrize(
    ("raw", "max_tokens", "param"),
    [
        ([{"tool": "other", "after_tokens": 3}], 9, "script[0]"),
        ([{"tool": "lookup", "after_tokens": True}], 9, "script[0]"),
        (
            [{"tool": "lookup", "after_tokens": 4}, {"tool": "lookup", "after_tokens": 5}],
            9,
            "max_tokens",
        ),
        ([{"tool": "lookup", "after_tokens": 1}] * 65, 999, "script"),
    ],
)
def test_a_bad_script_names_its_field(
    raw: list[dict[str, object]], max_tokens: int, param: str
) -> None:
    with pytest.raises(RequestError) as info:
        parse_script(raw, TOOLS, max_tokens)
    assert info.value.param == param


def test_a_scripted_request_takes_auto_only_and_no_script_is_not_scripted() -> None:
    script = (ScriptedCall("lookup", 2),)
    with pytest.raises(RequestError, match="auto"):
        ChatRequest("s1", MSGS, TOOLS, tool_choice="lookup", script=script)
    assert ChatRequest("s2", MSGS, TOOLS, script=()).scripted
    assert not ChatRequest("s3", MSGS, TOOLS).scripted
