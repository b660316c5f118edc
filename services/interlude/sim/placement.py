"""What the simulator's cluster (`cluster.py`) reads of its engines to place work, and the KV
hand-offs in flight between them. The rules are the gateway's (`gateway/roster.py`): the same
score (`api.load.placement_score`), the same better-of-two draws."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping

from interlude.api.load import placement_score
from interlude.policy.decode_placement import DecodeLoad
from interlude.policy.flips import EngineLoad
from interlude.sim.request import SimRequest
from interlude.sim.simulator import Simulator


def queued(sim: Simulator) -> list[SimRequest]:
    """Every request waiting on `sim`: its waiting and swap queues, and those entering them."""
    return [*sim.waiting.items, *sim.swap_queue.items, *(r for _, r in sim._entering)]


def score(sim: Simulator) -> float:
    """The load an engine reports in `/v1/load`, read as the gateway reads it. Contended waste
    is the instant's (paused GPU KV over the pool while anyone queues); the engine reports it
    averaged over 30 s."""
    kv = sim.kv
    waiting = queued(sim)
    contended = kv.paused_gpu / kv.gpu_total if waiting else 0.0
    usage = 1.0 - kv.gpu_free / kv.gpu_total
    return placement_score(usage, contended, float(len(waiting)), float(sim.p.max_num_seqs))


def prefill_backlog(sim: Simulator) -> int:
    """Prompt tokens a prefill engine has still to compute (`queued_prefill_tokens`)."""
    running = sum(r.pending_tokens for r in sim.running.prefilling.values())
    return running + sum(r.pending_tokens for r in queued(sim))


def sessions(sim: Simulator) -> list[str]:
    """The sessions an engine holds: running, queued or paused."""
    return [*sim.running.all, *(r.request_id for r in queued(sim)), *sim.paused]


def decode_load(sim: Simulator, heavy: Mapping[str, bool]) -> DecodeLoad:
    """A decode engine as TetriInfer's placement sees it: free KV in tokens and its sessions
    by predicted class."""
    held = sessions(sim)
    n_heavy = sum(1 for rid in held if heavy.get(rid, False))
    free = sim.kv.gpu_free * sim.p.block_size
    return DecodeLoad(free, n_heavy, len(held) - n_heavy)


def flip_load(sim: Simulator, role: str, away: int, busy: float) -> EngineLoad:
    """An engine's load as a flip reads it (the operator's `flips.load_of` on `/v1/load`):
    `busy`, its recent busy share; a prefill engine is drained with no prompt left to compute,
    a decode engine when it holds no session and has none `away` (being prefilled elsewhere,
    or its KV crossing)."""
    if role == "prefill":
        return EngineLoad(role, busy, prefill_backlog(sim) == 0 and not sim.running)
    return EngineLoad(role, busy, not sessions(sim) and away == 0)


def better_of_two(a: int, b: int, load: Callable[[int], float]) -> int:
    """The less loaded of `a` and `b`; ties go to `a` (the gateway's `better`)."""
    return a if load(a) <= load(b) else b


class Landings:
    """KV crossing the link: (time it lands, request, engine it lands on), earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, SimRequest, int]] = []
        self._seq = itertools.count()

    def push(self, at: float, r: SimRequest, engine: int) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), r, engine))

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop(self) -> tuple[SimRequest, int]:
        _, _, r, engine = heapq.heappop(self._heap)
        return r, engine
