"""The second tool-call format end to end: a Qwen3-Coder (XML) model, on `ChatRunner` directly.

The HTTP tests use the hermes format; this one builds the tiny model with the qwen3_coder chat
template, forces an XML call, pauses for the client and resumes, through `SessionManager`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from interlude.api.events import Done, Paused, ToolCallEvent, ToolResultEvent
from interlude.engine.chat import ChatRunner
from interlude.engine.config import EngineConfig
from interlude.engine.request import ChatRequest
from interlude.engine.sessions import SessionManager
from interlude.engine.tiny_model import TinyModelSpec, build_tiny_model
from interlude.engine.toolcalls import ToolCallCodec

pytestmark = pytest.mark.engine

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Oslo"]}, "days": {"enum": [3]}},
                "required": ["city", "days"],
            },
        },
    },
)


def test_qwen3_coder_call_pauses_and_resumes(tmp_path: Path) -> None:
    from interlude.engine.vllm_engine import VllmEngine

    model = build_tiny_model(TinyModelSpec(tool_format="qwen3_coder"), cache_dir=tmp_path)
    engine = VllmEngine(EngineConfig(model=str(model), num_gpu_blocks=40, host_blocks=64))

    async def body() -> tuple[list[Any], list[Any]]:
        codec = ToolCallCodec(engine.llm.get_tokenizer(), "qwen3_coder")
        runner = ChatRunner(engine.llm, codec, engine.llm.model_config.max_model_len)
        manager = SessionManager(runner)
        req = ChatRequest(
            session_id="q1",
            messages=({"role": "user", "content": "weather?"},),
            tools=TOOLS,
            tool_choice="lookup",
            max_tokens=200,
        )
        first = [ev async for ev in manager.submit(req)]
        call = next(ev for ev in first if isinstance(ev, ToolCallEvent))
        results = [{"tool_call_id": call.call_id, "content": "rain"}]
        second = [ev async for ev in manager.resume("q1", results)]
        return first, second

    try:
        first, second = engine_run(engine, body)
    finally:
        engine.shutdown()
    call = next(ev for ev in first if isinstance(ev, ToolCallEvent))
    arguments = json.loads(call.arguments)
    # The XML grammar lets a value carry whitespace, and a random model uses the freedom.
    assert call.name == "lookup" and arguments["city"].strip() == "Oslo" and arguments["days"] == 3
    assert isinstance(first[-1], Paused) and first[-1].call_ids == (call.call_id,)
    assert second[0] == ToolResultEvent(call.call_id, True, "rain")
    done = second[-1]
    assert isinstance(done, Done) and done.tool_calls == 1 and done.turns == 2
    assert engine.stats()["parked_requests"] == 0


def engine_run(engine: Any, body: Any) -> Any:
    import asyncio

    return asyncio.run(body())
