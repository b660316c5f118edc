"""`interlude bench sim-check`: the simulator against the real scheduler on an emulated device.

For each policy and rate, the same Poisson arrivals of the same conversations run twice: in
the simulator (`sim.simulator.Simulator`) with the profile, and in a real engine in-process (vLLM's
scheduler and KV cache manager under ours, `ScriptedEngine`) on the emulated accelerator of that
profile (`engine/emulate.py`: the forward pass takes the profile's T_fwd, the KV pool and host
pool have its capacities). Both report the simulator's metrics (`sim.metrics.summarize`'s
definitions: every arrived conversation counted, unfinished ones censored at the horizon), on
the device's clock, and the sustainable rates of `bench sim` (`slo.sustainable_rate`) under one
SLO for both sides: 3x the simulator's reference policy's median at `slo_rate`.

The conversations are the trace's, their tool times divided by `time_scale` (both sides) so
that a run lasts minutes, not the trace's longest call; the engine's prefix cache is on for a
policy whose simulator has one (`Traits.prefix_cache`: all but the paper's v0 baselines), so
a discarded session's blocks found again count on both sides. `dilation` runs the emulated
device slower (tool times and arrival gaps with it, `Profile.dilated`), so the front end's CPU
work on 2 cores does not slow the device it emulates; rows are converted back to the device's
clock.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from interlude.bench.engine_bench import censored, declared, replay, scripted
from interlude.bench.http_emulated import Emulation
from interlude.bench.scripted import ScriptedSession, SessionResult
from interlude.bench.sweep import REFERENCE_POLICY
from interlude.loadgen.markup import Markup
from interlude.loadgen.plan import Scale, scaled
from interlude.policy import load_profile, make_policy, policy_class
from interlude.sim.config import SimConfig
from interlude.sim.metrics import mean, quantile
from interlude.sim.simulator import Simulator
from interlude.slo import SLO_FACTOR, sustainable_rate, sustainable_rate_tail
from interlude_workloads import Arrival, TraceCall, TraceRequest, poisson_arrivals, resolve_workload

# Below saturation, the bound on how far the two latency curves may be apart.
LATENCY_TOLERANCE = 0.15


@dataclass(frozen=True)
class CheckSpec:
    profile: str = "gptj-6b-a100-40g"
    policies: tuple[str, ...] = ("vllm", "infercept", "lamps", "interlude")
    rates: tuple[float, ...] = (4.0, 8.0, 12.0, 16.0)
    duration_s: float = 20.0  # seconds of arrivals (device clock)
    time_scale: float = 10.0  # the trace's tool times are divided by this, on both sides
    dilation: float = 3.0
    workload: str = "shared"
    seed: int = 0
    # The SLO is 3x the simulator's reference policy's median at this rate (`bench sim`'s
    # rule, at a rate of its own so that runs over different grids share one SLO).
    slo_rate: float = 2.0
    # The chat template's tokens, as `bench http` sends them (`markup.measure`): the engine's
    # sessions carry them where a chat does (`bench engine --markup`), the simulator's
    # conversations the same counts, so the in-process runs hold the HTTP run's contexts.
    markup: Markup = field(default_factory=Markup)
    # Also run the reference policy on the engine at `slo_rate`, and judge the engine's side
    # by its own SLO too (3x that run's median), as `bench http` judges its arms by stock
    # vLLM's: in-process and HTTP ratios are then each in their own terms.
    reference_on_engine: bool = False

    def __post_init__(self) -> None:
        if not self.policies or not self.rates:
            raise ValueError("CheckSpec needs at least one policy and one rate")
        for p in self.policies:
            make_policy(p, load_profile(self.profile))  # a clear ValueError for a bad name
        if min(self.rates) <= 0 or min(self.duration_s, self.time_scale, self.slo_rate) <= 0:
            raise ValueError("CheckSpec: rates, duration_s, time_scale, slo_rate must be > 0")
        Emulation(self.profile, self.dilation)  # checks the profile and the dilation

    def arrivals(self, rate: float) -> list[Arrival]:
        """The run's conversations at `rate`: Poisson arrivals from the workload, tool times
        divided by `time_scale` (device clock)."""
        pool = resolve_workload(self.workload, self.seed)
        return [
            replace(a, request=engine_ready(tool_times(a.request, 1.0 / self.time_scale)))
            for a in poisson_arrivals(pool, rate, self.duration_s, self.seed)
        ]

    def horizon(self, arrivals: Sequence[Arrival]) -> float:
        """The duration plus 1.2x the most tool time a conversation spends: long enough for
        every conversation to finish when the engine keeps up (`Emulation.whole_horizon`)."""
        tool = (sum(s.call.duration_s for s in a.request.segments if s.call) for a in arrivals)
        return self.duration_s + 1.2 * max(tool, default=0.0)


def simulate(spec: CheckSpec, policy: str, rate: float) -> dict[str, Any]:
    """One simulated run: the simulator's metrics, device clock."""
    p = load_profile(spec.profile)
    arrivals = spec.arrivals(rate)
    mk = spec.markup
    config = SimConfig(horizon_s=spec.horizon(arrivals), answer_markup_tokens=mk.per_call_tokens)
    arrivals = [replace(a, request=prompt_markup(a.request, mk)) for a in arrivals]
    metrics = Simulator(p, make_policy(policy, p), arrivals, config, rate).run().to_dict()
    return {**metrics, "side": "sim", "policy": policy, "rate": rate}


