"""The simulator's swap-ins follow the engine's rules (`sim/swapping.py`): a load starts when the
whole sequence fits and takes its blocks at once; its copy is spread over iterations within the
budget, at least a block each; it joins the batch the iteration after its last block; the first
request that cannot be allocated stops everything behind it."""

from __future__ import annotations

from collections.abc import Callable

from interlude.policy import Profile, make_policy
from interlude.policy.types import Decision, Handling, KVAction, Phase, SchedulerView
from interlude.policy.variants import InferCeptSyncSwap
from interlude.sim.config import SimConfig
from interlude.sim.kv import KVBook
from interlude.sim.ranked_queue import RankedQueue
from interlude.sim.request import SimRequest
from interlude.sim.running import Running
from interlude.sim.simulator import Simulator
from interlude.sim.swapping import Loads, SwapIns, apply_kv, swap_in
from interlude_workloads import Arrival, Segment, TraceCall, TraceRequest

BS = 16
Lane = Callable[..., tuple[RankedQueue, Running, KVBook]]


def ids(rs: object) -> list[str]:
    return [r.request_id for r in rs]  # type: ignore[attr-defined]


def iterate(
    queue: RankedQueue, running: Running, kv: KVBook, profile: Profile, loads: Loads, budget: int
) -> tuple[int, list[str]]:
    """One iteration's swap-ins: (tokens copied, requests running after it)."""
    out = swap_in(queue, running, kv, profile, budget, sync=False, loads=loads)
    kv.check([*queue, *running.all.values()])
    return out.tokens, ids(running.all.values())


