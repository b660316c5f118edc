"""Decodes before prefill chunks on vLLM's real scheduler (no model: the test feeds the sampled
tokens): a running request's prefill chunk that the policy ranks first takes only the token
budget and the blocks that the decodes behind it leave, and is cut to the free blocks rather
than preempting anyone (`enginecore/decode_room`, the simulator's rule in `sim/batch.py`).

The scenario: 39 usable blocks of 32 tokens, a budget of 512 tokens a step; four short
requests (32-token prompts, one block each) decode, and a long one (1,119 tokens, 35 blocks,
its whole sequence fitting at admission) prefills in chunks of at most 512. vLLM schedules in
the running list's order, which is the policy's ranking, and the test's policy ranks the
long request first. Without the cuts its second chunk takes the whole budget (the decodes skip
the step) and its third needs 7 blocks where 3 are free: vLLM preempts two decodes for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.enginecore.decode_room import DecodeRoom
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.types import RequestView

SHORT, LONG = 32, 35 * 32 - 1


class PrefillFirst(InterludePolicy):
    """`interlude`, except that the running request with the most tokens left to prefill is
    its last victim (so vLLM's running list starts with it)."""

    def preemption_order(self, running: Sequence[RequestView]) -> list[RequestView]:
        return sorted(running, key=lambda v: v.pending_tokens)


def request(s: Any, rid: str, start: int, n: int, max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    tokens = list(range(start, start + n))
    return Request(rid, tokens, params, None, block_hasher=s.test_hasher)


def run(s: Any) -> list[Any]:
    """The scenario until every request finished; vLLM's output of each step."""
    s.ipolicy = PrefillFirst(s.profile)
    for i in range(4):
        s.add_request(request(s, f"short{i}", 1000 + 100 * i, SHORT, max_tokens=12))
    s.add_request(request(s, "long", 5000, LONG, max_tokens=2))
    outs = []
    while s.requests and len(outs) < 100:
        outs.append(s.test_step())
    assert not s.requests, "the scenario did not finish"
    return outs


def test_a_ranked_prefill_chunk_leaves_the_decodes_their_share(real_scheduler: Any) -> None:
    s = real_scheduler
    assert (s.block_size, s.scheduler_config.long_prefill_token_threshold) == (32, 512)
    outs = run(s)
    decodes = {f"short{i}": 1 for i in range(4)}
    assert outs[0].num_scheduled_tokens == {**{f"short{i}": SHORT for i in range(4)}, "long": 384}
    # The budget less the four decodes' tokens.
    assert outs[1].num_scheduled_tokens == {**decodes, "long": 508}
    # 892 tokens in 28 blocks, 3 free: 100 more fit, of the 227 left.
    assert outs[2].num_scheduled_tokens == {**decodes, "long": 100}
    assert s.lot.counters.recompute_tokens.get("preempt", 0) == 0
    assert not any(o.preempted_req_ids for o in outs)


def test_vllm_s_own_order_preempts_the_decodes(real_scheduler: Any, monkeypatch: Any) -> None:
    # The same scenario without the cuts: what the engine did before them (and what stock
    # vLLM does when its list puts a prefill first).
    monkeypatch.setattr(DecodeRoom, "cap", lambda self, request, n, running: n)
    s = real_scheduler
    outs = run(s)
    assert outs[1].num_scheduled_tokens == {"long": 512}
    assert outs[2].num_scheduled_tokens["long"] == 1119 - 896
    assert len(outs[2].preempted_req_ids or ()) == 2
    assert s.lot.counters.recompute_tokens.get("preempt", 0) > 0


def test_requests_that_are_not_running_are_left_alone(real_scheduler: Any) -> None:
    s = real_scheduler
    room = DecodeRoom(s.kv_cache_manager, s.block_size)
    room.begin_step(0)  # no budget left, yet an admission is vLLM's to size
    assert room.cap(request(s, "w", 0, 100, max_tokens=1), 100, []) == 100
