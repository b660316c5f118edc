"""KV bookkeeping for parked (paused) requests inside the vLLM scheduler: it counts, it never
decides. The scheduler records here what the policy did; metrics and tests read it back.

A parked request's tokens are split as the policy sees them: `gpu_tokens` still in GPU blocks
that are not yet copied out, `cpu_tokens` in the host pool, the rest to be recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_TURN_STARTS = 4096  # turn starts kept for the stats, while nobody takes them
MAX_TOOL_LABELS = 64  # distinct tool names counted apart; the rest count as "other"


@dataclass
class Parked:
    """One paused request (mutable: the scheduler updates it as swaps and discards happen)."""

    request_id: str
    kind: str
    arrival: float  # session arrival, not the turn's
    paused_at: float
    tool: str | None
    calls_done: int
    frontier: int  # tokens with KV at the pause (prompt + kept output)
    gpu_blocks: int  # GPU blocks held at the pause
    # Blocks covered off the GPU so far, a prefix of the request's blocks: the leading ones
    # shared through the prefix cache (not copied: freeing them frees nothing, and on resume
    # the prefix cache finds them), then the ones copied to host.
    saved_blocks: int = 0
    shared_blocks: int = 0  # of those, the leading blocks that were shared, not copied
    # Leading blocks already given back to vLLM's pool after the step that copied them, as
    # the simulator frees a partial swap's blocks: what the policy sees as swapped is not
    # also held on the GPU.
    freed_blocks: int = 0
    on_gpu: bool = True  # False once all its GPU blocks are freed (swapped out or discarded)

    def split(self, block_size: int) -> tuple[int, int]:
        """(gpu_tokens, cpu_tokens) as the policy sees them."""
        cpu = min(self.frontier, self.saved_blocks * block_size)
        if not self.on_gpu:
            return 0, cpu
        return self.frontier - cpu, cpu


@dataclass
class Counters:
    """Cumulative engine counters, exported as `interlude:*` metrics (see engine/metrics.py)."""

    interceptions: dict[str, int] = field(default_factory=dict)  # by tool
    resumes: dict[str, int] = field(default_factory=dict)  # by how the KV came back
    recompute_tokens: dict[str, int] = field(default_factory=dict)  # by reason
    prefix_restored_tokens: int = 0  # discarded tokens found again in the prefix cache
    swap_bytes: dict[str, int] = field(default_factory=lambda: {"out": 0, "in": 0})
    waste_gb_s: float = 0.0  # GB x s of GPU KV held by paused requests
    # The part of it held while requests waited in the queue (the simulator's rule, too):
    # raw waste is high by design when memory is free; this is the part someone paid for.
    waste_contended_gb_s: float = 0.0
    resumed_tokens: int = 0  # context parked requests held when they resumed (not re-prefilled)
    used_gb_s: float = 0.0  # GB x s of GPU KV in use by anyone (waste ratio denominator)
    paused: dict[str, int] = field(default_factory=dict)  # gauge: parked requests by strategy
    # The engine's side of a resumed turn, by how its KV came back: seconds from the tool's
    # answer to the turn's first scheduled step (admission, swap-in budget), and how many.
    resume_wait_s: dict[str, float] = field(default_factory=dict)
    resume_waits: dict[str, int] = field(default_factory=dict)
    # Wall seconds inside scheduler steps, of them vLLM's own scheduling (the rest is ours:
    # the policy's view and decision, moves, accounting), and how many steps.
    step_s: float = 0.0
    vllm_s: float = 0.0
    steps: int = 0
    # Wall seconds from a step that scheduled tokens to the next: the engine was busy (its
    # recent share is `/v1/load`'s busy_share, which role flips read).
    busy_s: float = 0.0

    def add_step(self, step_s: float, vllm_s: float) -> None:
        self.step_s += step_s
        self.vllm_s += vllm_s
        self.steps += 1

    def bump(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def as_dict(self) -> dict[str, object]:
        return {
            "interceptions": dict(self.interceptions),
            "resumes": dict(self.resumes),
            "recompute_tokens": dict(self.recompute_tokens),
            "prefix_restored_tokens": self.prefix_restored_tokens,
            "swap_bytes": dict(self.swap_bytes),
            "waste_gb_s": self.waste_gb_s,
            "waste_contended_gb_s": self.waste_contended_gb_s,
            "resumed_tokens": self.resumed_tokens,
            "used_gb_s": self.used_gb_s,
            "paused": dict(self.paused),
            "resume_wait_s": dict(self.resume_wait_s),
            "resume_waits": dict(self.resume_waits),
            "step_s": self.step_s,
            "vllm_s": self.vllm_s,
            "steps": self.steps,
            "busy_s": self.busy_s,
        }


class ParkingLot:
    """Parked requests by id, plus requests resumed cold (their KV must come back)."""

    def __init__(self, block_size: int, block_bytes: int) -> None:
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.parked: dict[str, Parked] = {}
        self.cold: dict[str, int] = {}  # resumed without GPU KV -> frontier to restore
        # Resumed turns scheduled since the last stats: id -> (how the KV came back, wait s).
        self.turn_starts: dict[str, tuple[str, float]] = {}
        self.free_after_step: set[str] = set()  # swap-out done this step: free after it runs
        self.copied_this_step: set[str] = set()  # part copied this step: free that part after
        self.resumed_at: dict[str, float] = {}  # resumed, not yet scheduled -> when it resumed
        self.counters = Counters()

    def park(self, p: Parked) -> None:
        self.parked[p.request_id] = p
        tools = self.counters.interceptions
        tool = p.tool or "unknown"
        # Tool names are the model's (or a script's): a Prometheus label each, so bounded.
        if tool not in tools and len(tools) >= MAX_TOOL_LABELS:
            tool = "other"
        self.counters.bump(tools, tool)

    def strategy(self, p: Parked) -> str:
        if p.on_gpu:
            return "swapping" if p.saved_blocks else "preserve"
        return "swap" if p.saved_blocks else "discard"

    def gpu_blocks_held(self) -> int:
        return sum(p.gpu_blocks - p.freed_blocks for p in self.parked.values() if p.on_gpu)

    def tick(self, dt: float, used_blocks: int, contended: bool = False) -> None:
        """Account `dt` seconds of the current state (called once per scheduler step);
        `contended`: requests were waiting in the queue meanwhile."""
        gb = self.block_bytes / 1e9
        held = self.gpu_blocks_held() * gb * dt
        self.counters.waste_gb_s += held
        if contended:
            self.counters.waste_contended_gb_s += held
        self.counters.used_gb_s += used_blocks * gb * dt
        paused: dict[str, int] = {"preserve": 0, "swapping": 0, "swap": 0, "discard": 0}
        for p in self.parked.values():
            paused[self.strategy(p)] += 1
        self.counters.paused = paused

    def unpark(self, request_id: str) -> Parked | None:
        self.free_after_step.discard(request_id)
        self.copied_this_step.discard(request_id)
        return self.parked.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self.unpark(request_id)
        self.cold.pop(request_id, None)
        self.resumed_at.pop(request_id, None)

    def count_waits(self, scheduled: Mapping[str, int], via: Mapping[str, str], now: float) -> None:
        """Count the waits of resumed turns that `scheduled` (request id -> tokens this step)
        schedules first; `via`: how a cold one's KV came back (absent: it stayed on the GPU)."""
        c = self.counters
        for rid in [r for r in self.resumed_at if r in scheduled]:
            how, wait = via.get(rid, "preserve"), now - self.resumed_at.pop(rid)
            c.resume_wait_s[how] = c.resume_wait_s.get(how, 0.0) + wait
            c.bump(c.resume_waits, how)
            self.turn_starts[rid] = (how, wait)
        while len(self.turn_starts) > MAX_TURN_STARTS:  # nobody took them (stats off)
            del self.turn_starts[next(iter(self.turn_starts))]
