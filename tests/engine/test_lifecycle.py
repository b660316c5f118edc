"""Deadlines and cancellation leave nothing parked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step

pytestmark = pytest.mark.engine  # starts real vLLM engines


@pytest.mark.parametrize("resubmit", [False, True])
def test_tool_deadline_ends_the_session_with_an_error(with_engine: Any, resubmit: bool) -> None:
    """Streamed or resubmitted, a tool past the deadline ends the session with one error."""
    slow = ScriptedSession("slow", tuple(range(30, 90)), (Step(4, "human", 30.0, 3), Step(2)))

    async def body(engine: Any) -> tuple[Any, dict[str, Any]]:
        result = await engine.run_scripted(slow, resubmit=resubmit)
        await asyncio.sleep(0.3)
        return result, engine.stats()

    result, stats = with_engine(body, policy="preserve", tool_deadline_s=1.0)
    assert not result.ok
    assert "no results for tool call(s) human within 1 s" in (result.error or "")
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


def test_contended_waste_counts_only_time_others_waited(with_engine: Any) -> None:
    """Raw KV waste is what paused requests hold; the contended part only while others queued.

    `held` (32 of the 39 blocks) parks for 3 s. Alone it holds memory nobody asks for: raw
    waste grows, contended waste does not (not even for the idle span before the next arrival).
    Then `big` needs 10 blocks with 7 free and queues until `held` resumes: that is contended.
    """
    held = ScriptedSession(
        "held", tuple(30 + i % 400 for i in range(1000)), (Step(4, "human", 3.0, 3), Step(2))
    )
    # Other tokens than `held`'s, so the prefix cache shares no block with it.
    big = ScriptedSession("big", tuple(16 + (i * 7) % 400 for i in range(300)), (Step(2),))

    async def body(engine: Any) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
        parked = asyncio.create_task(engine.run_scripted(held))
        await asyncio.sleep(1.5)
        # A short request makes the engine step again, which accounts the idle span.
        await engine.run_scripted(ScriptedSession("tick", (5, 6, 7), (Step(2),)))
        await asyncio.sleep(0.3)
        alone = engine.stats()
        results = await asyncio.gather(parked, engine.run_scripted(big))
        await asyncio.sleep(0.3)
        return alone, engine.stats(), results

    alone, after, results = with_engine(body, policy="preserve")
    assert all(r.ok for r in results)
    held_gb = 32 * 32 * 2048 / 1e9  # 32 blocks of 32 tokens x the tiny model's 2048 B/token
    # Held from the pause (after a prefill of 1000 tokens) until `tick`, 1.5 s after the start.
    assert alone["waste_gb_s"] >= held_gb * 0.8
    assert alone["waste_contended_gb_s"] == 0.0
    # `big` queued from ~1.8 s to `held`'s resume at ~3 s: contended, and part of the raw waste.
    assert held_gb * 0.8 <= after["waste_contended_gb_s"] <= after["waste_gb_s"]
    # The resume found `held`'s whole context (prompt + kept output) still on the GPU.
    assert after["resumed_tokens"] == 1000 + 4 - 1
    assert after["resumes"] == {"preserve": 1}
