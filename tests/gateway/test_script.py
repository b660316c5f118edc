"""`interlude_script` (scripted tool calls) and `interlude_kind` are checked before any engine is
asked: a bad one is a 400 in OpenAI's envelope naming the field, and a request without them is
unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from interlude.gateway.app import make_app
from interlude.gateway.config import GatewayConfig

NOWHERE = "http://127.0.0.1:9"  # no engine: a request that passes the checks gets a 503
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    config = GatewayConfig(engines=(NOWHERE,), health_interval_s=0.2, auth=False, rate_limit="")
    with TestClient(make_app(config)) as c:
        yield c


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
    client: TestClient, extra: dict[str, Any], param: str, words: str
) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert words in err["message"]


def test_a_valid_script_and_no_script_pass_the_checks(client: TestClient) -> None:
    # Both reach routing: no engine is ready here, so both are a 503, not a 400.
    for extra in (
        {},
        {"interlude_script": [{"tool": "lookup", "after_tokens": 2}], "max_tokens": 3},
        {"interlude_kind": "toolbench:search"},
    ):
        r = client.post("/v1/chat/completions", json={**CHAT, **extra})
        assert r.status_code == 503, r.text
