"""Where paused KV moves in the simulator: a policy's KV actions at a pause, and the copies back
from host memory when the call returns, under the rules the engine's vLLM applies.

The engine (`enginecore/swap.py`, `HostSwapConnector`) brings a budgeted policy's host copy back
as an asynchronous load, spread over steps, and ranks the requests that hold one ahead of all
others (`enginecore/policy_queue.py:ranked`). So, per iteration (`swap_in`):

1. Loads whose last block was copied in an earlier iteration join the running batch, in the
   order they started (vLLM drains the requests holding KV first), while there is a sequence
   slot and the rest of their sequence fits the free blocks; the first that does not fit stops
   every admission behind it (vLLM's waiting loop breaks there) and reserves its room.
2. Then, in queue order, a resumed request with a host copy starts its load when its whole
   sequence (the copy and the tokens the call added) fits the free blocks: the copy's blocks are
   allocated at once (`Loads.reserved` holds them until it joins the batch); the first that does
   not fit stops the queue as in 1. A request swapped out whole first takes what vLLM's prefix
   cache still holds of it (the engine freed it whole after the copy, and its connector offers
   only the tokens past the cache's hit), and loads the rest.
3. The iteration copies its share of every load under way, in the order they started: whole
   blocks within the swap budget the iteration's swap-outs left, at least one block (the copy
   overlaps the forward pass, which then lasts at least T_swap of it).

The host copy is freed when its request joins the batch (the engine frees its slots then). A
SYNC-mode policy copies whole at admission and stalls the batch, as InferCept's swap does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interlude.policy.base import Policy, PolicyError, swap_out_budget_blocks
from interlude.policy.profile import Profile
from interlude.policy.types import Decision, Handling, Phase, SchedulerView, SwapMode
from interlude.sim.kv import KVBook, OutOfBlocks
from interlude.sim.ranked_queue import RankedQueue
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
    blocks: int = 0  # whole blocks copied (the engine's swap budget counts blocks)


@dataclass(frozen=True)
class SwapIns(Moved):
    """An iteration's swap-ins, and what they leave to the admissions after them."""

    # Free blocks admissions must leave alone: the whole sequence of the first swap-in that
    # could not be allocated (more than are free: vLLM admits nobody behind it), else 0.
    reserve: int = 0
    # A finished load that could not join the batch, if any: when nothing else runs, the
    # simulator abandons it (`Loads.abandon`), as the engine's scheduler unstalls.
    blocked: SimRequest | None = None
    joined: int = 0  # requests whose copy came back and joined the batch


@dataclass
class Load:
    """A host copy coming back: `left` of its `tokens` still to copy, into `reserved` GPU blocks
    allocated when it started."""

    r: SimRequest
    tokens: int
    reserved: int
    left: int
    hit: int = 0  # leading tokens the prefix cache still held, taken instead of loaded


