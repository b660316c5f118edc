"""The engine and the simulator agree on what a discarded or swapped-out request finds in the
prefix cache: its leading blocks when nothing took them while it was paused, nothing when
another request did. The same conversations run on a real vLLM engine (prefix caching on) and
in the simulator with the engine's blocks (`sim/prefix_cache.py`): discarded by `vllm`, and
swapped out whole by `CachedSwap`, which then loads from host only what the cache lost. And
on what prompts opening with the same head find: the head's whole blocks, computed once
(`sim/shared_heads.py`)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step
from interlude.policy import load_profile, make_policy
from interlude.policy.baselines import SwapPolicy
from interlude.policy.types import BatchMode, SwapMode, Traits
from interlude.sim.config import SimConfig
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceCall, TraceRequest

pytestmark = pytest.mark.engine  # starts real vLLM engines

BLOCKS = 16  # the engine's KV blocks; vLLM keeps one as its null block
BS = 32
PROMPT = tuple(range(20, 120))  # 100 tokens: 3 whole blocks and a part
# A prompt sharing no block with PROMPT, of 14 of the 15 blocks: it does not fit beside the
# first conversation (4 blocks), only once that one's KV is dropped at its call.
BIG = tuple(300 + (i * 7) % 200 for i in range(440))
BIG_GEN = 30  # its growth past 448 tokens takes the 15th block
BLOCK_BYTES = 2048 * BS  # the tiny model's KV bytes per block (see test_resume)
HEAD = tuple(range(400, 470))  # 70 tokens every session of a group opens with: 2 whole blocks


class CachedSwap(SwapPolicy):
    """`swap` (every pause copied to host whole, at once) on an engine with the prefix cache."""

    name = "cached-swap"
    traits = Traits(batch_mode=BatchMode.PREFILL_FIRST, swap_mode=SwapMode.SYNC)
    description = "test: swap whole at the pause, prefix cache on"


def engine_run(
    with_engine: Any, sessions: list[tuple[float, ScriptedSession]], policy: str = "vllm"
) -> dict[str, Any]:
    async def body(engine: Any) -> dict[str, Any]:
        async def start(delay: float, s: ScriptedSession) -> Any:
            await asyncio.sleep(delay)
            return await engine.run_scripted(s)

        results = await asyncio.gather(*(start(d, s) for d, s in sessions))
        assert all(r.ok for r in results)
        await asyncio.sleep(0.3)  # one more step publishes the counters
        stats: dict[str, Any] = engine.stats()
        return stats

    stats: dict[str, Any] = with_engine(body, policy=policy, num_gpu_blocks=BLOCKS)
    return stats


def sim_run(
    sessions: list[tuple[float, ScriptedSession]], policy: str = "vllm", head: int = 0
) -> Any:
    base = load_profile("tiny-llama-cpu")
    usable = BLOCKS - 1
    p = dataclasses.replace(base, gpu_kv_bytes=usable * BS * base.kv_bytes_per_token)
    arrivals = [
        Arrival(at, trace(s, head), f"{i}:{s.session_id}") for i, (at, s) in enumerate(sessions)
    ]
    sim = Simulator(p, make_policy(policy, p), arrivals, SimConfig(check_integrity=True))
    return sim.run()


def trace(s: ScriptedSession, head: int = 0) -> TraceRequest:
    """`s` as the simulator's request; its first `head` tokens shared with the other sessions."""
    segments = tuple(
        Segment(step.gen_tokens, call(step.tool, step.delay_s, step.return_tokens))
        for step in s.steps
    )
    group = "head" if head else ""
    return TraceRequest(s.session_id, s.kind, len(s.prompt_token_ids), segments, head, group)


def call(tool: str | None, delay_s: float, answer: int) -> TraceCall | None:
    return None if tool is None else TraceCall(tool, delay_s, answer)


@pytest.mark.parametrize(
    ("crowded", "via", "found"),
    [(False, "prefix-cache", 3 * BS), (True, "recompute", 0)],
)
def test_the_engine_and_the_simulator_find_the_same_blocks(
    with_engine: Any, crowded: bool, via: str, found: int
) -> None:
    paused = ScriptedSession("s0", PROMPT, (Step(8, "calculator", 0.4, 5), Step(5)))
    sessions = [(0.0, paused)]
    if crowded:
        sessions.append((0.05, ScriptedSession("s1", BIG, (Step(BIG_GEN),))))
    stats = engine_run(with_engine, sessions)
    m = sim_run(sessions)
    assert stats["resumes"] == {via: 1}
    assert stats["prefix_restored_tokens"] == m.prefix_hit_tokens == found
    # The simulator counts the KV of the token sampled at the pause as computed (it holds its
    # slot); the engine computes it with the next step, so it recomputes one token less.
    assert stats["recompute_tokens"]["discard"] == m.recomputed_tokens - 1
    assert m.recomputed_tokens + m.prefix_hit_tokens == len(PROMPT) + 8


@pytest.mark.parametrize(("crowded", "found"), [(False, 3 * BS), (True, 0)])
def test_a_whole_swap_loads_only_what_the_cache_lost(
    with_engine: Any, crowded: bool, found: int
) -> None:
    paused = ScriptedSession("s0", PROMPT, (Step(8, "calculator", 0.4, 5), Step(5)))
    sessions = [(0.0, paused)]
    if crowded:
        sessions.append((0.05, ScriptedSession("s1", BIG, (Step(BIG_GEN),))))
    policy = f"{__name__}:CachedSwap"
    stats = engine_run(with_engine, sessions, policy)
    m = sim_run(sessions, policy)
    assert stats["resumes"] == {"swap": 1}
    assert stats["prefix_restored_tokens"] == m.prefix_hit_tokens == found
    # Out: the 4 blocks of its 108 tokens; in: what the cache lost of them.
    out, back = len(PROMPT) + 8, len(PROMPT) + 8 - found
    assert stats["swap_bytes"] == {"out": 4 * BLOCK_BYTES, "in": -(-back // BS) * BLOCK_BYTES}
    assert m.swapped_tokens == out + back


def test_prompts_opening_alike_find_the_heads_whole_blocks(with_engine: Any) -> None:
    """Three prompts open with the same 70 tokens, one after another: the first computes
    them, the next two find the 2 whole blocks (the rest of the head is in a block of their
    own), on the engine and in the simulator."""
    sessions = [
        (
            0.3 * i,
            ScriptedSession(f"h{i}", HEAD + tuple(20 + 9 * i + j for j in range(40)), (Step(8),)),
        )
        for i in range(3)
    ]
    stats = engine_run(with_engine, sessions)
    m = sim_run(sessions, head=len(HEAD))
    assert stats["prompt_tokens"]["local_cache_hit"] == m.shared_head_tokens == 2 * 2 * BS
    assert m.finished == 3
