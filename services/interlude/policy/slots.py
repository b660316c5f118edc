"""Slot pressure: parked sessions that hold `max_num_seqs` slots while requests wait for one.

vLLM counts a parked session whose KV stayed on the GPU against `max_num_seqs`, and so does
the simulator (`Simulator._parked_slots`); one whose KV has left the GPU holds no slot. When
the KV space is large against the sessions' contexts (Llama-3-8B on an H100: about 449k
tokens, the shared trace's contexts about a thousand), the slots run out before the memory
does: 256 sessions in their calls hold every slot, no memory pressure shows, and new
requests wait for a call to end. On the shared trace at 8 req/s, 300 s, `interlude` without
this rule had a mean TTFT of 51.6 s against vLLM's 0.03 (docs/policies.md).

The rule: while waiting requests cannot all get a slot, the parked sessions that would hold
theirs longest (the longest expected time left in the call) give it up, as many as the
deficit. Their KV goes to host memory, as much as the swap link takes each iteration (a
slot is free once its copy ends); only a context the host cannot hold is discarded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from interlude.policy.base import call_key, paused_on_gpu
from interlude.policy.types import Handling, KVAction, RequestView, SchedulerView


def slot_deficit(view: SchedulerView, parked_holders: int) -> int:
    """Slots the queues want beyond the free ones (0 when they all fit): a waiting request
    and a swap-in each take one; running requests and `parked_holders` hold theirs."""
    free = view.profile.max_num_seqs - len(view.running) - parked_holders
    return max(0, len(view.waiting) + len(view.swap_queue) - max(0, free))


def slot_releases(
    holders: Sequence[RequestView], deficit: int, remaining: Callable[[RequestView], float]
) -> list[RequestView]:
    """The `deficit` holders (or all) with the most expected time left in their calls,
    longest first; ties to the earliest arrival."""
    if deficit <= 0:
        return []
    ranked = sorted(holders, key=lambda r: (-remaining(r), r.arrival))
    return ranked[:deficit]


def free_slots(
    view: SchedulerView,
    actions: tuple[KVAction, ...],
    remaining: Callable[[str, float], float],
    budget: int,
) -> tuple[KVAction, ...]:
    """`actions` (a policy's for this iteration), plus a swap (a discard when the host cannot
    hold it) of each parked session that gives up its slot to a waiting request, within
    `budget` (this iteration's swap-out blocks); `remaining(call key, elapsed)`: the expected
    time left in a call (`Predictor.remaining_duration`). For iterations without memory
    pressure: there the queues fit the free blocks and the slots alone can keep them waiting.
    O(1) while every KV holder's slot fits."""
    p = view.profile
    held = view.paused if view.paused_with_kv is None else view.paused_with_kv
    queued = len(view.waiting) + len(view.swap_queue)
    if not queued or len(view.running) + queued + len(held) <= p.max_num_seqs:
        return actions
    moved = {a.request_id: a.blocks for a in actions}
    holders, kept = [], 0
    for r in paused_on_gpu(view):
        n = moved.get(r.request_id)
        if n is None:
            holders.append(r)
        elif n < p.blocks(r.gpu_tokens):
            kept += 1  # a partial swap: its slot is held until the copy ends
    now = view.now

    def call_left(r: RequestView) -> float:
        return remaining(call_key(r), 0.0 if r.paused_at is None else now - r.paused_at)

    gone = slot_releases(holders, slot_deficit(view, len(holders) + kept), call_left)
    # The link and the host take what they can, longest calls first; the rest waits for the
    # next iterations' budgets (its slot stays held until its copy ends). A discard only when
    # host memory cannot take the context at all: under load the prefix cache loses a
    # discarded context before its call ends (at 24 req/s on llama3-8b-h100, 1800 s,
    # discarding what one iteration's budget did not take recomputed 5.4M tokens, p99 224
    # against 24 ms/token).
    swapped = sum(a.blocks for a in actions if a.handling is Handling.SWAP)
    budget, host = budget - swapped, view.free_cpu_blocks - swapped
    out = list(actions)
    for r in gone:
        n = p.blocks(r.gpu_tokens)
        if n > host:
            out.append(KVAction(r.request_id, Handling.DISCARD, n))
        elif budget > 0:
            m = min(n, budget)
            budget, host = budget - m, host - m
            out.append(KVAction(r.request_id, Handling.SWAP, m))
    return tuple(out)
