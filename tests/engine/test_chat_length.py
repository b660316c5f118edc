"""A session whose tool result would carry its context past the model's length ends there, with
`finish_reason` "length", instead of handing vLLM a continuation it must refuse (real vLLM, the
tiny model, `ChatRunner` with a short `max_model_len`)."""

from __future__ import annotations

from typing import Any

from interlude.api.events import Done, Paused, TextDelta, ToolCallEvent, ToolResultEvent
from interlude.engine.chat import ChatRunner
from interlude.engine.request import ChatRequest
from interlude.engine.sessions import SessionManager
from interlude.engine.toolcalls import ToolCallCodec

from .test_stream_interval import TOOLS  # one `lookup` tool


def test_a_result_past_the_model_length_ends_the_session_with_length(with_engine: Any) -> None:
    async def body(engine: Any) -> tuple[Paused, list[Any], list[Any]]:
        codec = ToolCallCodec(engine.llm.get_tokenizer(), "hermes")

        def request(session: str) -> ChatRequest:
            return ChatRequest(
                session_id=session,
                messages=({"role": "user", "content": "weather?"},),
                tools=TOOLS,
                tool_choice="lookup",
                max_tokens=120,
            )

        # Greedy sampling: a first session measures the call, the same call as the second's.
        probe = ChatRunner(engine.llm, codec, engine.llm.model_config.max_model_len)
        measured = [ev async for ev in SessionManager(probe).submit(request("probe"))][-1]
        assert isinstance(measured, Paused)
        # Room for the prompt and the call, not for the result's 20-odd tokens after it.
        room = measured.prompt_tokens + measured.completion_tokens + 5
        manager = SessionManager(ChatRunner(engine.llm, codec, room))
        first = [ev async for ev in manager.submit(request("long"))]
        call = next(ev for ev in first if isinstance(ev, ToolCallEvent))
        results = [{"tool_call_id": call.call_id, "content": "rain " * 20}]
        return measured, first, [ev async for ev in manager.resume("long", results)]

    measured, first, second = with_engine(body)
    paused = first[-1]
    assert isinstance(paused, Paused) and paused.completion_tokens == measured.completion_tokens
    assert isinstance(second[0], ToolResultEvent) and second[0].ok
    done = second[-1]
    assert isinstance(done, Done) and done.finish_reason == "length"
    assert done.turns == 1 and done.tool_calls == 1  # no second turn was generated
    assert done.completion_tokens == paused.completion_tokens
    assert not any(isinstance(ev, TextDelta) for ev in second)
