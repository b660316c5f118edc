"""A rate sweep: every policy x every arrival rate, simulated in parallel worker processes.

All policies at one rate see the same arrivals (same seed), so differences are the policy's.
Arrivals stop at `duration_s`; the simulation then drains for up to another `duration_s`
(requests still open at that horizon count with their latency so far, a lower bound).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from interlude.policy import POLICIES, load_profile, make_policy
from interlude.sim.engine import SimConfig, Simulator
from interlude_loadgen import TraceRequest, default_trace_path, poisson_arrivals, resolve_workload

REFERENCE_POLICY = "vllm"  # the SLO is 3x its median normalized latency at the lowest rate
SLO_FACTOR = 3.0
POINT_FIELDS = (
    "rate",
    "normalized_latency_median",
    "normalized_latency_p90",
    "normalized_latency_p99",
    "throughput_rps",
    "ttft_mean",
    "ttft_p99",
    "e2e_mean",
    "e2e_p99",
    "waste_fraction",
    "waste_preserve_fraction",
    "waste_recompute_fraction",
    "waste_stall_fraction",
    "waste_contended_fraction",
    "recompute_fraction",
    "recomputed_tokens",
    "swapped_tokens",
    "arrived",
    "finished",
    "iterations",
    "steps",
    "wall_s",
)


@dataclass(frozen=True)
class SweepSpec:
    workload: str  # a trace path, "shared", "generated:NAME", or "auto" (shared if present)
    profile: str
    policies: tuple[str, ...]
    rates: tuple[float, ...]
    duration_s: float = 1800.0
    seed: int = 0
    workers: int = 0  # 0: one per CPU core

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("no policies to sweep")
        for name in self.policies:
            if name not in POLICIES:
                raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
        if not self.rates or min(self.rates) <= 0:
            raise ValueError("rates must be positive")
        if self.duration_s <= 0:
            raise ValueError("duration must be positive")
        if self.workers < 0:
            raise ValueError("workers must be >= 0")


def parse_rates(text: str) -> tuple[float, ...]:
    """'0.5:4:0.25' (start:stop:step, stop included) or '1,2,3'."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            n = math.floor((stop - start) / step + 1e-9) + 1
            return tuple(round(start + i * step, 10) for i in range(n))
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"bad rates {text!r}: use START:STOP:STEP or a comma list") from None


def resolve_spec(spec: str) -> str:
    """'auto' becomes 'shared' when the InferCept trace is at hand, else 'generated:mixed'."""
    if spec == "auto":
        return "shared" if default_trace_path() is not None else "generated:mixed"
    return spec


def resolve_pool(spec: str, seed: int) -> list[TraceRequest]:
    return resolve_workload(resolve_spec(spec), seed)


def run_point(
    pool: Sequence[TraceRequest], profile: str, policy: str, rate: float, duration: float, seed: int
) -> dict[str, Any]:
    p = load_profile(profile)
    arrivals = poisson_arrivals(pool, rate, duration, seed)
    sim = Simulator(p, make_policy(policy, p), arrivals, SimConfig(horizon_s=2 * duration), rate)
    t0 = time.perf_counter()
    metrics = sim.run()
    out = metrics.to_dict()
    out["wall_s"] = time.perf_counter() - t0
    return out


def run_sweep(
    spec: SweepSpec, on_point: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    workload = resolve_spec(spec.workload)
    pool = resolve_pool(workload, spec.seed)
    policies = list(spec.policies)
    jobs = [(policy, rate) for rate in spec.rates for policy in policies]
    low = min(spec.rates)
    if REFERENCE_POLICY not in policies:
        jobs.append((REFERENCE_POLICY, low))
    # Heaviest first so the last jobs to finish are short ones.
    jobs.sort(key=lambda j: -j[1])
    workers = spec.workers or os.cpu_count() or 1
    results: dict[tuple[str, float], dict[str, Any]] = {}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as ex:
        futures = {
            ex.submit(run_point, pool, spec.profile, pol, rate, spec.duration_s, spec.seed): (
                pol,
                rate,
            )
            for pol, rate in jobs
        }
        for fut in as_completed(futures):
            point = fut.result()
            results[futures[fut]] = point
            if on_point is not None:
                on_point(point)
    slo = SLO_FACTOR * results[(REFERENCE_POLICY, low)]["normalized_latency_median"]
    out: dict[str, Any] = {
        "workload": workload,
        "profile": spec.profile,
        "duration_s": spec.duration_s,
        "seed": spec.seed,
        "rates": list(spec.rates),
        "pool_size": len(pool),
        "slo_normalized_latency": slo,
        "reference_policy": REFERENCE_POLICY,
        "wall_s": time.perf_counter() - t0,
        "policies": {},
    }
    for pol in policies:
        points = [{k: results[(pol, r)][k] for k in POINT_FIELDS} for r in sorted(spec.rates)]
        out["policies"][pol] = {
            "sustainable_rate": sustainable_rate(points, slo),
            "points": points,
        }
    return out


def sustainable_rate(points: Sequence[dict[str, Any]], slo: float) -> float | None:
    """Highest rate up to which every swept rate keeps the median normalized latency <= SLO."""
    best = None
    for pt in sorted(points, key=lambda p: p["rate"]):
        if not pt["normalized_latency_median"] <= slo:
            break
        best = pt["rate"]
    return best
