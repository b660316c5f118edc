"""`interlude bench engine`: the real engine against stock vLLM, side by side, on this machine.

The InferCept trace is scaled to the tiny model (token counts and tool times divided by fixed
factors) and replayed with Poisson arrivals into an engine whose KV pool is small enough that
memory is the bottleneck. Each arm starts its own engine:
* `vllm-prefix` / `vllm-noprefix`: stock vLLM; each call ends the request and the continuation
  is resubmitted with its whole context (prefix caching on: today's default; off: the paper's).
* `infercept`, `lamps`, `interlude`: our scheduler with that policy; calls park the request.

Metrics are the simulator's (`interlude.sim.metrics`, DESIGN section 4), so both benchmarks
mean the same thing: arrivals stop at `duration_s`, the run stops at the horizon (2 x duration,
as in `bench sim`) or when every session is done; throughput = sessions finished / (end - first
arrival), i.e. throughput at saturation when the rate overloads the engine; normalized latency
= (end - start - tool time) / output tokens, tool-returned tokens counted as output, sessions
still open at the horizon counted with their latency so far (a lower bound).
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from interlude.bench.engine_report import ratios, summarize_runs
from interlude.bench.scripted import ScriptedSession, SessionResult, Step
from interlude.engine.config import EngineConfig
from interlude.loadgen.markup import Markup
from interlude.loadgen.plan import Conversation, Scale, scaled
from interlude.sim.metrics import session_metrics
from interlude_workloads.arrivals import poisson_arrivals, resolve_workload
from interlude_workloads.types import TraceRequest

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
    # About 3x what stock vLLM sustains in this pool on 2 CPU cores (~5-6 sessions/s), so
    # finished/s is throughput at saturation and sessions queue for KV memory.
    rate: float = 16.0  # sessions per second
    duration_s: float = 30.0  # arrivals stop here
    horizon_s: float | None = None  # the run stops here; None: 2 x duration_s (as `bench sim`)
    # Contexts of ~100-600 tokens, so 2-10 sessions fill the pool (a KV block is 32 tokens).
    token_scale: float = 3.0  # trace token counts are divided by this
    time_scale: float = 10.0  # tool times are divided by this
    max_tool_s: float = 3.0  # and capped here
    num_gpu_blocks: int = 40
    host_blocks: int = 80
    seed: int = 0
    # The chat template's tokens, as `bench http` sends them (`--markup`): sessions then hold
    # the contexts of the HTTP comparison's conversations, without HTTP. Zero: token ids only.
    markup: Markup = field(default_factory=Markup)

    def __post_init__(self) -> None:
        for name in ("rate", "duration_s", "token_scale", "time_scale", "max_tool_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineBenchSpec.{name} must be > 0")
        if self.horizon_s is not None and self.horizon_s < self.duration_s:
            raise ValueError("EngineBenchSpec.horizon_s must be >= duration_s")

    @property
    def horizon(self) -> float:
        return self.horizon_s if self.horizon_s is not None else 2 * self.duration_s


def scale(r: TraceRequest, spec: EngineBenchSpec, sid: str) -> ScriptedSession:
    """`r` shrunk to the tiny model's budget; capped so one session fits the KV pool. The cut
    is the HTTP load generator's (`plan.scaled`). Scripted sessions send token ids, not chat
    messages; with `spec.markup` they also carry the template's tokens where a chat does (the
    prompt's and each answer's), so their contexts are those `bench http` sends."""
    budget = (spec.num_gpu_blocks - 2) * 32 // 2
    mk = spec.markup
    shrink = Scale(spec.token_scale, spec.time_scale, spec.max_tool_s, budget, mk)
    return scripted(scaled(r, shrink, sid, 0.0), mk)


def scripted(conv: Conversation, mk: Markup) -> ScriptedSession:
    """`conv` as a scripted session of token ids, with the template's tokens `mk` where a chat
    has them. The prompt's ids are derived from the conversation's id, except its first
    `mk.shared` tokens: the system block (`system_block`), as a chat's, so that a prefix
    cache shares it between conversations declaring the same tools; and after it the
    conversation's shared head (`shared_prefix_tokens`), derived from its `prefix_group`."""
    steps = tuple(
        Step(s.gen_tokens, s.tool, s.delay_s, s.return_tokens, mk.per_call_tokens if s.tool else 0)
        for s in conv.steps
    )
    tools = sorted({s.tool for s in conv.steps if s.tool})
    prompt = conv.prompt_tokens + mk.fixed(len(tools))
    system = system_block(mk, tools)
    # Seeded by a hash of the whole id, so that no two conversations share a prompt block a
    # prefix cache could find (a sum of the id's characters gave half of a run's conversations
    # the ids of another).
    rng = random.Random(zlib.crc32(conv.conv_id.encode()))
    shared = random.Random(zlib.crc32(conv.prefix_group.encode()))
    head = tuple(shared.randrange(16, 416) for _ in range(conv.shared_prefix_tokens))
    ids = (system + head)[: prompt - 1]
    ids += tuple(rng.randrange(16, 416) for _ in range(len(ids), prompt))
    return ScriptedSession(conv.conv_id, ids, steps, kind=conv.kind)


