"""Swaps on the real engine, beyond whole ones: a partial swap gives back the blocks it copied
after the step that copied them (as the simulator frees them), blocks shared through the prefix
cache are not copied, and either way the session's tokens come out the same."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step
from interlude.policy import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
    Policy,
    SchedulerView,
    SwapMode,
    Traits,
    load_profile,
)
from interlude.policy.base import swap_out_budget_blocks

pytestmark = pytest.mark.engine  # starts real vLLM engines

BLOCK_BYTES = 2048 * 32  # the tiny model's KV bytes per block (see test_resume)


class SwapTwoBlocks(Policy):
    """Swaps two blocks of each paused request once, and keeps the rest on the GPU."""

    name = "swap-two-blocks"
    traits = Traits(batch_mode=BatchMode.CHUNKED, swap_mode=SwapMode.BUDGETED)
    description = "test: swap two blocks of each pause, once"

    def __init__(self, profile: Any) -> None:
        super().__init__(profile)
        self.done: set[str] = set()

    def decide(self, view: SchedulerView) -> Decision:
        todo = [r for r in view.paused if r.gpu_tokens > 0 and r.request_id not in self.done]
        self.done.update(r.request_id for r in todo)
        return Decision(kv=tuple(KVAction(r.request_id, Handling.SWAP, 2) for r in todo))


def session(name: str, delay_s: float) -> ScriptedSession:
    # 200 prompt tokens + 7 kept: 7 blocks of 32 at the pause.
    return ScriptedSession(
        name, tuple(range(10, 210)), (Step(8, "calculator", delay_s, 5), Step(5)), kind="qa"
    )


async def _parked_stats(engine: Any, n: int) -> dict[str, Any]:
    """The engine's counters once `n` sessions are parked and the policy has settled."""
    for _ in range(200):
        await asyncio.sleep(0.05)
        stats = engine.stats()
        if stats.get("parked_requests") == n:
            await asyncio.sleep(0.3)  # a few more steps: the frees after the copy
            return dict(engine.stats())
    raise AssertionError(f"never saw {n} parked sessions: {engine.stats()}")


def test_a_partial_swap_frees_what_it_copied_and_resumes_right(with_engine: Any) -> None:
    async def body(engine: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        run = asyncio.create_task(engine.run_scripted(session("s", 2.0)))
        during = await _parked_stats(engine, 1)
        result = await run
        await asyncio.sleep(0.3)
        return result, during, engine.stats()

    policy = f"{__name__}:SwapTwoBlocks"
    result, during, after = with_engine(body, policy=policy, prefix_caching=False)
    reference, _, _ = with_engine(body, policy="preserve", prefix_caching=False)
    assert result.ok and result.turns == reference.turns
    # Mid-pause: two of its seven blocks are on the host and no longer on the GPU.
    assert during["paused"]["swapping"] == 1
    assert during["swap_bytes"]["out"] == 2 * BLOCK_BYTES
    assert during["free_gpu_blocks"] == during["total_gpu_blocks"] - 1 - (7 - 2)
    # Resumed from the host copy, loaded back under the five blocks that stayed on the GPU
    # (none of them recomputed), then nothing left behind.
    assert after["resumes"] == {"swap": 1}
    # Its wait from the tool's answer to its first step: counted once, under the swap.
    assert after["resume_waits"] == {"swap": 1}
    assert 0 < after["resume_wait_s"]["swap"] < 2.0
    assert after["steps"] > 0 and 0 < after["vllm_s"] < after["step_s"]
    assert after["swap_bytes"]["in"] == 2 * BLOCK_BYTES
    assert after["recompute_tokens"]["discard"] == 0
    assert after["free_gpu_blocks"] == after["total_gpu_blocks"] - 1
    assert after["host_slots_free"] == 64


def test_blocks_shared_through_the_prefix_cache_are_not_copied(with_engine: Any) -> None:
    async def body(engine: Any) -> tuple[list[Any], dict[str, Any]]:
        runs = [engine.run_scripted(session(f"s{i}", 1.0)) for i in range(2)]
        results = await asyncio.gather(*runs)
        await asyncio.sleep(0.3)
        return results, engine.stats()

    results, stats = with_engine(body, policy="swap")
    reference, _ = with_engine(body, policy="preserve")
    assert all(r.ok for r in results)
    assert [r.turns for r in results] == [r.turns for r in reference]
    # Both hold the same 6 full prompt blocks while both are parked: whoever swaps first leaves
    # them to the prefix cache, so fewer than the 2 x 7 blocks a blind swap copies go out.
    out_blocks = stats["swap_bytes"]["out"] // BLOCK_BYTES
    assert 2 <= out_blocks <= 8
    assert stats["resumes"] == {"swap": 2}
    assert stats["prefix_restored_tokens"] >= 6 * 32
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1
    assert stats["host_slots_free"] == 64


class SwapWhole(Policy):
    """Swaps every paused request's blocks out, within each step's budget."""

    name = "swap-whole"
    traits = Traits(batch_mode=BatchMode.CHUNKED, swap_mode=SwapMode.BUDGETED)
    description = "test: swap all of each pause, budgeted"

    def decide(self, view: SchedulerView) -> Decision:
        room = swap_out_budget_blocks(view)
        kv = []
        for r in view.paused:
            blocks = -(-r.gpu_tokens // view.profile.block_size)
            if blocks and room:
                kv.append(KVAction(r.request_id, Handling.SWAP, min(blocks, room)))
                room -= kv[-1].blocks
        return Decision(kv=tuple(kv))


def test_a_copy_comes_back_over_several_steps_and_resumes_right(
    with_engine: Any, tmp_path: Any
) -> None:
    # A host link so slow that a step may copy one block: the seven-block copy comes back in
    # seven steps (vLLM waits in WAITING_FOR_REMOTE_KVS), not in one step that holds the batch.
    slow = dataclasses.replace(load_profile("tiny-llama-cpu"), swap_bandwidth_bps=1.0)
    path = tmp_path / "slow-link.json"
    path.write_text(slow.to_json())

    async def body(engine: Any) -> tuple[Any, dict[str, Any]]:
        result = await engine.run_scripted(session("s", 1.0))
        await asyncio.sleep(0.3)
        return result, engine.stats()

    policy = f"{__name__}:SwapWhole"
    result, stats = with_engine(body, policy=policy, prefix_caching=False, profile=str(path))
    reference, _ = with_engine(body, policy="preserve", prefix_caching=False)
    assert result.ok and result.turns == reference.turns
    assert stats["resumes"] == {"swap": 1}
    assert stats["swap_bytes"] == {"out": 7 * BLOCK_BYTES, "in": 7 * BLOCK_BYTES}
    assert stats["swap_in_steps"] == 7
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1
    assert stats["host_slots_free"] == 64