def run_engine(
    spec: CheckSpec, policy: str, rate: float, scratch: Path, progress: Callable[[str], None]
) -> dict[str, Any]:
    """One run of a real engine with `policy` on the emulated device: the same arrivals,
    `dilation` times slower on the wall clock; metrics on the device's clock."""
    from interlude.bench.scripted_engine import ScriptedEngine
    from interlude.engine.config import EngineConfig

    emulation = Emulation(spec.profile, spec.dilation)
    profile_path, device = emulation.prepare(scratch)
    k = spec.dilation
    arrivals = spec.arrivals(rate)
    plan = [(a.time_s * k, _session(a, k, spec.markup)) for a in arrivals]
    config = EngineConfig(
        model=str(device.model_dir),
        policy=policy,
        profile=profile_path,
        num_gpu_blocks=device.blocks,
        host_blocks=device.host_blocks,
        max_num_seqs=device.max_num_seqs,
        max_num_batched_tokens=device.max_num_batched_tokens,
        prefix_caching=policy_class(policy).traits.prefix_cache,
    )
    engine = ScriptedEngine(config)
    try:
        runs, span = asyncio.run(replay(engine, plan, False, spec.horizon(arrivals) * k, progress))
        time.sleep(0.5)  # the last step's counters
        stats = engine.stats()
    finally:
        engine.shutdown()
    row = engine_metrics(runs, span, k)
    swapped = sum(stats.get("swap_bytes", {}).values()) / device.profile.kv_bytes_per_token
    return {
        **row,
        "side": "engine",
        "policy": policy,
        "rate": rate,
        "arrived": len(runs),
        "recomputed_tokens": sum(stats.get("recompute_tokens", {}).values()),
        "prefix_hit_tokens": stats.get("prefix_restored_tokens", 0),
        "swapped_tokens": int(swapped),
        # What explains a disagreement: recomputes by reason (discard, preempt, stall), how
        # resumed turns got their KV back, and the scheduler's own time per step (wall).
        "recompute_by_reason": stats.get("recompute_tokens", {}),
        "resumes": stats.get("resumes", {}),
        "scheduler_ms_per_step": 1e3 * stats.get("step_s", 0.0) / max(1, stats.get("steps", 0)),
    }


def _with_calls(r: TraceRequest, change: Callable[[TraceCall], TraceCall]) -> TraceRequest:
    segments = tuple(replace(s, call=change(s.call)) if s.call else s for s in r.segments)
    return replace(r, segments=segments)


def tool_times(r: TraceRequest, factor: float) -> TraceRequest:
    """`r` with every call's duration multiplied by `factor`."""
    return _with_calls(r, lambda c: replace(c, duration_s=c.duration_s * factor))


def engine_ready(r: TraceRequest) -> TraceRequest:
    """`r` with every tool answer at least one token long: the answer is the engine's next
    input, so a resumed turn needs one (the trace has empty answers; the simulator would take
    them, and both sides must run the same conversations)."""
    return _with_calls(r, lambda c: replace(c, return_tokens=max(1, c.return_tokens)))


def prompt_markup(r: TraceRequest, mk: Markup) -> TraceRequest:
    """`r`'s prompt as a chat's: the template's tokens with the conversation's tools declared,
    where `scripted` adds them on the engine's side. Its system block opens the prompt, the
    same in every conversation declaring the same tools, and `r`'s own shared head follows
    it: both are shared by the conversations with `r`'s tools and group. (Each answer's
    markup reaches the simulator as `SimConfig.answer_markup_tokens`: context, not output, as
    on the engine.)"""
    called = {c.tool for c in r.calls}
    names = declared(list(called))  # as `system_block` declares them
    shared = mk.shared(len(names)) + r.shared_prefix_tokens
    return replace(
        r,
        prompt_tokens=r.prompt_tokens + mk.fixed(len(called)),
        shared_prefix_tokens=shared,
        prefix_group=f"{r.prefix_group}|{','.join(names)}" if shared else "",
    )


def _session(a: Arrival, k: float, mk: Markup) -> ScriptedSession:
    """The arrival's conversation as the engine replays it, token for token as the simulator
    sees it (nothing cut; the template's tokens `mk`, where `simulate` gives them the simulator),
    its tool times `k` times longer."""
    return scripted(scaled(a.request, Scale(time_scale=1.0 / k), a.arrival_id, 0.0), mk)


