"""The simulator's swap-ins follow the engine's rules (`sim/swapping.py`): a copy comes back
whole, the iteration's first one even past the budget; a later one past the budget waits and is
passed over; the first one that cannot be allocated stops everything behind it."""

from __future__ import annotations

from collections.abc import Callable

from interlude.policy import Profile
from interlude.policy.types import Phase
from interlude.sim.kv import KVBook
from interlude.sim.queue import RankedQueue
from interlude.sim.running import Running
from interlude.sim.swapping import swap_in

BS = 16
Lane = Callable[..., tuple[RankedQueue, Running, KVBook]]


def ids(rs: object) -> list[str]:
    return [r.request_id for r in rs]  # type: ignore[attr-defined]


def test_the_first_copy_goes_whole_past_the_budget(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile()
    queue, running, kv = make_swap_lane(profile, {"big": 10 * BS, "small": BS})
    free = kv.gpu_free
    out = swap_in(queue, running, kv, profile, budget=4 * BS, sync=False)
    # `big` passes the budget alone but is the iteration's first: whole, in one longer
    # iteration (the simulator's lasts max(T_fwd, T_swap(moved))); nothing else fits after it.
    assert ids(running.all.values()) == ["big"] and ids(queue) == ["small"]
    assert out.tokens == 10 * BS and out.stall_s == 0.0 and out.reserve == 0
    big = running.all["big"]
    assert big.gpu_tokens == 10 * BS and big.cpu_tokens == 0 and big.swapped_tokens == 10 * BS
    assert big.phase is Phase.RUNNING and kv.cpu_free == kv.cpu_total - 1
    # The copy took its blocks; the call's 8 new tokens are the batcher's to allocate.
    assert free - kv.gpu_free == 10


def test_a_later_copy_past_the_budget_waits_and_a_smaller_one_behind_it_goes(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile()
    queue, running, kv = make_swap_lane(profile, {"a": 3 * BS, "b": 2 * BS, "c": BS})
    out = swap_in(queue, running, kv, profile, budget=4 * BS, sync=False)
    # `b` would take the iteration past its budget: the connector refuses it for this step
    # and vLLM passes it over; `c` fits what is left.
    assert ids(running.all.values()) == ["a", "c"] and ids(queue) == ["b"]
    assert out.tokens == 4 * BS and out.reserve == 0


def test_a_copy_that_cannot_be_allocated_stops_the_queue_and_reserves_its_room(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile(gpu_kv_bytes=12 * BS * 1000)  # 12 GPU blocks
    queue, running, kv = make_swap_lane(profile, {"a": 4 * BS, "b": 9 * BS, "c": BS})
    out = swap_in(queue, running, kv, profile, budget=100 * BS, sync=False)
    # `a` takes 5 blocks; `b` needs 10 of the 7 left: the loop stops there, and `c`, which
    # would fit, waits behind it as in vLLM (whose waiting loop breaks at an allocation
    # failure). Admissions must leave `b`'s whole sequence free, which no admission can.
    assert ids(running.all.values()) == ["a"] and ids(queue) == ["b", "c"]
    assert out.reserve == kv.blocks(9 * BS + 8) > kv.gpu_free


def test_sync_copies_are_never_cut_by_the_budget_and_stall_the_batch(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile()
    queue, running, kv = make_swap_lane(profile, {"a": 6 * BS, "b": 6 * BS})
    out = swap_in(queue, running, kv, profile, budget=BS, sync=True)
    assert ids(running.all.values()) == ["a", "b"] and not queue
    assert out.tokens == 0 and out.stall_s == profile.t_swap(12 * BS)


def test_no_swap_in_past_the_sequence_slots(
    make_profile: Callable[..., Profile], make_swap_lane: Lane
) -> None:
    profile = make_profile(max_num_seqs=1)
    queue, running, kv = make_swap_lane(profile, {"a": BS, "b": BS})
    out = swap_in(queue, running, kv, profile, budget=100 * BS, sync=False)
    assert ids(running.all.values()) == ["a"] and ids(queue) == ["b"] and out.reserve == 0
