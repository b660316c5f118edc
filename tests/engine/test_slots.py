"""Parked sessions whose KV has left the GPU give their `max_num_seqs` slot back (vLLM counts
every parked session against it), and take one again when they resume: sessions waiting on
slow tools must not block admission, as they do not in the simulator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step

TOOL_S = 3.0


def _six_sessions(with_engine: Any, policy: str) -> tuple[list[Any], dict[str, Any]]:
    """Six sessions whose first call takes 3 s on an engine with max_num_seqs = 2: their
    results and the engine's stats."""
    work = [
        ScriptedSession(
            f"s{i}", tuple(range(10 + i, 50 + i)), (Step(4, "search", TOOL_S, 8), Step(4))
        )
        for i in range(6)
    ]

    async def run_all(engine: Any) -> tuple[list[Any], dict[str, Any]]:
        results = await asyncio.gather(*(engine.run_scripted(s) for s in work))
        await asyncio.sleep(0.3)
        return results, engine.stats()

    results, stats = with_engine(run_all, policy=policy, max_num_seqs=2)
    assert all(r.ok for r in results), [r.error for r in results]
    starts = sorted(r.first_token for r in results)
    assert starts[-1] - starts[0] < TOOL_S, starts  # nobody waited for another's tool
    return results, stats


@pytest.mark.engine
def test_sessions_parked_off_the_gpu_do_not_hold_slots(with_engine: Any) -> None:
    """`vllm` discards a parked session's KV at once, so every session should start before
    any tool answers; with the parked ones holding slots, four would wait for a resume."""
    _, stats = _six_sessions(with_engine, "vllm")
    assert stats["resumes"].get("recompute", 0) + stats["resumes"].get("prefix-cache", 0) == 6


@pytest.mark.engine
def test_interlude_frees_slots_that_parked_sessions_hold(with_engine: Any) -> None:
    """`interlude` keeps a parked session's KV on the GPU while memory is free; the slot rule
    (`policy/slots.py`, as in the simulator) moves the KV of sessions in their calls off the
    GPU when others wait for a slot, so every session starts before any tool answers."""
    _, stats = _six_sessions(with_engine, "interlude")
    assert sum(stats["resumes"].values()) == 6, stats["resumes"]
    assert stats["resumes"].get("preserve", 0) < 6, stats["resumes"]