def declared(tools: Sequence[str]) -> list[str]:
    """The tools a chat's system block declares for a conversation calling `tools` (in name
    order): a client declares one when it calls none."""
    return sorted(tools) or ["tool"]


def system_block(mk: Markup, tools: Sequence[str]) -> tuple[int, ...]:
    """The ids of a chat's system block declaring `tools` (`declared`): a header every
    conversation shares, then each tool's declaration in name order (ids derived from the
    name), `mk.shared(len(declared(tools)))` in all. Two conversations share the header and
    the declarations up to their first different tool, as a template's render does."""
    if not mk.prefix_tokens:
        return ()
    names = declared(tools)
    header = max(0, mk.prefix_tokens - mk.per_tool_tokens)
    first = mk.prefix_tokens - header  # the first declaration's share of the measured prefix
    ids = [16 + (7 * i) % 400 for i in range(header)]
    for k, name in enumerate(names):
        seed = zlib.crc32(name.encode())
        ids += [16 + (seed + 17 * i) % 400 for i in range(first if k == 0 else mk.per_tool_tokens)]
    return tuple(ids)


def output_tokens(s: ScriptedSession, r: SessionResult) -> int:
    """Generated tokens plus the tokens of the tool answers received (as the simulator counts).

    A turn's list opens once the call before it has returned (for a session cut at the
    horizon while resubmitting, one answer may be missed: its latency is a lower bound anyway).
    """
    calls = max(0, len(r.turns) - 1)
    return r.generated + sum(step.return_tokens for step in s.steps[:calls])


def censored(
    runs: Sequence[tuple[ScriptedSession, SessionResult]], end: float
) -> tuple[list[float], list[float]]:
    """Every session's normalized latency and TTFT, as the simulator counts them
    (`sim.metrics.summarize`): one unfinished at `end` counts until then, and so does the TTFT
    of one that never got its first token (dropped, the sessions a policy starves would vanish
    from its tail)."""
    norm, ttft = [], []
    for s, r in runs:
        done = r.end if r.ok and r.end is not None else end
        norm.append((done - r.start - r.tool_wait_s) / max(1, output_tokens(s, r)))
        ttft.append((r.first_token if r.first_token is not None else end) - r.start)
    return norm, ttft


def summarize(
    arm: str,
    runs: list[tuple[ScriptedSession, SessionResult]],
    span: tuple[float, float],
    stats: dict[str, Any],
) -> dict[str, Any]:
    """`span`: (first arrival, end of the run) in `time.monotonic()` seconds."""
    first, end = span
    norm, ttft = censored(runs, end)
    e2e = [r.end - r.start for _, r in runs if r.ok and r.end is not None]
    queries, hits = stats.get("prefix_cache_queries", 0), stats.get("prefix_cache_hits", 0)
    if arm.startswith("vllm"):
        resubmitted = sum(_resubmitted_context(s, max(0, len(r.turns) - 1)) for s, r in runs)
        recompute = max(0, resubmitted - hits)
    else:
        recompute = sum(stats.get("recompute_tokens", {}).values())
    makespan = max(end - first, 1e-9)
    return {
        "arm": arm,
        "sessions": len(runs),
        "finished": len(e2e),
        **session_metrics(len(runs), norm, ttft, e2e, makespan),
        "recomputed_tokens": recompute,
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "swap_bytes": stats.get("swap_bytes", {}),
        "kv_waste_gb_s": stats.get("waste_gb_s", 0.0),
    }


SessionPlan = list[tuple[float, ScriptedSession]]  # (arrival time, session), by arrival


