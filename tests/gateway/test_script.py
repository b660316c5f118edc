"""`interlude_script` (scripted tool calls) and `interlude_kind` are checked before a session
starts: a bad one is a 400 in OpenAI's envelope naming the field, the same straight from an
engine and through the gateway, and a request without them is unchanged. On the shared real
stack (`conftest.stack`)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.engine

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        (
            {"interlude_script": [{"tool": "nope", "after_tokens": 3}]},
            "interlude_script[0]",
            "nope",
        ),
        (
            {"interlude_script": [{"tool": "lookup", "after_tokens": 0}]},
            "interlude_script[0]",
            ">= 1",
        ),
        (
            {"interlude_script": [{"tool": "lookup", "after_tokens": 2, "arguments": [1]}]},
            "interlude_script[0]",
            "object",
        ),
        (
            {"interlude_script": [{"tool": "lookup", "after_tokens": 8}], "max_tokens": 8},
            "max_tokens",
            "exceed",
        ),
        (
            {
                "interlude_script": [{"tool": "lookup", "after_tokens": 2}],
                "tool_choice": "required",
            },
            "tool_choice",
            "auto",
        ),
        ({"interlude_script": "lookup"}, "interlude_script", "list"),
        (
            {"interlude_script": [{"tool": "lookup", "after_tokens": 1}] * 65, "max_tokens": 999},
            "interlude_script",
            "at most 64",
        ),
        ({"interlude_kind": "web search"}, "interlude_kind", "pattern"),
        ({"interlude_kind": "k" * 65}, "interlude_kind", "64"),
    ],
)
def test_a_bad_script_is_a_400_naming_the_field(
    stack: Any, extra: dict[str, Any], param: str, words: str
) -> None:
    for base in (stack.gateway, stack.engines[0]):
        r = httpx.post(base + "/v1/chat/completions", json={**CHAT, **extra}, timeout=30)
        assert r.status_code == 400, (base, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error"
        assert err["param"] == param
        assert words in err["message"]


def test_a_valid_script_and_no_script_pass_the_checks(stack: Any) -> None:
    for extra in (
        {"max_tokens": 2},
        {"interlude_script": [{"tool": "lookup", "after_tokens": 2}], "max_tokens": 3},
        {"interlude_kind": "toolbench:search", "max_tokens": 2},
    ):
        r = httpx.post(stack.gateway + "/v1/chat/completions", json={**CHAT, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        if "interlude_script" in extra:  # its call of `lookup` is the client's: it pauses
            assert r.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_a_gateway_not_in_benchmark_mode_refuses_a_script(stack: Any, extra_gateway: Any) -> None:
    """The shared stack's gateway runs in benchmark mode (the tests above); one started
    without it (the default) answers a script with a 400 before any engine is asked."""
    gateway = extra_gateway("--no-auth", "--rate-limit", "")
    script = {"interlude_script": [{"tool": "lookup", "after_tokens": 2}], "max_tokens": 3}
    r = httpx.post(gateway + "/v1/chat/completions", json={**CHAT, **script}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == "interlude_script"
    assert "benchmark mode is off" in err["message"]
    plain = httpx.post(gateway + "/v1/chat/completions", json={**CHAT, "max_tokens": 2}, timeout=60)
    assert plain.status_code == 200, plain.text
