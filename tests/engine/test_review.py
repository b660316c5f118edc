"""`Decision.review_at` is honoured while the engine is idle: with only a parked session left,
vLLM would stop stepping, and a policy that meant to act later (a KV time-to-live, as in
Continuum) would never be asked again before the session resumed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlude.bench.scripted import ScriptedSession, Step
from interlude.policy import BatchMode, Decision, Handling, KVAction, Policy, SchedulerView, Traits

pytestmark = pytest.mark.engine  # starts a real vLLM engine

TTL_S = 0.3


class DiscardAfterTtl(Policy):
    """Keeps a paused request's KV for `TTL_S`, then discards it."""

    name = "discard-after-ttl"
    traits = Traits(batch_mode=BatchMode.CHUNKED)
    description = "test: a KV time-to-live"

    def decide(self, view: SchedulerView) -> Decision:
        kv, review = [], None
        for r in view.paused:
            if r.gpu_tokens == 0 or r.paused_at is None:
                continue
            due = r.paused_at + TTL_S
            if view.now >= due:
                kv.append(
                    KVAction(r.request_id, Handling.DISCARD, view.profile.blocks(r.gpu_tokens))
                )
            else:
                review = due if review is None else min(review, due)
        return Decision(kv=tuple(kv), review_at=review)


def test_a_review_time_is_kept_while_the_engine_is_idle(with_engine: Any) -> None:
    lone = ScriptedSession("s", tuple(range(10, 110)), (Step(8, "calculator", 1.5, 5), Step(5)))

    async def body(engine: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        run = asyncio.create_task(engine.run_scripted(lone))
        await asyncio.sleep(1.0)  # parked at about 0.1 s; its TTL ran out at about 0.4 s
        during = dict(engine.stats())
        result = await run
        await asyncio.sleep(0.3)
        return result, during, engine.stats()

    result, during, after = with_engine(
        body, policy=f"{__name__}:DiscardAfterTtl", prefix_caching=False
    )
    assert result.ok
    # Discarded during the call, with nothing else running, not kept until the resume.
    assert during["parked_requests"] == 1 and during["paused"]["discard"] == 1
    assert during["free_gpu_blocks"] == during["total_gpu_blocks"] - 1
    assert after["resumes"] == {"recompute": 1}
    assert after["recompute_tokens"]["discard"] == 100 + 7
