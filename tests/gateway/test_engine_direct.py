"""An engine serves OpenAI's API itself: the official `openai` client pointed at one engine
gets chat completions, tool calls and resumed sessions; bad input gets the same 400 envelope
straight from an engine as through the gateway; and a session belongs to its tenant.

Runs on the shared real stack (`conftest.stack`): two engines and the gateway, as processes.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import OpenAI

from interlude.api.engine import TENANT_HEADER, TOOLS_HEADER
from interlude.api.names import call_tag, engine_tag

pytestmark = pytest.mark.engine

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris"]}},
            "required": ["city"],
        },
    },
}
BAD_SCHEMA = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
FORCED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def _first(client: OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=FORCED,  # type: ignore[arg-type]
        max_tokens=160,
        **kw,
    )


def _continuation(first: Any) -> list[dict[str, Any]]:
    msg = first.choices[0].message
    return [
        *ASK,
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18 C"},
    ]


def test_the_openai_client_against_one_engine(stack: Any) -> None:
    engine = stack.engines[0]
    client = OpenAI(base_url=engine + "/v1", api_key="unused", max_retries=0, timeout=120)
    plain = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4)  # type: ignore[arg-type]
    assert plain.choices[0].finish_reason in ("stop", "length") and plain.usage is not None
    first = _first(client)
    assert first.choices[0].finish_reason == "tool_calls"
    call_id = first.choices[0].message.tool_calls[0].id
    engine_id = httpx.get(engine + "/v1/load").json()["engine_id"]
    assert call_tag(call_id) == engine_tag(engine_id)  # the id names its engine
    second = client.chat.completions.create(
        model="tiny",
        messages=_continuation(first),  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=8,
    )
    assert (second.model_extra or {})["interlude"]["route"] == "resume"
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_a_key_runs_only_the_server_side_tools_it_was_given(stack: Any) -> None:
    calculator = {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"enum": ["2+3"]}},
                "required": ["expression"],
            },
        },
    }
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "2+3?"}],
        "tools": [calculator],
        "tool_choice": {"type": "function", "function": {"name": "calculator"}},
        "max_tokens": 120,
    }

    def ask(tools: str | None) -> dict[str, Any]:
        headers = {TENANT_HEADER: "t"} | ({} if tools is None else {TOOLS_HEADER: tools})
        r = httpx.post(stack.engines[1] + "/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    # Every published tool: a worker runs the call, and the answer follows in one request.
    ran = ask(None)
    assert [e["type"] for e in ran["interlude"]["server_tool_events"]][:2] == [
        "tool_call",
        "tool_result",
    ]
    # A key given no tools (or others): the same call is the client's to run.
    for given in ("", "retrieval"):
        held = ask(given)
        assert held["choices"][0]["finish_reason"] == "tool_calls", given
        assert held["interlude"]["server_tool_events"] == []
        _ = httpx.delete(f"{stack.engines[1]}/v1/sessions/{held['interlude']['session_id']}")


def test_a_resumed_answer_says_how_its_kv_came_back(stack: Any) -> None:
    engine = stack.engines[0]
    client = OpenAI(base_url=engine + "/v1", api_key="unused", max_retries=0, timeout=120)
    first = _first(client)
    body = {"model": "tiny", "messages": _continuation(first), "tools": [WEATHER], "max_tokens": 4}
    r = httpx.post(engine + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["interlude"]["route"] == "resume"
    timing = dict(part.strip().split(";", 1) for part in r.headers["server-timing"].split(","))
    assert timing["route"] == 'desc="resume"'
    # The scheduler's report, carried to the front end with the step's stats.
    assert timing["kv"] in {
        f'desc="{k}"' for k in ("preserve", "swap", "prefix-cache", "recompute")
    }
    assert float(timing["queue"].removeprefix("dur=")) >= 0.0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "n": 17}, "n"),
        ({**CHAT, "temperature": 5}, "temperature"),
        ({"model": "tiny", "messages": []}, "messages"),
        ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        (
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
        ),
        ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({**CHAT, "tool_choice": "required"}, "tool_choice"),
        ({**CHAT, "max_tokens": 10**6}, "max_tokens"),
        ({**CHAT, "stream": "yes"}, "stream"),  # a boolean, not a guess
        ({**CHAT, "tools": [BAD_SCHEMA]}, "tools[0].function.parameters"),
        ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
        ({**CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
        (
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": "objekt"}},
                },
            },
            "response_format.json_schema.schema",
        ),
        ({**CHAT, "top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
        ({**CHAT, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ],
)
def test_bad_input_gets_the_same_400_from_an_engine_and_through_the_gateway(
    stack: Any, body: dict[str, Any], param: str
) -> None:
    for base in (stack.gateway, stack.engines[0]):
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400, (base, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert (err["param"], err["type"]) == (param, "invalid_request_error"), base


def test_a_bad_session_id_header_is_refused(stack: Any) -> None:
    r = httpx.post(
        stack.gateway + "/v1/chat/completions", json=CHAT, headers={"x-session-id": "a b"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-session-id"


def test_a_session_belongs_to_its_tenant(stack: Any) -> None:
    engine = stack.engines[1]
    alice = OpenAI(
        base_url=engine + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=120,
        default_headers={TENANT_HEADER: "alice"},
    )
    first = _first(alice, extra_headers={"x-session-id": "conv-7"})
    body = {"model": "tiny", "messages": _continuation(first), "tools": [WEATHER], "max_tokens": 4}
    # Mallory sends Alice's conversation and her alias: a new session for Mallory, and Alice's
    # stays parked for Alice (her own continuation still resumes it).
    stolen = httpx.post(
        engine + "/v1/chat/completions",
        json=body,
        headers={TENANT_HEADER: "mallory", "x-session-id": "conv-7"},
        timeout=60,
    )
    assert stolen.status_code == 200
    assert stolen.json()["interlude"]["route"] == "fallback"
    mine = alice.chat.completions.create(**body, extra_headers={"x-session-id": "conv-7"})  # type: ignore[call-overload]
    assert (mine.model_extra or {})["interlude"]["route"] == "resume"
