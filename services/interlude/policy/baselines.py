"""vLLM as it ships today, and the four baselines of the InferCept paper's Figure 2, all on a
vLLM-v0-style engine without a prefix cache (`vllm-v0` is the paper's `vllm`)."""

from __future__ import annotations

from interlude.policy.base import Policy, by_arrival
from interlude.policy.types import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
    RequestView,
    SchedulerView,
    SwapMode,
    Traits,
)

_V0 = Traits(batch_mode=BatchMode.PREFILL_FIRST, prefix_cache=False)


def _all_blocks(view: SchedulerView, handling: Handling) -> tuple[KVAction, ...]:
    p = view.profile
    return tuple(
        KVAction(r.request_id, handling, p.blocks(r.gpu_tokens))
        for r in view.paused
        if r.gpu_tokens > 0
    )


class VllmPolicy(Policy):
    name = "vllm"
    traits = Traits(batch_mode=BatchMode.V1)
    description = (
        "vLLM 0.32 as it ships: a tool call ends the request and the continuation re-enters at "
        "the queue's tail as a new request; chunked prefill, and the prefix cache finds what is "
        "left of its freed KV (it recomputes only what was evicted meanwhile)."
    )

    def decide(self, view: SchedulerView) -> Decision:
        return Decision(kv=_all_blocks(view, Handling.DISCARD))

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        # The continuation is a new request: it queues behind everything already waiting.
        return (req.queue_time,)


class VllmV0Policy(VllmPolicy):
    name = "vllm-v0"
    traits = _V0
    description = (
        "The InferCept paper's vllm (v0): a tool call ends the request, and the continuation "
        "re-enters at the queue's tail as a new request that recomputes its whole context at "
        "once (no prefix cache, prefill-first batching)."
    )


class ImprovedDiscardPolicy(Policy):
    name = "improved-discard"
    traits = _V0
    description = "Like vllm, but the continuation keeps its original arrival time in the queue."

    def decide(self, view: SchedulerView) -> Decision:
        return Decision(kv=_all_blocks(view, Handling.DISCARD))


class PreservePolicy(Policy):
    name = "preserve"
    traits = _V0
    description = "Paused requests keep their KV on the GPU for the whole call."

    def decide(self, view: SchedulerView) -> Decision:
        return Decision()


class SwapPolicy(Policy):
    name = "swap"
    traits = Traits(batch_mode=BatchMode.PREFILL_FIRST, swap_mode=SwapMode.SYNC, prefix_cache=False)
    description = (
        "Paused requests swap their whole context to host memory synchronously (the batch "
        "stalls for the copy) and back on resume; with host memory full they are discarded."
    )

    def decide(self, view: SchedulerView) -> Decision:
        p = view.profile
        free_cpu = view.free_cpu_blocks
        actions = []
        for r in sorted((r for r in view.paused if r.gpu_tokens > 0), key=by_arrival):
            blocks = p.blocks(r.gpu_tokens)
            if blocks <= free_cpu:
                free_cpu -= blocks
                actions.append(KVAction(r.request_id, Handling.SWAP, blocks))
            else:
                actions.append(KVAction(r.request_id, Handling.DISCARD, blocks))
        return Decision(kv=tuple(actions))
