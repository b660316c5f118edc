"""`interlude bench engine`: the real engine against stock vLLM, side by side, on this machine.

The InferCept trace is scaled to the tiny model (token counts and tool times divided by fixed
factors, so a run takes a minute, not hours) and replayed with Poisson arrivals into an engine
whose KV pool is small enough that memory is the bottleneck. Each arm starts its own engine:
* `vllm-prefix` / `vllm-noprefix`: stock vLLM; each call ends the request and the continuation
  is resubmitted with its whole context (prefix caching on: today's default; off: the paper's).
* `infercept`, `lamps`, `interlude`: our scheduler with that policy; calls park the request.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from interlude.engine.config import EngineConfig
from interlude.engine.session import ScriptedSession, SessionResult, Step
from interlude_loadgen.arrivals import poisson_arrivals, resolve_workload
from interlude_loadgen.types import TraceRequest

ARMS: dict[str, tuple[str | None, bool]] = {  # arm -> (policy, prefix caching)
    "vllm-prefix": (None, True),
    "vllm-noprefix": (None, False),
    "infercept": ("infercept", True),
    "lamps": ("lamps", True),
    "interlude": ("interlude", True),
}


@dataclass(frozen=True)
class EngineBenchSpec:
    model: str
    workload: str = "auto"
    rate: float = 2.0  # sessions per second
    duration_s: float = 30.0  # arrivals stop here; the run ends when every session has
    token_scale: float = 8.0  # trace token counts are divided by this
    time_scale: float = 10.0  # tool times are divided by this
    max_tool_s: float = 3.0  # and capped here
    num_gpu_blocks: int = 48
    host_blocks: int = 96
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rate", "duration_s", "token_scale", "time_scale", "max_tool_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineBenchSpec.{name} must be > 0")


def scale(r: TraceRequest, spec: EngineBenchSpec, sid: str) -> ScriptedSession:
    """`r` shrunk to the tiny model's budget; capped so one session fits the KV pool."""
    budget = (spec.num_gpu_blocks - 2) * 32 // 2
    prompt = max(8, min(int(r.prompt_tokens / spec.token_scale), budget // 2))
    steps: list[Step] = []
    total = prompt
    for seg in r.segments:
        gen = max(1, int(seg.gen_tokens / spec.token_scale))
        call = seg.call
        ret = max(1, int(call.return_tokens / spec.token_scale)) if call else 0
        if call is None or total + gen + ret > budget:
            steps.append(Step(max(1, min(gen, budget - total))))
            break
        delay = min(call.duration_s / spec.time_scale, spec.max_tool_s)
        steps.append(Step(gen, call.tool, delay, ret))
        total += gen + ret
    seed = sum(map(ord, sid))
    ids = tuple(16 + (seed + 17 * i) % 400 for i in range(prompt))
    return ScriptedSession(sid, ids, tuple(steps), kind=r.kind)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summarize(
    arm: str,
    results: list[SessionResult],
    wall: float,
    stats: dict[str, Any],
    resubmitted_context: int,
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    norm = [(r.end - r.start) / max(1, r.generated) for r in ok if r.end is not None]
    ttft = [r.first_token - r.start for r in ok if r.first_token is not None]
    queries, hits = stats.get("prefix_cache_queries", 0), stats.get("prefix_cache_hits", 0)
    if arm.startswith("vllm"):
        recompute = max(0, resubmitted_context - hits)
    else:
        recompute = sum(stats.get("recompute_tokens", {}).values())
    return {
        "arm": arm,
        "sessions": len(results),
        "finished": len(ok),
        "wall_s": wall,
        "finished_per_s": len(ok) / wall,
        "median_norm_latency_s": statistics.median(norm) if norm else float("nan"),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else float("nan"),
        "ttft_p99_s": percentile(ttft, 0.99),
        "recomputed_tokens": recompute,
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "swap_bytes": stats.get("swap_bytes", {}),
    }


async def _replay(
    engine: Any,
    sessions: list[tuple[float, ScriptedSession]],
    resubmit: bool,
    progress: Callable[[str], None],
) -> list[SessionResult]:
    t0 = time.monotonic()

    async def one(at: float, s: ScriptedSession) -> SessionResult:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        result: SessionResult = await engine.run_scripted(s, resubmit=resubmit)
        return result

    tasks = [asyncio.create_task(one(at, s)) for at, s in sessions]
    for done, fut in enumerate(asyncio.as_completed(tasks), 1):
        await fut
        if done % 10 == 0 or done == len(tasks):
            progress(f"  {done}/{len(tasks)} sessions done ({time.monotonic() - t0:.0f} s)")
    return [t.result() for t in tasks]


def run_arm(
    arm: str,
    spec: EngineBenchSpec,
    sessions: list[tuple[float, ScriptedSession]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    from interlude.engine.engine import Engine

    policy, prefix = ARMS[arm]
    config = EngineConfig(
        model=spec.model,
        policy=policy,
        prefix_caching=prefix,
        num_gpu_blocks=spec.num_gpu_blocks,
        host_blocks=spec.host_blocks,
    )
    engine = Engine(config)
    try:
        start = time.monotonic()
        results = asyncio.run(_replay(engine, sessions, policy is None, progress))
        wall = time.monotonic() - start
        time.sleep(0.5)
        stats = engine.stats()
    finally:
        engine.shutdown()
    resubmitted = sum(_resubmitted_context(s) for _, s in sessions) if policy is None else 0
    return summarize(arm, results, wall, stats, resubmitted)


def _resubmitted_context(s: ScriptedSession) -> int:
    """Tokens with KV before each resubmission: what stock vLLM must find or recompute."""
    total, context = 0, len(s.prompt_token_ids)
    for step in s.steps[:-1]:
        context += step.gen_tokens - 1  # the last sampled token has no KV yet
        total += context
        context += step.return_tokens
    return total


def run_engine_bench(
    spec: EngineBenchSpec, arms: list[str], progress: Callable[[str], None]
) -> dict[str, Any]:
    pool = (
        _auto_pool(spec.seed)
        if spec.workload == "auto"
        else resolve_workload(spec.workload, spec.seed)
    )
    arrivals = poisson_arrivals(pool, spec.rate, spec.duration_s, spec.seed)
    sessions = [(a.time_s, scale(a.request, spec, f"a{i}")) for i, a in enumerate(arrivals)]
    rows = []
    for arm in arms:
        progress(f"{arm}: {len(sessions)} sessions")
        rows.append(run_arm(arm, spec, sessions, progress))
    return {"spec": asdict(spec), "rows": rows}


def _auto_pool(seed: int) -> list[TraceRequest]:
    try:
        return resolve_workload("shared", seed)
    except ValueError:
        return resolve_workload("generated:mixed", seed)
