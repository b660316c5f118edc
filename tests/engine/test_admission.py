"""`Decision.hold` on the vLLM side: held requests are out of vLLM's reach for a step and come
back in place (no engine for the queue test; a real engine for ThunderAgent's admission)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.bench.scripted import ScriptedSession, Step
from interlude.enginecore.policy_queue import PolicyQueue, held_ids
from interlude.policy import Decision


def make_request(rid: str) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=4), None)


def test_set_aside_requests_are_skipped_then_keep_their_place() -> None:
    keys = {"a": 1.0, "b": 2.0, "c": 3.0}
    asked: list[str] = []

    def key(r: Request) -> tuple[float, ...]:
        asked.append(r.request_id)
        return (keys[r.request_id],)

    q = PolicyQueue(key)
    for rid in "abc":
        q.add_request(make_request(rid))
    held = q.set_aside({"a", "nobody"})
    assert [e[2].request_id for e in held] == ["a"]
    # vLLM sees b first, and a is not in the queue while it is held.
    assert q.peek_request().request_id == "b" and len(q) == 2
    assert [r.request_id for r in q] == ["b", "c"]
    assert q.set_aside({"a"}) == []  # not there any more: nothing to hold
    q.put_back(held)
    # Back at the head with its old key, not asked again.
    assert [r.request_id for r in q] == ["a", "b", "c"]
    assert asked == ["a", "b", "c"]
    assert q.pop_request().request_id == "a"


def test_held_ids_follow_hold_and_admit_limit_in_queue_order(
    fake_request: Callable[..., Any],
) -> None:
    waiting = [fake_request(rid, pending=64) for rid in "abcd"]
    assert held_ids(Decision(), waiting) == set()
    assert held_ids(Decision(hold=frozenset({"b", "gone"})), waiting) == {"b"}
    # The limit counts from the head past the held ones: a and c may enter, d waits.
    both = Decision(hold=frozenset({"b"}), admit_limit=2)
    assert held_ids(both, waiting) == {"b", "d"}
    assert held_ids(Decision(admit_limit=0), waiting) == set("abcd")
    assert held_ids(Decision(admit_limit=9), waiting) == set()
    # A resumed session that kept its KV is not counted and never held by the limit.
    resumed = fake_request("r", gpu=96, pending=8)
    assert held_ids(Decision(admit_limit=1), [resumed, *waiting]) == set("bcd")
    assert held_ids(Decision(hold=frozenset("r"), admit_limit=9), [resumed, *waiting]) == {"r"}


def sessions(n: int) -> list[ScriptedSession]:
    """`n` sessions of ~100 prompt tokens and two short calls each."""
    return [
        ScriptedSession(
            f"s{i}",
            tuple(range(20 + i, 120 + i)),
            (Step(8, "calculator", 0.3, 5), Step(6, "search", 0.15, 40), Step(5)),
            kind="qa",
        )
        for i in range(n)
    ]


@pytest.mark.engine
def test_thunderagent_holds_programs_that_do_not_fit_and_tokens_are_unchanged(
    with_engine: Any,
) -> None:
    """40 blocks of 32 = 1,280 tokens. ThunderAgent lets a program in while the live programs'
    tokens plus 100 each fit: six of ~100 tokens take 1,200; the seventh and eighth are held
    until memory frees (then resumed), and every session still gets stock vLLM's tokens."""
    work = sessions(8)

    async def run_all(engine: Any, resubmit: bool) -> tuple[list[Any], dict[str, Any]]:
        results = await asyncio.gather(*(engine.run_scripted(s, resubmit=resubmit) for s in work))
        await asyncio.sleep(0.3)  # one more engine step publishes the counters
        return results, engine.stats()

    reference, _ = with_engine(lambda e: run_all(e, True), policy=None)
    results, stats = with_engine(lambda e: run_all(e, False), policy="thunderagent")
    assert all(r.ok for r in results)
    assert [r.turns for r in results] == [r.turns for r in reference]
    assert stats["held_request_steps"] > 0
    # The hold took effect: the seventh program started only after one had finished (without
    # it all eight start at once: their 8 x 4 blocks fit the 39 usable).
    starts = sorted(r.first_token for r in results)
    assert starts[6] > min(r.end for r in results)
    assert starts[5] < min(r.end for r in results)  # the first six ran side by side
    assert stats["parked_requests"] == 0
    assert stats["free_gpu_blocks"] == stats["total_gpu_blocks"] - 1
