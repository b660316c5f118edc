"""A policy's broken action is refused, not fatal: the engine core (and every session in it)
must outlive a policy bug. No engine started: the scheduler's `_apply` on a bare instance."""

from __future__ import annotations

from collections.abc import Callable

from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.enginecore.moves import ParkedMoves
from interlude.enginecore.parking import Parked, ParkingLot
from interlude.enginecore.scheduler import InterludeScheduler
from interlude.policy import Decision, Handling, KVAction, Profile
from interlude.policy.infercept import InferCeptPolicy


def test_broken_actions_are_refused_counted_and_leave_the_kv_in_place(
    make_profile: Callable[..., Profile],
) -> None:
    profile = make_profile()
    s = object.__new__(InterludeScheduler)
    s.ipolicy = InferCeptPolicy(profile)
    s.swap = None  # no host pool: a swap breaks the seam's rules here
    s.lot = ParkingLot(profile.block_size, profile.block_bytes)
    s.moves = ParkedMoves(s, None, s.lot)
    s.policy_errors = 0
    parked = Parked("p", "qa", 0.0, 1.0, "search", 0, frontier=64, gpu_blocks=4)
    s.lot.park(parked)
    s.requests = {"p": Request("p", list(range(64)), SamplingParams(max_tokens=4), None)}
    decision = Decision(
        kv=(
            KVAction("ghost", Handling.DISCARD, 4),  # names no parked request
            KVAction("p", Handling.SWAP, 4),  # into a host pool that does not exist
        )
    )
    moved = s._apply(decision)
    assert moved is False and s.policy_errors == 2
    assert parked.on_gpu and parked.saved_blocks == 0  # a preserve: nothing lost
