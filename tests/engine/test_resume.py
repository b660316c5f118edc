"""Resume correctness on the real engine: the same tokens whatever happened to the KV."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step

pytestmark = pytest.mark.engine  # starts real vLLM engines


def make_sessions(n: int, delay_s: float = 0.3) -> list[ScriptedSession]:
    """`n` sessions of 3 segments, two tool calls each, prompts of ~100 tokens."""
    return [
        ScriptedSession(
            f"s{i}",
            tuple(range(20 + i, 120 + i)),
            (Step(8, "calculator", delay_s, 5), Step(6, "search", delay_s / 2, 40), Step(5)),
            kind="qa",
        )
        for i in range(n)
    ]


SESSIONS = make_sessions(6)


async def _run_all(engine: Any, resubmit: bool = False) -> tuple[list[Any], dict[str, Any]]:
    results = await asyncio.gather(*(engine.run_scripted(s, resubmit=resubmit) for s in SESSIONS))
    await asyncio.sleep(0.3)  # let one more engine step publish its counters
    return results, engine.stats()


@pytest.fixture(scope="module")
def reference(request: pytest.FixtureRequest) -> list[list[list[int]]]:
    """Tokens from stock vLLM, each segment resubmitted with its whole context."""
    with_engine = request.getfixturevalue("with_engine")
    results, _ = with_engine(lambda e: _run_all(e, resubmit=True), policy=None)
    assert all(r.ok for r in results)
    return [r.turns for r in results]


@pytest.mark.parametrize(
    ("policy", "resume_kind"),
    [("preserve", "preserve"), ("swap", "swap"), ("vllm", "prefix-cache")],
)
def test_same_tokens_after_resume(
    with_engine: Any, reference: list[list[list[int]]], policy: str, resume_kind: str
) -> None:
    results, stats = with_engine(_run_all, policy=policy)
    assert [r.turns for r in results] == reference
    assert [len(t) for t in results[0].turns] == [8, 6, 5]
    # Each policy really did what it is named for, on every one of the 12 resumes.
    assert stats["resumes"] == {resume_kind: 12}
    assert stats["interceptions"] == {"calculator": 6, "search": 6}
    # Nothing stays behind: no parked request, every block back in the pool, host pool empty.
    assert stats["parked_requests"] == 0
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1
    assert stats["host_slots_free"] == 64
    if policy == "swap":
        assert stats["swap_bytes"]["out"] > 0
        assert stats["swap_bytes"]["out"] % (2048 * 32) == 0  # whole blocks of the tiny model
    else:
        assert stats["swap_bytes"] == {"out": 0, "in": 0}


def test_lamps_rescoring_every_step_gives_the_same_tokens(
    with_engine: Any, reference: list[list[list[int]]]
) -> None:
    """`lamps` re-ranks the queues at every step with requests queued
    (`Traits.rescore_queued`); the engine has no trace, so it runs on its predictions."""
    results, stats = with_engine(_run_all, policy="lamps")
    assert [r.turns for r in results] == reference
    assert sum(stats["resumes"].values()) == 12
    assert stats["parked_requests"] == 0
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1


def test_discard_without_prefix_cache_recomputes(with_engine: Any) -> None:
    results, stats = with_engine(_run_all, policy="vllm", prefix_caching=False)
    assert all(r.ok for r in results)
    # Every discarded context is computed again: the prompt's 100, then the turn's 8 but its
    # last (sampled, with no KV at the pause; it comes back with the answer), then that last
    # token, the answer's 5 and 5 of the next turn's 6.
    frontiers = [100 + 7, 100 + 8 + 5 + 5]
    assert stats["recompute_tokens"]["discard"] == 6 * sum(frontiers)
    assert stats["resumes"] == {"recompute": 12}


@pytest.mark.parametrize(("policy", "resume_kind"), [("vllm", "recompute"), ("swap", "swap")])
def test_policy_acts_on_a_pause_that_leaves_the_engine_idle(
    with_engine: Any, policy: str, resume_kind: str
) -> None:
    """A lone session: when it parks nothing else runs, so vLLM would stop stepping and the
    policy would never see the pause. The scheduler keeps stepping until the policy settles."""
    lone = make_sessions(1, delay_s=0.5)[0]

    async def body(engine: Any) -> tuple[Any, dict[str, Any]]:
        result = await engine.run_scripted(lone)
        await asyncio.sleep(0.3)
        return result, engine.stats()

    result, stats = with_engine(body, policy=policy, prefix_caching=False)
    assert result.ok
    assert stats["resumes"] == {resume_kind: 2}
    if policy == "vllm":
        assert stats["recompute_tokens"]["discard"] == (100 + 7) + (100 + 8 + 5 + 5)
    else:
        assert stats["swap_bytes"]["in"] == stats["swap_bytes"]["out"] > 0
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1
    assert stats["host_slots_free"] == 64
