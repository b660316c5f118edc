"""`EngineConfig.stream_interval`: a session's text comes in chunks of that many tokens, on every
turn of it (real vLLM, the tiny model)."""

from __future__ import annotations

from typing import Any

from interlude.api.events import Done, Paused, TextDelta, ToolCallEvent
from interlude.engine.chat import ChatRunner
from interlude.engine.request import ChatRequest
from interlude.engine.sessions import SessionManager
from interlude.engine.toolcalls import ToolCallCodec

INTERVAL = 4
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look a city up",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Oslo"]}},
                "required": ["city"],
            },
        },
    },
)


def test_text_streams_in_chunks_of_the_interval_on_every_turn(with_engine: Any) -> None:
    async def body(engine: Any) -> tuple[list[Any], list[Any]]:
        codec = ToolCallCodec(engine.llm.get_tokenizer(), "hermes")
        manager = SessionManager(
            ChatRunner(engine.llm, codec, engine.llm.model_config.max_model_len)
        )
        req = ChatRequest(
            session_id="chunky",
            messages=({"role": "user", "content": "weather?"},),
            tools=TOOLS,
            tool_choice="lookup",
            max_tokens=120,
            ignore_eos=True,
        )
        first = [ev async for ev in manager.submit(req)]
        call = next(ev for ev in first if isinstance(ev, ToolCallEvent))
        results = [{"tool_call_id": call.call_id, "content": "rain"}]
        return first, [ev async for ev in manager.resume("chunky", results)]

    first, second = with_engine(body, stream_interval=INTERVAL)
    assert isinstance(first[-1], Paused)
    done = second[-1]
    assert isinstance(done, Done) and done.turns == 2
    answer = [ev for ev in second if isinstance(ev, TextDelta)]
    # The answer turn runs to the session's limit: its text came in the interval's chunks (the
    # first token alone, as vLLM sends it at once), not a chunk per token.
    tokens = [ev.tokens for ev in answer]
    assert sum(tokens) >= 3 * INTERVAL, tokens
    assert max(tokens) >= INTERVAL, tokens
    assert len(answer) <= 2 + sum(tokens) // INTERVAL, tokens
    assert done.finish_reason == "length" and sum(tokens) < done.completion_tokens
