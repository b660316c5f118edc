"""Resumed sessions that kept their KV wait in vLLM's `kv_holding_waiting` for the blocks their
tool's answer needs. vLLM preempts only running requests, so when every block is held by such
sessions and none runs, no step makes progress: the simulator frees its lowest-priority
request then (`sim/batch.py`, `Batcher.form`), and the engine must do the same."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step


def resuming_together(n: int) -> list[ScriptedSession]:
    """`n` sessions of 100 prompt tokens that pause together and come back with 150 tokens."""
    return [
        ScriptedSession(
            f"s{i}",
            tuple(range(30 + i, 130 + i)),
            (Step(8, "calculator", 0.5, 150), Step(4)),
            kind="math",
        )
        for i in range(n)
    ]


@pytest.mark.engine
def test_sessions_resuming_into_a_full_pool_do_not_stall_the_engine(with_engine: Any) -> None:
    """16 blocks of 32 tokens, 15 usable: three sessions of 108 tokens hold 4 blocks each while
    their tool runs (`preserve`: no policy decision frees them first, as min-waste policies
    often would), then each needs 5 more for the answer with 3 free. Nothing runs, so nothing
    is preempted unless the engine frees one of them; without that, this test times out."""
    work = resuming_together(3)

    async def run_all(engine: Any) -> tuple[list[Any], dict[str, Any]]:
        runs = asyncio.gather(*(engine.run_scripted(s) for s in work))
        results = await asyncio.wait_for(runs, 60)
        await asyncio.sleep(0.3)  # one more engine step publishes the counters
        return results, engine.stats()

    results, stats = with_engine(run_all, policy="preserve", num_gpu_blocks=16)
    assert all(r.ok for r in results), [r.error for r in results]
    # The way out was freeing a waiting session that held KV, counted under its own reason.
    assert stats["recompute_tokens"].get("stall", 0) > 0
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1