def test_a_copy_larger_than_the_budget_comes_back_over_several_iterations(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile()
    queue, running, kv = make_swap_lane(profile, {"big": 10 * BS, "small": BS})
    loads, free = Loads(), kv.gpu_free
    # Both start at once (their sequences fit) and take their copies' blocks; the budget's
    # four blocks go to `big`, which started first.
    assert iterate(queue, running, kv, profile, loads, 4 * BS) == (4 * BS, [])
    assert list(loads.items) == ["big", "small"] and free - kv.gpu_free == 11
    assert loads.items["big"].left == 6 * BS and loads.items["small"].left == BS
    assert iterate(queue, running, kv, profile, loads, 4 * BS) == (4 * BS, [])
    # `big`'s last two blocks leave room for `small`'s one.
    assert iterate(queue, running, kv, profile, loads, 4 * BS) == (3 * BS, [])
    # Both copies are back: they join the batch, whole, and leave the host.
    assert iterate(queue, running, kv, profile, loads, 4 * BS) == (0, ["big", "small"])
    big = running.all["big"]
    assert big.gpu_tokens == 10 * BS and big.cpu_tokens == 0 and big.swapped_tokens == 10 * BS
    assert big.phase is Phase.RUNNING and kv.cpu_free == kv.cpu_total and not queue
    assert kv.loading == 0 and free - kv.gpu_free == 11  # the calls' tokens: the batcher's


def test_an_iteration_copies_at_least_a_block(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    # The swap-outs may leave no budget: a load must still progress.
    profile = make_profile()
    queue, running, kv = make_swap_lane(profile, {"a": 2 * BS})
    loads = Loads()
    assert iterate(queue, running, kv, profile, loads, 0)[0] == BS
    assert iterate(queue, running, kv, profile, loads, 0)[0] == BS
    assert iterate(queue, running, kv, profile, loads, 0) == (0, ["a"])


def test_a_copy_that_cannot_be_allocated_stops_the_queue_and_reserves_its_room(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile(gpu_kv_bytes=12 * BS * 1000)  # 12 GPU blocks
    queue, running, kv = make_swap_lane(profile, {"a": 4 * BS, "b": 9 * BS, "c": BS})
    loads = Loads()
    out = swap_in(queue, running, kv, profile, 100 * BS, sync=False, loads=loads)
    # `a` takes 4 blocks; `b` needs 10 of the 8 left: the loop stops there, and `c`, which
    # would fit, waits behind it as in vLLM (whose waiting loop breaks at an allocation
    # failure). Admissions must leave `b`'s whole sequence free, which no admission can.
    assert list(loads.items) == ["a"] and ids(queue) == ["a", "b", "c"]
    assert out.reserve == kv.blocks(9 * BS + 8) > kv.gpu_free


def test_a_finished_load_that_cannot_join_stops_admissions(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile(gpu_kv_bytes=6 * BS * 1000)  # 6 GPU blocks
    queue, running, kv = make_swap_lane(profile, {"a": 4 * BS})
    loads = Loads()
    swap_in(queue, running, kv, profile, 100 * BS, sync=False, loads=loads)
    kv.gpu_free -= 2  # others took the room its call's tokens need meanwhile
    out = swap_in(queue, running, kv, profile, 100 * BS, sync=False, loads=loads)
    assert not running.all and out.blocked is queue.items[0] and out.reserve == 1 > kv.gpu_free
    loads.abandon(queue.items[0], kv)  # nothing else runs: the simulator gives its blocks back
    assert kv.loading == 0 and kv.gpu_free == 4 and queue.items[0].cpu_tokens == 4 * BS


def test_sync_copies_are_never_cut_by_the_budget_and_stall_the_batch(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile()
    queue, running, kv = make_swap_lane(profile, {"a": 6 * BS, "b": 6 * BS})
    out = swap_in(queue, running, kv, profile, BS, sync=True, loads=Loads())
    assert ids(running.all.values()) == ["a", "b"] and not queue
    assert out.tokens == 0 and out.stall_s == profile.t_swap(12 * BS)


def test_no_swap_in_joins_past_the_sequence_slots(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    # Loads do not hold a sequence slot (vLLM counts running requests); joining needs one.
    profile = make_profile(max_num_seqs=1)
    queue, running, kv = make_swap_lane(profile, {"a": BS, "b": BS})
    loads = Loads()
    assert iterate(queue, running, kv, profile, loads, 100 * BS) == (2 * BS, [])
    assert iterate(queue, running, kv, profile, loads, 100 * BS) == (0, ["a"])
    assert list(loads.items) == ["b"] and ids(queue) == ["b"]


def parked_and_swapped(
    profile: Profile,
    tokens: int,
    pending: int,
    make_view: Callable[..., SchedulerView],
    copied: int | None = None,
) -> tuple[SimRequest, KVBook]:
    """A request of `tokens` computed tokens, paused and swapped out by a SYNC policy (`swap`)
    in one decision (whole, or only its first `copied` blocks), on an engine with the prefix
    cache; its call then adds `pending` tokens and it waits in the swap queue."""
    kv = KVBook(profile, prefix_cache=True)
    segments = (Segment(1, TraceCall("t", 1.0, pending)), Segment(4, None))
    r = SimRequest("r", TraceRequest("r", "k", tokens, segments), 0.0)
    r.context_tokens = tokens
    kv.set_gpu(r, tokens)
    r.phase = Phase.PAUSED
    kv.pause(r)
    action = KVAction("r", Handling.SWAP, kv.blocks(tokens) if copied is None else copied)
    view = make_view(profile=profile)
    apply_kv(Decision(kv=(action,)), view, {"r": r}, kv, make_policy("swap", profile))
    kv.unpause(r)
    r.phase = Phase.SWAP_QUEUED
    r.context_tokens += pending
    r.pending_tokens = pending
    return r, kv


def test_a_whole_swap_leaves_its_blocks_cached_and_loads_only_the_rest(
    make_profile: Callable[..., Profile], make_view: Callable[..., SchedulerView]
) -> None:
    # The engine frees a request swapped out whole, vLLM's prefix cache keeps its 5 whole
    # blocks, and at the swap-in its connector offers only the tokens past them.
    profile = make_profile()
    r, kv = parked_and_swapped(profile, 5 * BS + 3, pending=8, make_view=make_view)
    assert r.gpu_tokens == 0 and r.cpu_tokens == 5 * BS + 3 and r.swapped_tokens == 5 * BS + 3
    queue, running, loads = RankedQueue(), Running(BS), Loads()
    queue.push(r, (0.0,))
    iterate(queue, running, kv, profile, loads, 100 * BS)
    assert r.prefix_hit_tokens == 5 * BS and r.gpu_tokens == 5 * BS
    assert loads.items["r"].tokens == 3 and r.cpu_tokens == 3
    assert iterate(queue, running, kv, profile, loads, 100 * BS) == (0, ["r"])
    assert r.gpu_tokens == 5 * BS + 3 and r.swapped_tokens == 5 * BS + 3 + 3


def test_a_copy_the_cache_holds_whole_joins_without_a_load(
    make_profile: Callable[..., Profile], make_view: Callable[..., SchedulerView]
) -> None:
    profile = make_profile()
    r, kv = parked_and_swapped(profile, 4 * BS, pending=8, make_view=make_view)
    queue, running, loads = RankedQueue(), Running(BS), Loads()
    queue.push(r, (0.0,))
    assert iterate(queue, running, kv, profile, loads, 100 * BS) == (0, ["r"])
    assert not loads and not queue and r.cpu_tokens == 0 and r.gpu_tokens == 4 * BS
    assert r.prefix_hit_tokens == 4 * BS and r.pending_tokens == 8


def test_a_copy_whose_blocks_were_reused_loads_whole(
    make_profile: Callable[..., Profile], make_view: Callable[..., SchedulerView]
) -> None:
    profile = make_profile()
    r, kv = parked_and_swapped(profile, 5 * BS + 3, pending=8, make_view=make_view)
    kv.cache.sync(kv.gpu_free - profile.gpu_blocks)  # others allocated every free block
    queue, running, loads = RankedQueue(), Running(BS), Loads()
    queue.push(r, (0.0,))
    iterate(queue, running, kv, profile, loads, 100 * BS)
    assert r.prefix_hit_tokens == 0 and loads.items["r"].tokens == 5 * BS + 3


def test_an_abandoned_load_gives_its_cached_blocks_back(
    make_profile: Callable[..., Profile], make_view: Callable[..., SchedulerView]
) -> None:
    profile = make_profile()
    r, kv = parked_and_swapped(profile, 5 * BS + 3, pending=8, make_view=make_view)
    queue, running, loads = RankedQueue(), Running(BS), Loads()
    queue.push(r, (0.0,))
    free = kv.gpu_free
    iterate(queue, running, kv, profile, loads, 100 * BS)
    loads.abandon(r, kv)
    kv.check([r])
    assert kv.gpu_free == free and r.gpu_tokens == 0 and r.cpu_tokens == 5 * BS + 3
    assert r.prefix_hit_tokens == 0 and kv.cache.cached["r"].blocks == 5


def partly_swapped(
    profile: Profile, tokens: int, copied: int, make_view: Callable[..., SchedulerView]
) -> tuple[SimRequest, KVBook]:
    """`parked_and_swapped` with only the first `copied` blocks copied, back from its call (8
    tokens) as the simulator takes it back: its blocks that stayed on the GPU freed
    (`release_stayed`, the engine's rule for a synchronous copy)."""
    r, kv = parked_and_swapped(profile, tokens, 8, make_view, copied)
    assert r.cpu_tokens == copied * BS and r.gpu_tokens == tokens - copied * BS
    kv.release_stayed(r)
    kv.check([r])
    return r, kv


def sync_swap_in(r: SimRequest, kv: KVBook, profile: Profile) -> tuple[SwapIns, Running]:
    """`r`, alone in the swap queue, swapped in by a SYNC policy: what it cost, and who runs."""
    queue, running = RankedQueue(), Running(BS)
    queue.push(r, (0.0,))
    return swap_in(queue, running, kv, profile, 0, sync=True, loads=Loads()), running


def test_a_synchronous_copy_made_in_part_comes_back_like_a_whole_swap(
    make_profile: Callable[..., Profile], make_view: Callable[..., SchedulerView]
) -> None:
    # The engine frees the 3 blocks and 3 tokens that stayed: vLLM's prefix cache then holds
    # the copied head and, behind it, the stayed tail's whole blocks, and a lookup finds both:
    # nothing is loaded, only the tail's partial block is recomputed.
    profile = make_profile()
    r, kv = partly_swapped(profile, 6 * BS + 3, copied=3, make_view=make_view)
    assert r.gpu_tokens == 0 and r.recompute_left == 3 * BS + 3
    out, running = sync_swap_in(r, kv, profile)
    kv.check([r])
    assert ids(running.all.values()) == ["r"] and out.stall_s == 0.0
    assert r.prefix_hit_tokens == 6 * BS and r.gpu_tokens == 6 * BS and r.cpu_tokens == 0
    assert r.pending_tokens == 3 + 8 and r.recompute_left == 3


def test_a_copy_made_in_part_whose_head_was_reused_loads_it_and_recomputes_the_rest(
    make_profile: Callable[..., Profile], make_view: Callable[..., SchedulerView]
) -> None:
    profile = make_profile()
    r, kv = partly_swapped(profile, 6 * BS + 3, copied=3, make_view=make_view)
    kv.cache.sync(kv.gpu_free - profile.gpu_blocks)  # others allocated every free block
    out, _ = sync_swap_in(r, kv, profile)
    assert out.stall_s == profile.t_swap(3 * BS) and r.prefix_hit_tokens == 0
    assert r.gpu_tokens == 3 * BS and r.pending_tokens == 3 * BS + 3 + 8
    assert r.recompute_left == 3 * BS + 3


class CopyTwoBlocksSync(InferCeptSyncSwap):
    """A SYNC-mode policy that copies the first two blocks of each paused request to host and
    keeps the rest on the GPU (a partial copy), once per pause."""

    def decide(self, view: SchedulerView) -> Decision:
        kv = tuple(
            KVAction(r.request_id, Handling.SWAP, 2)
            for r in view.paused
            if r.gpu_tokens and not r.cpu_tokens
        )
        return Decision(kv=kv)


def test_the_simulator_takes_a_partial_synchronous_copy_back_like_a_whole_swap(
    make_profile: Callable[..., Profile],
) -> None:
    # "old" pauses with 201 tokens; two blocks go to host, the rest stays. At its resume the
    # simulator frees what stayed, as the engine does, and the prefix cache (nobody else
    # allocates) gives the whole context back: the host copy is not loaded.
    profile = make_profile()
    old = TraceRequest(
        "old", "chat", 200, (Segment(1, TraceCall("search", 0.1, 40)), Segment(1, None))
    )
    policy = CopyTwoBlocksSync(profile)
    config = SimConfig(check_integrity=True)
    m = Simulator(profile, policy, [Arrival(0.0, old, "old")], config).run().to_dict()
    assert m["swapped_tokens"] == 2 * BS  # copied out, never back in
    assert m["prefix_hit_tokens"] == 201 // BS * BS
    assert m["recomputed_tokens"] == 201 - 201 // BS * BS
