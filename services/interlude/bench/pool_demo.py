"""`interlude bench pool`: a pool of engines scaled by the operator's rule, on one machine.

A real stack as `interlude up --min-engines` starts it (Valkey, a tools worker, the gateway
reading the pool's roster, `min_engines` engines, on an emulated accelerator when asked),
supervised and scaled from this process (`stack.pool.LocalPool`, the operator's decision code).
Conversations arrive in phases of rising rate through the gateway; then none, until the pool
is back at its minimum (or `settle_s` passes). The result holds every pass of the pool (what it
read, what it decided), the load's phases on the same clock, and how the conversations ended.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from interlude.loadgen.client import Target
from interlude.loadgen.plan import Scale, conversations
from interlude.loadgen.replay import replay
from interlude.loadgen.text import TextMaker
from interlude.stack.pool import LocalPool, PoolConfig
from interlude.stack.procs import Part, PartSpec
from interlude.stack.supervise import SupervisorThread, supervisor_for
from interlude.stack.up import StackConfig, down, up


@dataclass(frozen=True)
class PoolDemoSpec:
    """The pool's bounds, windows and targets; the load's phases (seconds, conversations/s)."""

    min_engines: int = 1
    max_engines: int = 4
    phases: tuple[tuple[float, float], ...] = ((60.0, 0.5), (180.0, 4.0))
    settle_s: float = 300.0  # after the load: until the pool is back at min_engines, at most
    # A conversation still running this long after the load is given up, and a session left
    # parked by a client that went away is freed this long after its pause.
    grace_s: float = 240.0
    client_deadline_s: float = 30.0
    up_window_s: float = 15.0
    down_window_s: float = 60.0
    targets: str = ""  # `stack.pool.parse_targets`; "" = the operator's defaults
    emulate: str | None = "llama3-8b-h100"
    blocks: int | None = None  # each engine's KV blocks (None: the profile's)
    workload: str = "shared"
    seed: int = 0
    scale: Scale = field(default_factory=Scale)

    def __post_init__(self) -> None:
        if not self.phases or any(d <= 0 or r < 0 for d, r in self.phases):
            raise ValueError("phases are (seconds > 0, rate >= 0) pairs, at least one")
        if min(self.settle_s, self.grace_s) < 0 or self.client_deadline_s <= 0:
            raise ValueError("settle_s and grace_s must be >= 0, client_deadline_s > 0")
        self.pool_config()  # the bounds, windows and targets, checked now

    def pool_config(self) -> PoolConfig:
        return PoolConfig.between(
            self.min_engines, self.max_engines, self.up_window_s, self.down_window_s, self.targets
        )

    @property
    def load_s(self) -> float:
        return sum(d for d, _ in self.phases)


def plan_phases(spec: PoolDemoSpec) -> tuple[list[Any], list[dict[str, float]]]:
    """The conversations of every phase, one after the other, and the phases' times."""
    plan: list[Any] = []
    phases, start = [], 0.0
    for i, (duration, rate) in enumerate(spec.phases):
        if rate > 0:
            convs = conversations(
                spec.workload, rate, duration, spec.seed + i, spec.scale, f"p{i}-"
            )
            plan += [replace(c, arrival_s=c.arrival_s + start) for c in convs]
        phases.append({"start_s": start, "end_s": start + duration, "rate": rate})
        start += duration
    return plan, phases


async def _drive(gateway: str, plan: list[Any], texts: TextMaker, horizon_s: float) -> Any:
    async with httpx.AsyncClient() as http:
        model = (await http.get(gateway + "/models")).json()["data"][0]["id"]
    return await replay(Target(gateway, model, "resume"), plan, texts, horizon_s)


def run_pool_demo(
    spec: PoolDemoSpec, run_dir: Path, texts: TextMaker, say: Callable[[str], None]
) -> dict[str, Any]:
    """Start the scaled stack in `run_dir`, run the load, wait for the pool to settle, stop."""
    cfg = StackConfig(
        run_dir=run_dir,
        engines=spec.max_engines,
        min_engines=spec.min_engines,
        emulate=spec.emulate,
        blocks=spec.blocks,
        benchmark_mode=True,  # scripted calls (`interlude_script`)
        client_deadline_s=spec.client_deadline_s,
    )
    (run_dir / "pool.jsonl").unlink(missing_ok=True)
    parts: list[Part] = []
    spares: list[tuple[PartSpec, str]] = []
    say(f"starting the stack with {spec.min_engines} of up to {spec.max_engines} engines")
    state = up(cfg, started=parts, spares=spares)
    supervisor = supervisor_for(state, parts, say)
    pool = LocalPool.for_stack(spec.pool_config(), state, parts, spares, supervisor, say)
    scaled = SupervisorThread(supervisor, tick=pool.tick)
    try:
        plan, phases = plan_phases(spec)
        say(f"{len(plan)} conversations over {spec.load_s:.0f} s in {len(phases)} phases")
        load_t0 = time.monotonic() - pool.started_at
        done, _span = asyncio.run(
            _drive(state.gateway + "/v1", plan, texts, spec.load_s + spec.grace_s)
        )
        load_end = time.monotonic() - pool.started_at
        say(f"load over at {load_end:.0f} s; waiting for {spec.min_engines} engines again")
        deadline = time.monotonic() + spec.settle_s
        while not pool.at_rest(spec.min_engines) and time.monotonic() < deadline:
            time.sleep(1.0)
        settled = pool.at_rest(spec.min_engines)
    finally:
        scaled.stop()
        down(Path(state.run_dir))
    passes = [json.loads(x) for x in (run_dir / "pool.jsonl").read_text().splitlines()]
    ok = sum(1 for _c, r in done if r.ok)
    failed = Counter((r.error or "")[:200] for _c, r in done if r.error is not None)
    unfinished = sum(1 for _c, r in done if r.error is None and not r.ok)
    return {
        "spec": asdict(spec) | {"scale": None},
        "load_start_s": load_t0,
        "load_end_s": load_end,
        "phases": [
            p | {"start_s": p["start_s"] + load_t0, "end_s": p["end_s"] + load_t0} for p in phases
        ],
        "conversations": {
            "planned": len(plan),
            "arrived": len(done),
            "finished": ok,
            "still_running": unfinished,  # at the end of the grace: given up, not failed
            "errors": dict(failed),
        },
        "settled": settled,
        "targets": asdict(spec.pool_config().targets),
        "gave_up": scaled.gave_up,
        "passes": passes,
    }
