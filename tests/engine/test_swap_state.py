"""The host-swap connector's scheduler-side bookkeeping (no engine): a request that looked up
its host copy but finished before an allocation leaves nothing behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.enginecore import link_clock
from interlude.enginecore.moves import ParkedMoves
from interlude.enginecore.parking import ParkingLot
from interlude.enginecore.policy_queue import PolicyQueue
from interlude.enginecore.prefill_order import PrefillOrder
from interlude.enginecore.request_views import RequestViews
from interlude.enginecore.scheduler import InterludeScheduler
from interlude.enginecore.swap import HostSwapConnector, SwapMetadata
from interlude.policy import Profile, RequestView
from interlude.policy.baselines import SwapPolicy
from interlude.policy.infercept import InferCeptPolicy
from interlude.sim.swapping import Loads, swap_in


def bare_connector(capacity: int) -> HostSwapConnector:
    c = object.__new__(HostSwapConnector)
    c.init_scheduler_side(32, capacity)
    return c


def step_meta(c: HostSwapConnector) -> SwapMetadata:
    meta = c.build_connector_meta(None)  # type: ignore[arg-type]
    assert isinstance(meta, SwapMetadata)
    return meta


def test_a_finished_request_leaves_no_lookup_or_slot_behind() -> None:
    c = bare_connector(4)
    r = Request("r", list(range(100)), SamplingParams(max_tokens=4), None)
    c.save("r", [5, 6], tokens=64)
    assert c.free_slots == 2
    offered, _ = c.get_num_new_matched_tokens(r, num_computed_tokens=32)
    assert offered == 32  # the host copy's second block, past the prefix-cache hit
    assert c._local_hit == {"r": 32}
    c.request_finished(r, [])  # aborted while it waited for blocks: no allocation came
    assert c._local_hit == {} and c.copies == {} and c.free_slots == 4


class Allocated:
    """What vLLM hands `update_state_after_alloc`: the request's block ids, per KV group."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (self.ids,)


def request(rid: str, tokens: int) -> Request:
    return Request(rid, list(range(tokens)), SamplingParams(max_tokens=4), None)


def test_loads_are_spread_over_steps_within_the_budget() -> None:
    c = bare_connector(16)
    c.save("a", [1, 2, 3], tokens=96)
    c.save("b", [4], tokens=32)
    step_meta(c)  # the saves' step
    c.begin_step(64)
    # A budgeted policy's copy is an asynchronous hit: vLLM allocates its blocks and waits.
    assert c.get_num_new_matched_tokens(request("a", 200), 0) == (96, True)
    c.update_state_after_alloc(request("a", 200), Allocated([10, 11, 12, 13]), 96)
    assert c.get_num_new_matched_tokens(request("b", 200), 0) == (32, True)
    c.update_state_after_alloc(request("b", 200), Allocated([20, 21]), 32)
    assert c.loading_tokens("a") == 96 and c.loads_pending == 4
    meta = step_meta(c)  # two blocks of budget, to the load that started first
    assert meta.loads == [(10, 0), (11, 1)] and meta.loaded == [] and not meta.sync
    c.begin_step(0)  # the step's saves took the budget: a block still goes
    meta = step_meta(c)
    assert meta.loads == [(12, 2)] and meta.loaded == ["a"]
    c.begin_step(64)
    meta = step_meta(c)
    assert meta.loads == [(20, 3)] and meta.loaded == ["b"] and c.loads_pending == 0
    assert c.take_loaded("a") == 96  # its admission, once vLLM has it back


def test_a_synchronous_policy_loads_whole_at_admission() -> None:
    c = bare_connector(16)
    c.save("a", [1, 2, 3], tokens=96)
    step_meta(c)
    c.begin_step(None)  # a SYNC-mode policy: no budget
    assert c.get_num_new_matched_tokens(request("a", 200), 0) == (96, False)
    c.update_state_after_alloc(request("a", 200), Allocated([10, 11, 12, 13]), 96)
    meta = step_meta(c)
    assert meta.loads == [(10, 0), (11, 1), (12, 2)] and c.loads_pending == 0
    assert meta.sync  # the batch waits for these copies (an emulated link stalls it)


