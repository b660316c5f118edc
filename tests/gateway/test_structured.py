"""Structured outputs and logprobs, on new and on resumed sessions, straight to an engine and
through the gateway (the official `openai` client on the shared real stack).

A resumed session's answer follows the continuation's `response_format` because the scheduler
gives each turn of a streaming-input session its own grammar (`enginecore/turn_grammar.py`);
vLLM alone keeps the first turn's. Logprobs are fixed at a session's first input, so a
continuation asking for more than its session samples is served by a new session.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI

pytestmark = pytest.mark.engine

CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": CITY}}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"q": {"enum": ["x"]}},
            "required": ["q"],
        },
    },
}
ASK = [{"role": "user", "content": "Where?"}]


def _client(base: str) -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def _bases(stack: Any) -> list[str]:
    return [stack.engines[0], stack.gateway]


def _call(client: OpenAI, **kw: Any) -> Any:
    """A first turn forced to call `lookup` (paused for the client)."""
    first = client.chat.completions.create(
        model="tiny",
        messages=ASK,  # type: ignore[arg-type]
        tools=[LOOKUP],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        max_tokens=80,
        **kw,
    )
    assert first.choices[0].finish_reason == "tool_calls"
    return first


def _continue(client: OpenAI, first: Any, choice: int = 0, **kw: Any) -> Any:
    msg = first.choices[choice].message
    messages = [
        *ASK,
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "found"},
    ]
    return client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=[LOOKUP],  # type: ignore[list-item]
        tool_choice="none",
        **kw,
    )


def _route(completion: Any) -> str:
    return str((completion.model_extra or {})["interlude"]["route"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_answer_follows_the_schema(stack: Any, stream: bool) -> None:
    for base in _bases(stack):
        kw: dict[str, Any] = {"model": "tiny", "messages": ASK, "max_tokens": 60, "seed": 3}
        out = _client(base).chat.completions.create(**kw, response_format=FORMAT, stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in out if c.choices)
        else:
            assert out.choices[0].finish_reason == "stop", out
            text = out.choices[0].message.content or ""
        assert json.loads(text) == {"city": "Oslo"}, (base, text)


def test_a_json_object_answer_is_an_object_or_cut_by_its_limit(stack: Any) -> None:
    out = _client(stack.engines[1]).chat.completions.create(
        model="tiny",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=40,
        seed=1,
        response_format={"type": "json_object"},
    )
    text = (out.choices[0].message.content or "").strip()
    assert text.startswith("{"), text
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_a_resumed_answer_follows_the_continuations_schema(stack: Any) -> None:
    client = _client(stack.engines[0])
    first = _call(client)
    second = _continue(client, first, max_tokens=60, response_format=FORMAT)
    assert _route(second) == "resume"  # the parked session, not a recompute
    assert json.loads(second.choices[0].message.content or "") == {"city": "Oslo"}


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_come_per_token_with_the_asked_alternatives(stack: Any, stream: bool) -> None:
    for base in _bases(stack):
        out = _client(base).chat.completions.create(
            model="tiny",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=5,
            extra_body={"ignore_eos": True},
            logprobs=True,
            top_logprobs=2,
            stream=stream,
        )
        if stream:
            chunks = [c.choices[0] for c in out if c.choices]
            text = "".join(c.delta.content or "" for c in chunks)
            entries = [e for c in chunks if c.logprobs for e in c.logprobs.content or ()]
        else:
            text = out.choices[0].message.content or ""
            entries = list(out.choices[0].logprobs.content or ())
        assert len(entries) == 5, (base, entries)
        # In order, each token's text (a byte-fallback piece of a character decodes to "").
        at = 0
        for e in entries:
            at = text.index(e.token, at) + len(e.token)
        for e in entries:
            assert len(e.top_logprobs) == 2 and e.logprob <= 0.0
            best, second = e.top_logprobs
            assert best.logprob >= second.logprob and best.logprob >= e.logprob - 1e-6
            assert bytes(e.bytes or []) == e.token.encode()


def test_a_continuation_gets_logprobs_its_session_samples_or_a_new_session(stack: Any) -> None:
    client = _client(stack.engines[1])
    more = _continue(client, _call(client), max_tokens=3, logprobs=True, top_logprobs=1)
    # The session sampled without logprobs: vLLM cannot add them later, so it is recomputed.
    assert _route(more) == "fallback"
    assert len(more.choices[0].logprobs.content or ()) == more.usage.completion_tokens
    fewer = _continue(
        client,
        _call(client, logprobs=True, top_logprobs=3),
        max_tokens=3,
        logprobs=True,
        top_logprobs=1,
    )
    assert _route(fewer) == "resume"
    entries = fewer.choices[0].logprobs.content or []
    assert entries and all(len(e.top_logprobs) == 1 for e in entries)


def test_n_choices_are_sessions_of_their_own(stack: Any) -> None:
    for base in _bases(stack):
        out = _client(base).chat.completions.create(
            model="tiny",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=8,
            seed=3,
            n=3,
            extra_body={"ignore_eos": True},
        )
        assert [c.index for c in out.choices] == [0, 1, 2]
        texts = [c.message.content for c in out.choices]
        assert len(set(texts)) > 1, texts  # seeds 3, 4, 5
        assert out.usage is not None and out.usage.completion_tokens == 24


def test_n_streamed_choices_interleave_by_index(stack: Any) -> None:
    chunks = list(
        _client(stack.gateway).chat.completions.create(
            model="tiny",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=6,
            n=2,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices}
    assert finished == {0: "length", 1: "length"}


def test_continuing_one_choice_frees_the_others(stack: Any) -> None:
    engine = stack.engines[0]
    client = _client(engine)
    first = _call(client, n=2)
    assert [c.finish_reason for c in first.choices] == ["tool_calls", "tool_calls"]
    sessions = (first.model_extra or {})["interlude"]["session_ids"]
    second = _continue(client, first, choice=1, max_tokens=4)
    assert _route(second) == "resume"
    # Choice 0's session, parked for a call nobody will answer, was cancelled.
    assert httpx.get(f"{engine}/v1/sessions/{sessions[0]}").status_code == 404
