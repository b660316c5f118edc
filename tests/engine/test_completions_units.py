"""The engine's chat-completion parts that need no engine: request models, conversation keys,
resume matching, stop strings and the per-tenant paused-session store."""

from __future__ import annotations

import time

import pytest

from interlude.api.openai import ChatCompletionRequest, Unsupported
from interlude.engine.completions.conversation import (
    answers_exactly,
    conversation_key,
    engine_messages,
    tool_return,
)
from interlude.engine.completions.stops import StopScanner
from interlude.engine.completions.store import PausedSession, SessionStore

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _req(messages: list[dict[str, object]], **kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **kw})


def test_text_parts_are_joined_and_developer_is_system() -> None:
    req = _req(
        [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    assert engine_messages(req) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]


def test_an_image_part_is_refused_naming_its_place() -> None:
    req = _req([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(Unsupported) as err:
        engine_messages(req)
    assert err.value.param == "messages[0].content[0].type"


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 17), ("top_logprobs", 2), ("presence_penalty", 0.5), ("modalities", ["audio"])],
)
def test_what_cannot_be_served_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(Unsupported) as err:
        _req([{"role": "user", "content": "hi"}], **{field: value}).check_supported()
    assert err.value.param == field


def test_neutral_values_of_unsupported_features_pass() -> None:
    _req(
        [{"role": "user", "content": "hi"}], n=1, presence_penalty=0, logprobs=False
    ).check_supported()


def test_tool_return_finds_the_results_after_the_last_calls() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    ret = tool_return(msgs)
    assert ret is not None and ret.prefix_len == 2 and ret.results == (("c1", "5"),)
    assert answers_exactly(ret, ["c1"])
    assert not answers_exactly(ret, ["c1", "c2"])
    # A user turn after the results is no plain continuation.
    assert tool_return([*msgs, {"role": "user", "content": "and?"}]) is None
    assert tool_return(msgs[:1]) is None


def test_duplicate_results_do_not_answer_exactly() -> None:
    msgs = [
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c1", "content": "6"},
    ]
    ret = tool_return(msgs)
    assert ret is not None and not answers_exactly(ret, ["c1"])


def test_conversation_key_ignores_null_vs_empty_assistant_content_only() -> None:
    base = [{"role": "user", "content": "q"}]
    a = conversation_key(
        "m", [], [*base, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    )
    b = conversation_key(
        "m", [], [*base, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    )
    assert a == b
    edited = [{"role": "user", "content": "q!"}, {"role": "assistant", "content": None}]
    assert conversation_key("m", [], edited) != a
    assert (
        conversation_key(
            "other", [], [*base, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
        )
        != a
    )
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert (
        conversation_key(
            "m", tools, [*base, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
        )
        != a
    )


@pytest.mark.parametrize(
    ("pieces", "stops", "shown", "stopped"),
    [
        (["hello wor", "ld END tail"], ["END"], "hello world ", True),
        (["ab", "c"], ["xyz"], "abc", False),  # held back, then flushed
        (["a<", "/b> after"], ["</b>"], "a", True),  # a stop split across pieces
        (["no stops"], [], "no stops", False),
    ],
)
def test_stop_scanner(pieces: list[str], stops: list[str], shown: str, stopped: bool) -> None:
    scanner = StopScanner(stops)
    out = "".join(scanner.feed(p) for p in pieces) + scanner.flush()
    assert out == shown
    assert scanner.stopped is stopped


def _paused(tenant: str, sid: str, key: str, ttl_s: float = 60.0) -> PausedSession:
    return PausedSession(tenant, sid, key, ("c1",), "m", 10, 2, 0, time.time() + ttl_s)


def test_session_store_takes_once_and_expires() -> None:
    store = SessionStore()
    rec = _paused("acme", "s1", "k1")
    store.put(rec, alias="mine")
    assert store.take_alias("acme", "mine") == rec
    assert store.take("acme", "k1") is None  # taken once
    store.put(rec)
    assert store.take("acme", "k1") == rec  # by key, without an alias
    store.put(_paused("acme", "s2", "k2", ttl_s=0.05))
    time.sleep(0.1)
    assert store.take("acme", "k2") is None  # expired


def test_another_tenant_finds_nothing_by_alias_or_conversation() -> None:
    store = SessionStore()
    store.put(_paused("acme", "s1", "k1"), alias="conv-42")
    assert store.take_alias("mallory", "conv-42") is None
    assert store.take("mallory", "k1") is None
    assert store.take_alias("acme", "conv-42") is not None  # still there for its owner


def test_a_json_answer_cut_by_an_engine_error_is_a_failure_not_a_short_answer() -> None:
    import asyncio
    from collections.abc import AsyncIterator

    from interlude.api.events import Event, Failed, TextDelta
    from interlude.engine.completions.leg import Leg
    from interlude.engine.completions.routes import LegFailed, _read

    async def events() -> AsyncIterator[Event]:
        yield TextDelta("the answer is", 3)
        yield Failed("s", "engine_error", "the engine core died")

    class Sessions:  # what `_read` asks of the service: nothing here is paused or cancelled
        def remember(self, leg: Leg) -> None:
            raise AssertionError("a failed leg is not recorded")

        async def cancel(self, leg: Leg) -> None:
            return None

    req = _req([{"role": "user", "content": "hi"}])
    leg = Leg(req, "", "s", "s", "new", events(), [], [])
    with pytest.raises(LegFailed) as err:
        asyncio.run(_read(Sessions(), leg))  # type: ignore[arg-type]
    assert err.value.code == "engine_error" and leg.content == "the answer is"


@pytest.mark.parametrize("n", [1, 2])
def test_a_stream_whose_choice_breaks_still_ends_with_an_error_frame_and_done(n: int) -> None:
    """A bug inside one choice (not a session's Failed event) must not end the stream
    without a word, nor, with n > 1, vanish while the stream ends as a success."""
    import asyncio
    from collections.abc import AsyncIterator

    from interlude.api.events import Event, TextDelta
    from interlude.engine.completions import render
    from interlude.engine.completions.leg import Leg
    from interlude.engine.completions.stream import frames

    async def broken() -> AsyncIterator[Event]:
        yield TextDelta("half", 1)
        raise RuntimeError("a bug")

    async def fine() -> AsyncIterator[Event]:
        yield TextDelta("whole", 1)

    class Sessions:
        def remember(self, leg: Leg) -> None:
            return None

        async def cancel(self, leg: Leg) -> None:
            return None

    req = _req([{"role": "user", "content": "hi"}])
    legs = [Leg(req, "", f"s{i}", f"s{i}", "new", ev(), [], [], index=i)
            for i, ev in enumerate([broken, fine][:n])]  # fmt: skip

    async def body() -> list[bytes]:
        return [f async for f in frames(Sessions(), legs, False, False)]  # type: ignore[arg-type]

    out = asyncio.run(body())
    assert out[-1] == render.SSE_DONE
    assert any(b'"error"' in f and b"mid-answer" in f for f in out)
