"""Deadlines and cancellation leave nothing parked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlude.engine.session import ScriptedSession, Step

pytestmark = pytest.mark.engine  # starts real vLLM engines


def test_tool_deadline_ends_the_session_with_an_error(with_engine: Any) -> None:
    slow = ScriptedSession("slow", tuple(range(30, 90)), (Step(4, "human", 30.0, 3), Step(2)))

    async def body(engine: Any) -> tuple[Any, dict[str, Any]]:
        result = await engine.run_scripted(slow)
        await asyncio.sleep(0.3)
        return result, engine.stats()

    result, stats = with_engine(body, policy="preserve", tool_deadline_s=1.0)
    assert not result.ok
    assert "'human' gave no answer within 1 s" in (result.error or "")
    assert result.turns == [result.turns[0]] and len(result.turns[0]) == 4
    assert stats["parked_requests"] == 0
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1


def test_cancelled_parked_session_frees_its_blocks(with_engine: Any) -> None:
    parked = ScriptedSession("p", tuple(range(30, 200)), (Step(4, "human", 60.0, 3), Step(2)))

    async def body(engine: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        task = asyncio.create_task(engine.run_scripted(parked))
        await asyncio.sleep(1.0)
        while_parked = engine.stats()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await engine.run_scripted(ScriptedSession("tick", (5, 6, 7), (Step(2),)))
        await asyncio.sleep(0.3)
        return while_parked, engine.stats()

    during, after = with_engine(body, policy="preserve")
    assert during["parked_requests"] == 1
    assert during["free_gpu_blocks"] < during["total_gpu_blocks"] - 1
    assert after["parked_requests"] == 0
    assert after["free_gpu_blocks"] == after["total_gpu_blocks"] - 1