async def replay(
    engine: Any,
    sessions: SessionPlan,
    resubmit: bool,
    horizon: float,
    progress: Callable[[str], None],
) -> tuple[list[tuple[ScriptedSession, SessionResult]], tuple[float, float]]:
    """Sessions that arrived before the run stopped, with what they did; (first arrival, end)."""
    t0 = time.monotonic()
    results: list[SessionResult | None] = [None] * len(sessions)

    async def one(i: int, at: float, s: ScriptedSession) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        results[i] = r = SessionResult(s.session_id, start=time.monotonic())
        # Our result object, so a session cut at the horizon still shows what it did.
        await engine.run_scripted(s, resubmit, r)

    pending = {asyncio.create_task(one(i, at, s)) for i, (at, s) in enumerate(sessions)}
    while pending:
        left = t0 + horizon - time.monotonic()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(10.0, left))
        done = sum(1 for r in results if r is not None and r.ok)
        started = sum(1 for r in results if r is not None)
        t = time.monotonic() - t0
        progress(f"  {t:5.0f} s: {started}/{len(sessions)} arrived, {done} finished")
    end = min(time.monotonic(), t0 + horizon) if pending else time.monotonic()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    arrived = [(s, r) for (_, s), r in zip(sessions, results, strict=True) if r is not None]
    first = t0 + min((at for at, _ in sessions), default=0.0)
    return arrived, (first, end)


def engine_config(arm: str, spec: EngineBenchSpec) -> EngineConfig:
    policy, prefix = ARMS[arm]
    return EngineConfig(
        model=spec.model,
        policy=policy,
        prefix_caching=prefix,
        num_gpu_blocks=spec.num_gpu_blocks,
        host_blocks=spec.host_blocks,
    )


def run_arm(
    arm: str,
    spec: EngineBenchSpec,
    sessions: SessionPlan,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    from interlude.bench.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(engine_config(arm, spec))
    try:
        run = replay(engine, sessions, ARMS[arm][0] is None, spec.horizon, progress)
        runs, span = asyncio.run(run)
        time.sleep(0.5)
        stats = engine.stats()
    finally:
        engine.shutdown()
    return summarize(arm, runs, span, stats)


def _resubmitted_context(s: ScriptedSession, calls: int) -> int:
    """Tokens with KV before each of the first `calls` resubmissions: what stock vLLM must find
    in its prefix cache or recompute (a session cut at the horizon made only some)."""
    total, context = 0, len(s.prompt_token_ids)
    for step in s.steps[: min(calls, len(s.steps) - 1)]:
        context += step.gen_tokens
        total += context - 1  # the last sampled token has no KV yet
        context += step.return_tokens + step.markup_tokens
    return total


def run_engine_bench(
    spec: EngineBenchSpec, arms: list[str], progress: Callable[[str], None], repeats: int = 1
) -> dict[str, Any]:
    """Every arm on the same arrivals, `repeats` rounds of all arms (interleaved, so a slow
    spell on the machine does not land on one arm only); one row per run."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    sessions = sessions_at(pool_of(spec), spec)
    rows = []
    total = repeats * len(arms)
    for k in range(repeats):
        for n, arm in enumerate(arms, 1):
            progress(
                f"[{k * len(arms) + n}/{total}] {arm} (run {k + 1}/{repeats}): "
                f"{len(sessions)} sessions, horizon {spec.horizon:g} s"
            )
            rows.append(run_arm(arm, spec, sessions, progress) | {"run": k})
    summary = summarize_runs(rows)
    return {"spec": asdict(spec), "rows": rows, "summary": summary, "ratios": ratios(summary)}


def sessions_at(pool: list[TraceRequest], spec: EngineBenchSpec, prefix: str = "") -> SessionPlan:
    """Poisson arrivals at `spec.rate` from `pool`, scaled; ids (and so prompts) `prefix`ed."""
    arrivals = poisson_arrivals(pool, spec.rate, spec.duration_s, spec.seed)
    return [(a.time_s, scale(a.request, spec, f"{prefix}a{i}")) for i, a in enumerate(arrivals)]


def pool_of(spec: EngineBenchSpec) -> list[TraceRequest]:
    if spec.workload != "auto":
        return resolve_workload(spec.workload, spec.seed)
    try:
        return resolve_workload("shared", spec.seed)
    except ValueError:
        return resolve_workload("generated:mixed", spec.seed)
