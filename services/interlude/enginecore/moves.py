"""KV moves on parked requests: the scheduler decides, this carries a decision out on vLLM's
block pool and the host swap, and keeps each `Parked` record true to what the GPU holds.

* A swap copies a parked request's next blocks to host. Leading blocks shared through the
  prefix cache (another request holds them too) are not copied: freeing them frees no memory,
  and on resume the prefix cache finds them (if they went meanwhile, the resume recomputes).
* The blocks copied in a step go back to vLLM's pool right after that step has run, as the
  simulator frees a partial swap's blocks at once: a request half swapped holds half its
  blocks, and the policy's view (`Parked.split`) and the free-block count agree.
* A request swapped out in part that resumes keeps the blocks that stayed: the positions its
  copied blocks left get fresh blocks and the host copy is loaded into them (an asynchronous
  connector load, within the budget), as the simulator swaps in a partial copy.
* A request's last blocks, and a discard, free it whole through vLLM's own `_free_request_blocks`,
  which defers the return to the pool while an in-flight step may still write the blocks
  (vLLM's fence under async scheduling or pipeline parallelism).

Invariants: `freed_blocks <= saved_blocks <= gpu_blocks`; a block is freed only after the step
that copied it has run; `on_gpu` is False exactly when none of the request's blocks is held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.parking import Parked, ParkingLot
from interlude.enginecore.swap import HostSwapConnector
from interlude.policy import PolicyError, RequestView

# Waiting, but not for blocks: parked until the tool answers, or loading a host copy.
NOT_STALLED = (RequestStatus.WAITING_FOR_STREAMING_REQ, RequestStatus.WAITING_FOR_REMOTE_KVS)


def request_blocks(kv_cache_manager: Any, request_id: str) -> list[Any]:
    """The GPU blocks vLLM's `KVCacheManager` holds for a request, in order (read only). Group 0
    only: a model with several KV-cache groups is refused when swapping is on."""
    blocks: list[Any] = kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(
        request_id, []
    )
    return blocks


def shared_prefix(blocks: list[Any]) -> int:
    """How many of a request's leading blocks another request holds too (prefix sharing is by
    prefix: once a block is not shared, no later one is)."""
    n = 0
    for block in blocks:
        if block.ref_cnt <= 1:
            break
        n += 1
    return n


class ParkedMoves:
    """Swaps, discards and frees parked requests' blocks for `InterludeScheduler`."""

    def __init__(self, scheduler: Any, swap: HostSwapConnector | None, lot: ParkingLot) -> None:
        self.s = scheduler  # vLLM's scheduler: its KV manager, requests and fenced frees
        self.swap = swap
        self.lot = lot
        self.saved_tokens = 0  # tokens planned for copying out this step (the swap budget's)

    def _blocks(self, request_id: str) -> list[Any]:
        return request_blocks(self.s.kv_cache_manager, request_id)

    def begin_step(self) -> None:
        self.saved_tokens = 0

    def swap_out(self, request: Request, p: Parked, n: int, policy: str) -> int:
        """Plan copying the parked request's next `n` blocks to host; how many blocks this
        covered (copied, or left to the prefix cache as shared)."""
        if self.swap is None:
            raise PolicyError(f"{policy} swaps, but the engine has no host pool")
        blocks = self._blocks(request.request_id)
        before = p.saved_blocks
        if p.saved_blocks == 0 and self.swap.host_tokens(request.request_id) == 0:
            p.shared_blocks = p.saved_blocks = shared_prefix(blocks)
        todo = [b.block_id for b in blocks[p.saved_blocks : p.saved_blocks + n]]
        if len(todo) > self.swap.free_slots:
            raise PolicyError(f"{policy} swaps {len(todo)} blocks into a full host pool")
        p.saved_blocks += len(todo)
        tokens = min(p.frontier, p.saved_blocks * self.lot.block_size)
        self.swap.save(request.request_id, todo, tokens, first=p.shared_blocks)
        self.saved_tokens += len(todo) * self.lot.block_size
        self.lot.counters.swap_bytes["out"] += len(todo) * self.lot.block_bytes
        if p.saved_blocks >= len(blocks):
            self.lot.free_after_step.add(request.request_id)
        else:
            self.lot.copied_this_step.add(request.request_id)
        return p.saved_blocks - before

    def discard(self, request: Request, p: Parked, copying: bool) -> None:
        if copying:
            self.lot.free_after_step.add(p.request_id)  # copy first, then free
        else:
            self.release(request, p)

    def reload_in_place(self, request: Request, p: Parked) -> int:
        """A request swapped out in part resumes: give the positions its copied blocks left
        (null blocks now) fresh blocks and load the host copy into them, keeping the blocks
        that stayed on the GPU, as the simulator swaps in a partial copy. The tokens to load;
        0 when it cannot (no budgeted host pool, or too few free blocks): the caller then
        frees the rest and the request comes back like a whole swap, recomputing what stayed.
        """
        rid = request.request_id
        copy = self.swap.copies.get(rid) if self.swap is not None else None
        if self.swap is None or copy is None or self.swap.load_budget is None:
            return 0
        gone = range(copy.first, p.freed_blocks)
        pool = self.s.kv_cache_manager.block_pool
        if not gone or pool.get_num_free_blocks() < len(gone):
            return 0
        blocks = self._blocks(rid)
        fresh = pool.get_new_blocks(len(gone))
        for i, block in zip(gone, fresh, strict=True):
            blocks[i] = block
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        return self.swap.reload(rid, [b.block_id for b in fresh])

    def release(self, request: Request, p: Parked) -> None:
        """Free all the request's remaining blocks (fenced as vLLM fences its own frees)."""
        self.s._free_request_blocks(request)
        p.on_gpu = False

    def after_step(self) -> None:
        """The step that copied blocks has run: give back what it copied."""
        for rid in self.lot.copied_this_step:
            p = self.lot.parked.get(rid)
            if p is not None and p.on_gpu and p.saved_blocks > p.freed_blocks:
                manager = self.s.kv_cache_manager.coordinator.single_type_managers[0]
                manager._remove_blocks_in_range(rid, p.freed_blocks, p.saved_blocks)
                p.freed_blocks = p.saved_blocks
        self.lot.copied_this_step.clear()
        for rid in self.lot.free_after_step:
            p = self.lot.parked.get(rid)
            if p is not None and p.on_gpu:
                self.release(self.s.requests[rid], p)
        self.lot.free_after_step.clear()

    def unstall(self, view: Callable[[Request, float], RequestView], now: float) -> None:
        """A step that ran nothing, with a free sequence slot, and resumed sessions holding KV
        while they wait for the blocks their new tokens need: vLLM preempts only running
        requests, so no later step would differ. Free the one the policy would preempt first
        (it recomputes, with what the prefix cache still holds, or loads its host copy again),
        as the simulator does when no running request can get a block (`Batcher.form`) or a
        finished load cannot join (`swapping.Loads.abandon`)."""
        s = self.s
        holders = [
            r
            for r in s.kv_holding_waiting
            if r.status not in NOT_STALLED and r.num_computed_tokens > 0
        ]
        if not holders:
            return
        by_id = {r.request_id: r for r in holders}
        victim = by_id[s.ipolicy.preemption_order([view(r, now) for r in holders])[0].request_id]
        c = self.lot.counters
        # Its own reason: unlike vLLM's preemptions, this one is ours, and rare.
        c.bump(c.recompute_tokens, "stall", victim.num_computed_tokens)
        s._free_request_blocks(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        s.kv_holding_waiting.remove_request(victim)
        s.waiting.add_request(victim)

    def turn_starts(self) -> dict[str, tuple[str, float]]:
        """The resumed turns scheduled since the last call, under their callers' ids: how the
        KV came back (preserve, swap, prefix-cache, recompute) and the seconds the turn waited
        from its resume to its first scheduled step. The stats carry them to the front end."""
        out = {}
        for rid, start in self.lot.turn_starts.items():
            r = self.s.requests.get(rid)
            caller = self.s.views.metas.get(r).caller_id if r is not None else None
            out[caller or rid] = start
        self.lot.turn_starts.clear()
        return out

    def account_admissions(self, out: Any, now: float) -> None:
        """Count how the cold resumed turns admitted this step got their KV back (host copy,
        prefix cache, recompute), and every resumed turn's wait until this step."""
        via: dict[str, str] = {}  # how each cold resumed turn's KV came back
        # New or resumed alike: a turn whose load took several steps may have been preempted
        # before its pause, and then vLLM schedules it as a resumed request.
        for rid, scheduled in out.num_scheduled_tokens.items():
            frontier = self.lot.cold.pop(rid, None)
            if frontier is None:
                continue
            # vLLM has already counted this step's tokens as computed.
            hit = min(self.s.requests[rid].num_computed_tokens - scheduled, frontier)
            loaded = self.swap.take_loaded(rid) if self.swap else 0
            c = self.lot.counters
            c.bump(c.recompute_tokens, "discard", frontier - hit)
            c.prefix_restored_tokens += hit - min(hit, loaded)
            if loaded:
                c.swap_bytes["in"] += self.s.profile.blocks(loaded) * self.lot.block_bytes
            via[rid] = "swap" if loaded else ("prefix-cache" if hit else "recompute")
            c.bump(c.resumes, via[rid])
            if self.swap:
                self.swap.drop(rid)
        self.lot.count_waits(out.num_scheduled_tokens, via, now)