def engine_metrics(
    runs: Sequence[tuple[ScriptedSession, SessionResult]], span: tuple[float, float], k: float
) -> dict[str, float]:
    """The simulator's metrics of an engine's runs (`sim.metrics.summarize`): unfinished
    sessions censored at the run's end, TTFT of one without a first token counted to the end;
    wall-clock seconds divided by the dilation `k`."""
    first, end = span
    norm, ttft = ([x / k for x in xs] for xs in censored(runs, end))
    finished = sum(1 for _, r in runs if r.ok and r.end is not None)
    makespan = max(end - first, 1e-9) / k
    return {
        "finished": finished,
        "unfinished_fraction": 1 - finished / len(runs) if runs else 0.0,
        "normalized_latency_median": quantile(norm, 0.5),
        "normalized_latency_p90": quantile(norm, 0.9),
        "normalized_latency_p99": quantile(norm, 0.99),
        "throughput_rps": finished / makespan,
        "ttft_mean": mean(ttft),
        "ttft_p99": quantile(ttft, 0.99),
        "makespan_s": makespan,
    }


def run_sim_check(
    spec: CheckSpec,
    scratch: Path,
    progress: Callable[[str], None],
    on_row: Callable[[dict[str, Any]], None] | None = None,
    engine: bool = True,
    done: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Every (policy, rate) in the simulator, then on the emulated engine (`engine`: False runs
    the simulator only); `on_row` sees each row as it lands (to save partial results). `done`:
    engine rows of an earlier, interrupted check of the same spec, kept instead of run again."""
    rows: list[dict[str, Any]] = []
    kept = {(r["policy"], r["rate"]): r for r in done if r["side"] == "engine"}

    def add(row: dict[str, Any]) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(row)

    for policy in spec.policies:
        for rate in spec.rates:
            add(simulate(spec, policy, rate))
    runs = [(p, r) for p in spec.policies for r in spec.rates] if engine else []
    if engine and spec.reference_on_engine and (REFERENCE_POLICY, spec.slo_rate) not in runs:
        runs.insert(0, (REFERENCE_POLICY, spec.slo_rate))
    for n, (policy, rate) in enumerate(runs, 1):
        if (policy, rate) in kept:
            progress(f"[{n}/{len(runs)}] engine, {policy} at {rate:g}/s: kept from the last run")
            add(kept[policy, rate])
            continue
        progress(f"[{n}/{len(runs)}] engine, {policy} at {rate:g}/s")
        add(run_engine(spec, policy, rate, scratch, progress))
    return {"spec": asdict(spec), "rows": rows, "verdict": verdict(spec, rows)}


def points(rows: Sequence[dict[str, Any]], side: str, policy: str) -> list[dict[str, Any]]:
    return sorted(
        (r for r in rows if r["side"] == side and r["policy"] == policy), key=lambda r: r["rate"]
    )


def verdict(spec: CheckSpec, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The SLO (3x the simulator's reference policy's median at `spec.slo_rate`), each
    side's sustainable rates under it, and per policy whether the two agree: the rates within
    one step of the grid, the median latencies within `LATENCY_TOLERANCE` at every rate up to
    the simulator's median rate."""
    slo = SLO_FACTOR * simulate(spec, REFERENCE_POLICY, spec.slo_rate)["normalized_latency_median"]
    grid = sorted(spec.rates)
    step = min((b - a for a, b in itertools.pairwise(grid)), default=0.0)
    out: dict[str, Any] = {"slo": slo, "rate_step": step, "policies": {}}
    own = engine_slo(spec, rows)
    if own is not None:
        out["engine_slo"] = own
    for policy in spec.policies:
        sim, real = points(rows, "sim", policy), points(rows, "engine", policy)
        entry: dict[str, Any] = {
            "sim_rate_median": sustainable_rate(sim, slo),
            "sim_rate_tail": sustainable_rate_tail(sim, slo),
        }
        if real:
            entry |= _agreement(sim, real, slo, step)
            if own is not None:
                entry["engine_own_slo_rates"] = [
                    sustainable_rate(real, own),
                    sustainable_rate_tail(real, own),
                ]
        out["policies"][policy] = entry
    return out


def engine_slo(spec: CheckSpec, rows: Sequence[dict[str, Any]]) -> float | None:
    """3x the engine's median for the reference policy at `slo_rate`, when it ran there."""
    ref = [r for r in points(rows, "engine", REFERENCE_POLICY) if r["rate"] == spec.slo_rate]
    return SLO_FACTOR * ref[0]["normalized_latency_median"] if ref else None


def _agreement(
    sim: list[dict[str, Any]], real: list[dict[str, Any]], slo: float, step: float
) -> dict[str, Any]:
    engine_median = sustainable_rate(real, slo)
    sim_median = sustainable_rate(sim, slo)
    by_rate = {r["rate"]: r for r in real}
    below = [p for p in sim if sim_median is not None and p["rate"] <= sim_median]
    gaps = {
        p["rate"]: by_rate[p["rate"]]["normalized_latency_median"] / p["normalized_latency_median"]
        - 1
        for p in below
        if p["rate"] in by_rate
    }
    apart = abs((engine_median or 0.0) - (sim_median or 0.0))
    return {
        "engine_rate_median": engine_median,
        "engine_rate_tail": sustainable_rate_tail(real, slo),
        "median_gap_below_saturation": gaps,
        "rates_agree": apart <= step + 1e-9,
        "latency_agrees": all(abs(g) <= LATENCY_TOLERANCE for g in gaps.values()),
    }