@dataclass
class Loads:
    """The loads under way, in the order they started."""

    items: dict[str, Load] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def start(self, r: SimRequest, kv: KVBook) -> bool:
        """Allocate the GPU blocks of `r`'s host copy (it must fit); False when the prefix cache
        held all of it, so nothing is loaded (the engine's connector offers no tokens and vLLM
        admits the request at once)."""
        hit = kv.take_cached_copy(r)
        if not r.cpu_tokens:
            return False
        reserved = kv.blocks(r.gpu_tokens + r.cpu_tokens) - kv.blocks(r.gpu_tokens)
        kv.reserve_load(reserved)
        self.items[r.request_id] = Load(r, r.cpu_tokens, reserved, r.cpu_tokens, hit)
        return True

    def copy(self, budget_tokens: int, bs: int) -> int:
        """This iteration's copies (rule 3); the tokens copied."""
        room = max(1, budget_tokens // bs)
        moved = 0
        for load in self.items.values():
            if room == 0:
                break
            if load.left == 0:
                continue
            blocks = min(-(-load.left // bs), room)
            n = min(load.left, blocks * bs)
            load.left -= n
            moved += n
            room -= blocks
        return moved

    def finish(self, load: Load, kv: KVBook) -> None:
        """`load`'s request takes its copy onto the GPU and leaves the host."""
        r = load.r
        kv.release_load(load.reserved)
        kv.set_cpu(r, 0)
        kv.set_gpu(r, r.gpu_tokens + load.tokens)
        r.swapped_tokens += load.tokens
        del self.items[r.request_id]

    def abandon(self, r: SimRequest, kv: KVBook) -> None:
        """Give back the blocks of `r`'s finished load; its host copy stays, to load again."""
        load = self.items.pop(r.request_id)
        kv.release_load(load.reserved)
        if load.hit:
            kv.untake_cached_copy(r, load.hit)


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
        first = r.cpu_tokens == 0
        try:
            kv.set_cpu(r, r.cpu_tokens + n)
        except OutOfBlocks as exc:
            raise PolicyError(f"{policy.name}: swap beyond host memory: {exc}") from exc
        kv.swap_out(r, n, first)
        out_blocks += before - kv.blocks(r.gpu_tokens)
        out_tokens += n
        r.swapped_tokens += n
    if policy.traits.swap_mode is SwapMode.SYNC:
        return Moved(0, view.profile.t_swap(out_tokens), out_blocks)
    allowed = swap_out_budget_blocks(view)
    if out_blocks > allowed:
        raise PolicyError(
            f"{policy.name}: swapped out {out_blocks} blocks, budget allows {allowed}"
        )
    return Moved(out_tokens, 0.0, out_blocks)


def swap_in(
    queue: RankedQueue,
    running: Running,
    kv: KVBook,
    profile: Profile,
    budget: int,
    sync: bool,
    loads: Loads,
) -> SwapIns:
    """Bring host copies back for the resumed requests of `queue` (the module's rules); those
    back on the GPU leave the queue and run. `budget`: tokens this iteration may copy in;
    `sync`: the policy copies whole and stalls the batch (no budget, no loads)."""
    if sync:
        return _swap_in_whole(queue, running, kv, profile)
    reserve = 0
    blocked: SimRequest | None = None
    back: list[SimRequest] = []
    stopped = False
    for load in [ld for ld in loads.items.values() if ld.left == 0]:
        r = load.r
        if len(running) >= profile.max_num_seqs:
            stopped = True
            break
        need = kv.blocks(r.context_tokens) - kv.blocks(r.gpu_tokens) - load.reserved
        if need > kv.gpu_free:
            reserve, blocked, stopped = need, r, True
            break
        loads.finish(load, kv)
        _run(r, running, back)
    for r in back:
        queue.remove(r)
    joined = len(back)
    if not stopped:
        for r in queue:
            if r.request_id in loads.items:
                continue  # its copy is under way
            if (stop := _stops_at(r, running, kv, profile)) is not None:
                reserve = stop
                break
            if not loads.start(r, kv):
                _run(r, running, back)
    for r in back[joined:]:
        queue.remove(r)
    moved = loads.copy(budget, kv.bs) if loads else 0
    return SwapIns(moved, 0.0, kv.blocks(moved), reserve, blocked, len(back))


def _stops_at(r: SimRequest, running: Running, kv: KVBook, profile: Profile) -> int | None:
    """Why the queue stops at `r`: None when its whole sequence may start now; 0 when no
    sequence slot is left; else the blocks it needs, more than are free (the reserve)."""
    if len(running) >= profile.max_num_seqs:
        return 0
    need = kv.grow_cost(r, r.cpu_tokens + r.pending_tokens)
    return need if need > kv.gpu_free else None


def _run(r: SimRequest, running: Running, back: list[SimRequest]) -> None:
    r.phase = Phase.RUNNING
    running.add(r, prefilling=r.pending_tokens > 0)
    back.append(r)


def _swap_in_whole(queue: RankedQueue, running: Running, kv: KVBook, profile: Profile) -> SwapIns:
    """A SYNC policy's swap-ins: in queue order, each whole sequence that fits, all copied at
    once while the batch waits; the first that does not fit stops the queue."""
    moved = reserve = 0
    back: list[SimRequest] = []
    for r in queue:
        if (stop := _stops_at(r, running, kv, profile)) is not None:
            reserve = stop
            break
        kv.take_cached_copy(r, past_copy=True)
        n = r.cpu_tokens
        kv.set_cpu(r, 0)
        kv.set_gpu(r, r.gpu_tokens + n)
        r.swapped_tokens += n
        moved += n
        _run(r, running, back)
    queue.pop_front(len(back))  # none passed over: they were the queue's head
    return SwapIns(0, profile.t_swap(moved), kv.blocks(moved), reserve, None, len(back))