class NoCopier:
    """The worker side's copier, without KV tensors: the step's copies are only counted."""

    def mark_step(self) -> None:
        return

    def start(self, loads: list[tuple[int, int]], saves: list[tuple[int, int]]) -> None:
        return


class LinkRecorder:
    def __init__(self) -> None:
        self.copies: list[tuple[int, bool]] = []

    def copied(self, tokens: int, stalls: bool) -> None:
        self.copies.append((tokens, stalls))


def test_a_step_s_copies_reach_the_emulated_link_clock() -> None:
    c = bare_connector(16)
    c._copier = NoCopier()  # type: ignore[assignment]
    clock = LinkRecorder()

    def run_step(budget: int | None) -> None:
        c.begin_step(budget)
        c.bind_connector_metadata(step_meta(c))
        c.start_load_kv(None)

    link_clock.install(clock)
    try:
        c.save("a", [1, 2, 3], tokens=96)
        run_step(64)  # a budgeted policy's saves: beside the forward
        c.save("b", [4], tokens=32)
        run_step(None)  # a SYNC-mode policy's: the batch waits
        run_step(64)  # nothing copied: nothing reported
    finally:
        link_clock.install(None)
    assert clock.copies == [(96, False), (32, True)]


def test_a_load_abandoned_midway_is_still_reported_over() -> None:
    # vLLM frees an aborted request's blocks only once its load is reported done.
    c = bare_connector(16)
    c.save("a", [1, 2, 3], tokens=96)
    step_meta(c)
    c.begin_step(32)
    r = request("a", 200)
    c.get_num_new_matched_tokens(r, 0)
    c.update_state_after_alloc(r, Allocated([10, 11, 12, 13]), 96)
    assert step_meta(c).loaded == []
    c.request_finished(r, [])
    c.begin_step(32)
    meta = step_meta(c)
    assert meta.loads == [] and meta.loaded == ["a"] and c.free_slots == 16


def test_a_copy_that_left_its_shared_prefix_to_the_cache_loads_after_it() -> None:
    c = bare_connector(8)
    # Blocks 0-1 were shared through the prefix cache: only blocks 2-3 were copied.
    c.save("r", [7, 8], tokens=128, first=2)
    assert c.copies["r"].first == 2
    r = request("r", 200)
    # The prefix cache no longer covers blocks 0-1: the copy cannot be used after that gap.
    assert c.get_num_new_matched_tokens(r, 32) == (0, False)
    offered, _ = c.get_num_new_matched_tokens(r, 64)
    assert offered == 64
    c.update_state_after_alloc(r, Allocated([30, 31, 32, 33, 34]), 64)
    # GPU blocks 2 and 3 of the request come from host slots 0 and 1.
    assert c._pending.loads == [(32, c.copies["r"].slots[0]), (33, c.copies["r"].slots[1])]


def test_the_load_budget_is_what_the_step_s_saves_leave(
    make_profile: Callable[..., Profile],
) -> None:
    profile = make_profile()
    s = object.__new__(InterludeScheduler)
    s.profile = profile
    s.running = []
    s.lot = ParkingLot(profile.block_size, profile.block_bytes)
    s.moves = ParkedMoves(s, None, s.lot)
    s.ipolicy = InferCeptPolicy(profile)  # budgeted swaps
    whole = profile.swap_budget_tokens(0)
    assert s._load_budget() == whole
    s.moves.saved_tokens = 2 * profile.block_size
    assert s._load_budget() == max(0, whole - 2 * profile.block_size)
    s.moves.saved_tokens = whole + 1
    assert s._load_budget() == 0
    s.ipolicy = SwapPolicy(profile)  # synchronous swaps: whole copies, no budget
    assert s._load_budget() is None


