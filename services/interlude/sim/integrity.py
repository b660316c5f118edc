"""The simulator's conservation checks (`SimConfig.check_integrity` runs them after every step):
every GPU and host block is free, held by a request, or loading; every request's tokens are
on the GPU, on the host or pending; and the view keeps what it promises its policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from interlude.policy.types import Phase
from interlude.sim.kv import IntegrityError

if TYPE_CHECKING:
    from interlude.sim.simulator import Simulator


def check_engine(sim: Simulator) -> None:
    """Raise `IntegrityError` where `sim` broke conservation; no side effects."""
    live = [
        *sim.running,
        *sim.waiting.items,
        *sim.swap_queue.items,
        *(r for _, r in sim._entering),
        *sim.paused.values(),
    ]
    # An engine fed by its own arrivals holds every one it has not finished (a cluster's
    # engines hand requests on, so only what they hold counts).
    if sim.requests:
        opened = [r for r in sim.requests[: sim._next_arrival] if r.phase < Phase.FINISHED]
        if len(opened) != len(live):
            raise IntegrityError(f"{len(opened)} requests open, {len(live)} held")
    sim.kv.check(live)
    # What the view promises its policy (`paused_with_kv`, `waiting_holds_kv`).
    if list(sim.kv.paused_kv) != [rid for rid in sim.paused if rid in sim.kv.paused_kv]:
        raise IntegrityError("paused_with_kv is not in the paused requests' order")
    if any(r.gpu_tokens for r in sim._with_entering(sim.waiting)):
        raise IntegrityError("a waiting request holds GPU KV")
