"""Where paused KV moves in the simulator: a policy's KV actions at a pause, and the copies back
from host memory when the call returns, under the rules the engine's vLLM applies.

The engine (`enginecore/swap.py`, `HostSwapConnector`) loads a host copy whole, as a
synchronous connector hit at the request's admission, and admits the requests that hold one
ahead of all others (`enginecore/scheduler.py:_ranked`). So, per iteration, in queue order:

* a swap-in starts only when its whole sequence (the copy and the tokens the call added) fits
  the free blocks, and vLLM's waiting loop stops at the first request it cannot allocate: nobody
  is admitted behind it (`SwapIns.reserve`);
* the iteration's first swap-in goes whole even past the swap budget (one longer iteration: the
  simulator's budgeted iteration lasts max(T_fwd, T_swap(moved))); a later one that would pass
  the budget waits for the next iteration and is passed over, so a smaller copy behind it, and
  new requests, may still go (the connector answers None and vLLM skips the request).
"""

from __future__ import annotations

from dataclasses import dataclass

from interlude.policy.base import Policy, PolicyError, swap_out_budget_blocks
from interlude.policy.profile import Profile
from interlude.policy.types import Decision, Handling, Phase, SchedulerView, SwapMode
from interlude.sim.kv import KVBook, OutOfBlocks
from interlude.sim.queue import RankedQueue
from interlude.sim.request import SimRequest
from interlude.sim.running import Running


@dataclass(frozen=True)
class Moved:
    """What an iteration's copies between the GPU and host memory cost."""

    # Tokens copied within the swap budget (BUDGETED policies): they overlap the forward pass,
    # which then lasts at least T_swap of them.
    tokens: int
    # Seconds the batch stands still for copies (SYNC policies, which copy whole and at once).
    stall_s: float


@dataclass(frozen=True)
class SwapIns(Moved):
    """An iteration's swap-ins, and what they leave to the admissions after them."""

    # Free blocks admissions must leave alone: the whole sequence of the first swap-in that
    # could not be allocated (more than are free: vLLM admits nobody behind it), else 0.
    reserve: int


def apply_kv(
    d: Decision, view: SchedulerView, paused: dict[str, SimRequest], kv: KVBook, policy: Policy
) -> Moved:
    """Apply the decision's KV actions to paused requests (drops and copies out).

    Raises `PolicyError` for an action on a request that is not paused, a copy beyond host
    memory, or budgeted copies beyond what the iteration's swap budget leaves after swap-ins.
    """
    out_blocks = out_tokens = 0
    for a in d.kv:
        r = paused.get(a.request_id)
        if r is None:
            raise PolicyError(f"{policy.name}: KV action for non-paused {a.request_id}")
        if a.handling is Handling.DISCARD:
            dropped = kv.drop_gpu(r, a.blocks)
            r.pending_tokens += dropped
            r.recompute_left += dropped
            continue
        before = kv.blocks(r.gpu_tokens)
        n = r.gpu_tokens if a.blocks >= before else a.blocks * kv.bs
        try:
            kv.set_cpu(r, r.cpu_tokens + n)
        except OutOfBlocks as exc:
            raise PolicyError(f"{policy.name}: swap beyond host memory: {exc}") from exc
        kv.set_gpu(r, r.gpu_tokens - n)
        out_blocks += before - kv.blocks(r.gpu_tokens)
        out_tokens += n
        r.swapped_tokens += n
    if policy.traits.swap_mode is SwapMode.SYNC:
        return Moved(0, view.profile.t_swap(out_tokens))
    allowed = swap_out_budget_blocks(view)
    if out_blocks > allowed:
        raise PolicyError(
            f"{policy.name}: swapped out {out_blocks} blocks, budget allows {allowed}"
        )
    return Moved(out_tokens, 0.0)


def swap_in(
    queue: RankedQueue, running: Running, kv: KVBook, profile: Profile, budget: int, sync: bool
) -> SwapIns:
    """Bring host copies back for the resumed requests of `queue`, in its order (the module's
    rules); those brought back leave the queue and run. `sync`: the policy copies whole and
    stalls the batch (no budget)."""
    moved = reserve = 0
    back: list[SimRequest] = []
    for r in queue:
        if len(running) >= profile.max_num_seqs:
            break
        if not sync and moved and moved + r.cpu_tokens > budget:
            continue  # past the budget: the next iteration's (a smaller copy may go now)
        need = kv.grow_cost(r, r.cpu_tokens + r.pending_tokens)
        if need > kv.gpu_free:
            reserve = need
            break
        n = r.cpu_tokens
        kv.set_cpu(r, 0)
        kv.set_gpu(r, r.gpu_tokens + n)
        r.swapped_tokens += n
        moved += n
        r.phase = Phase.RUNNING
        running.add(r, prefilling=r.pending_tokens > 0)
        back.append(r)
    if back and back[-1] is queue.items[len(back) - 1]:
        queue.pop_front(len(back))  # none passed over: they were the queue's head
    else:
        for r in back:
            queue.remove(r)
    if sync:
        return SwapIns(0, profile.t_swap(moved), reserve)
    return SwapIns(moved, 0.0, reserve)