class NewestFirst(InferCeptPolicy):
    """Ranks `new` ahead of everything else: the policy alone would run it first."""

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        return (0.0,) if req.request_id == "new" else (1.0,)


def test_a_resumed_request_with_a_host_copy_ranks_ahead_of_new_ones(
    make_profile: Callable[..., Profile],
) -> None:
    # The simulator swaps in before it admits; vLLM runs its waiting queue in key order and
    # stops at the first request it cannot allocate, so the swap-in must head that queue.
    profile = make_profile()
    s = object.__new__(InterludeScheduler)
    s.ipolicy = NewestFirst(profile)
    s.iteration = 1
    s.block_size = profile.block_size
    s.swap = bare_connector(8)
    s.lot = ParkingLot(profile.block_size, profile.block_bytes)
    s.views = RequestViews(s.swap, s.lot, s.block_size)
    s.prefill_order = PrefillOrder()
    s.swap.save("back", [1, 2], tokens=2 * profile.block_size)
    queue = PolicyQueue(s._queue_key)
    for rid in ("plain", "new", "back"):
        queue.add_request(request(rid, 100))
    assert [r.request_id for r in queue] == ["back", "new", "plain"]
    queue.rescore(lambda rs: s._rescore_keys(rs, 0.0))  # a policy that re-ranks every step
    assert queue.pop_request().request_id == "back"
    s.swap.drop("back")  # its copy came back: back in the queue (preempted), it ranks as any
    queue.add_request(request("back", 100))
    assert [r.request_id for r in queue] == ["new", "plain", "back"]


@pytest.mark.parametrize(
    ("copies", "budget"),
    [
        ((3, 2, 1), 4),
        ((10, 1), 4),
        ((1, 1, 1, 1), 2),
        ((2, 5, 2, 1), 0),
    ],
)
def test_the_connector_and_the_simulator_bring_back_the_same_copies(
    make_profile: Callable[..., Profile],
    make_swap_lane: Callable[..., Any],
    copies: tuple[int, ...],
    budget: int,
) -> None:
    # One rule on both sides (`sim/swapping.py`): every load starts at once (memory is ample),
    # each step copies whole blocks within the budget (at least one) in the order the loads
    # started, and a load is back for the step after its last block. Budget in blocks.
    bs = 32
    profile = make_profile(block_size=bs)
    c = bare_connector(sum(copies))
    slots = iter(range(sum(copies)))
    for i, blocks in enumerate(copies):
        c.save(f"r{i}", [next(slots) for _ in range(blocks)], tokens=blocks * bs)
    step_meta(c)
    c.begin_step(budget * bs)
    for i, blocks in enumerate(copies):
        r = request(f"r{i}", blocks * bs + 8)
        offered, _ = c.get_num_new_matched_tokens(r, 0)
        c.update_state_after_alloc(r, Allocated(list(range(blocks + 1))), offered or 0)
    engine_steps = []
    while c.loads_pending or not engine_steps:
        meta = step_meta(c)
        engine_steps.append((len(meta.loads) * bs, meta.loaded))
        c.begin_step(budget * bs)
    queue, running, kv = make_swap_lane(profile, {f"r{i}": n * bs for i, n in enumerate(copies)})
    loads, sim_steps = Loads(), []
    for _ in engine_steps:
        before = {rid for rid, load in loads.items.items() if load.left == 0}
        out = swap_in(queue, running, kv, profile, budget * bs, False, loads)
        done = [rid for rid, load in loads.items.items() if load.left == 0 and rid not in before]
        sim_steps.append((out.tokens, done))
    assert sim_steps == engine_steps
    swap_in(queue, running, kv, profile, budget * bs, False, loads)
    assert list(running.all) == [f"r{i}" for i in range(len(copies))]
