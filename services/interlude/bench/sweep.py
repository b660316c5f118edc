"""A rate sweep: every policy x every arrival rate, simulated in parallel worker processes.

All policies at one rate see the same arrivals (same seed), so differences are the policy's.
Arrivals stop at `duration_s`; the simulation then drains for up to another `duration_s`
(requests still open at that horizon count with their latency so far, a lower bound).

Two sustainable rates per policy, by the rules of `interlude.slo` (median: InferCept's; tail:
the median, the p99 and at most 1 % unfinished), the SLO set by `vllm-v0` at the lowest rate.

Unless `full`, a policy's higher rates are not simulated once both rates are settled and it has
failed the tail rule at two consecutive rates (see `skip_above`); those points are kept in the
output marked `skipped`, with no metrics.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from interlude.bench.bound import rate_bound
from interlude.bench.compiled_build import is_active, worker_pool
from interlude.policy import load_profile, make_policy, policy_class
from interlude.sim.config import SimConfig
from interlude.sim.simulator import Simulator
from interlude.slo import (
    MAX_UNFINISHED_FRACTION,
    SLO_FACTOR,
    TAIL_FACTOR,
    skip_above,
    sustainable_rate,
    sustainable_rate_tail,
)
from interlude_workloads import TraceRequest, default_trace_path, poisson_arrivals, resolve_workload

# The SLO is 3x its median normalized latency at the lowest rate: vLLM as InferCept measured
# it (v0, no prefix cache), as `bench engine` and `bench http` take stock vLLM without one.
REFERENCE_POLICY = "vllm-v0"
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
    "unfinished",
    "unfinished_fraction",
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
    full: bool = False  # simulate every rate, even past two consecutive failures
    # Run the points on the mypyc build (`bench.compiled_build`; it must exist): same results.
    compiled: bool = False

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("no policies to sweep")
        for name in self.policies:
            policy_class(name)  # ValueError naming what is wrong: ours, or "module:Class"
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
    out["compiled"] = is_active()
    return out


PointFn = Callable[[Sequence[TraceRequest], str, str, float, float, int], dict[str, Any]]


class _Schedule:
    """A sweep's bookkeeping apart from its worker pool: which (policy, rate) runs next, which
    results are kept, and when a policy stops.

    The reference's lowest rate runs first (the SLO needs it); then the policy with the fewest
    runs in flight, at its lowest rate left, so every policy climbs at about the same pace and
    reaches its failures early. Which points are kept depends only on the results, never on
    the order they finished in (`settle`).
    """

    def __init__(self, policies: list[str], rates: list[float], full: bool) -> None:
        self.policies, self.rates, self.full = policies, rates, full
        self.ref = (REFERENCE_POLICY, rates[0])
        self.pending: dict[str, deque[float]] = {pol: deque(rates) for pol in policies}
        self.ref_pending = REFERENCE_POLICY not in policies
        self.busy: Counter[str] = Counter()
        self.results: dict[tuple[str, float], dict[str, Any]] = {}
        self.last_kept: dict[str, float] = {}  # policy -> its last rate kept; higher: skipped
        self.slo: float | None = None

    def next_job(self) -> tuple[str, float] | None:
        """The next run to start (counted as in flight), or None if none is left."""
        if self.ref_pending:
            self.ref_pending = False
            job = self.ref
        else:
            ready = [
                (self.busy[p], self.pending[p][0], i, p)
                for i, p in enumerate(self.policies)
                if self.pending[p]
            ]
            if not ready:
                return None
            pol = min(ready)[3]
            job = (pol, self.pending[pol].popleft())
        self.busy[job[0]] += 1
        return job

    def finished(self, job: tuple[str, float], point: dict[str, Any]) -> bool:
        """Record a finished run; whether it is kept (False: its policy already stopped below
        its rate, and it was reported as skipped)."""
        pol, rate = job
        self.busy[pol] -= 1
        if rate > self.last_kept.get(pol, math.inf):
            return False  # keeping it would depend on timing
        self.results[job] = point
        return True

    def settle(self) -> list[tuple[str, float]]:
        """Set the SLO once the reference has run, and stop each policy whose sustainable
        rates are settled (`skip_above`); the (policy, rate) points newly skipped."""
        if self.slo is None and self.ref in self.results:
            self.slo = SLO_FACTOR * self.results[self.ref]["normalized_latency_median"]
        if self.slo is None or self.full:
            return []
        skipped: list[tuple[str, float]] = []
        for pol in self.policies:
            if pol in self.last_kept:
                continue
            known = {r: self.results[(pol, r)] for r in self.rates if (pol, r) in self.results}
            last = skip_above(self.rates, known, self.slo)
            if last is None:
                continue
            self.last_kept[pol] = last
            self.pending[pol].clear()
            for r in self.rates:
                # A run above `last` that finished early (out of order) was reported as a
                # point already: drop its result so the output does not depend on timing,
                # and do not report it twice (progress counts every point once).
                if r > last and self.results.pop((pol, r), None) is None:
                    skipped.append((pol, r))
        return skipped


def run_sweep(
    spec: SweepSpec,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    *,
    point_fn: PointFn = run_point,
) -> dict[str, Any]:
    """Simulate every (policy, rate), reporting each to `on_point` as it is settled.

    Each policy's rates are submitted in ascending order, at most `workers` runs in flight, so a
    policy that has failed can stop before its heaviest (overloaded, slowest) rates start. Which
    points the output holds depends only on the results, never on the scheduling: a policy skips
    every rate above `skip_above`'s answer, and a run above it that was already under way or done
    is dropped. Skipped points reach `on_point` as `{"policy", "rate", "skipped": True}`.
    `point_fn` stands in for `run_point` (tests; it must be picklable).
    """
    workload = resolve_spec(spec.workload)
    pool = resolve_pool(workload, spec.seed)
    schedule = _Schedule(list(spec.policies), sorted(set(spec.rates)), spec.full)
    report = on_point or (lambda point: None)
    workers = spec.workers or os.cpu_count() or 1
    in_flight: dict[Future[dict[str, Any]], tuple[str, float]] = {}
    t0 = time.perf_counter()
    with worker_pool(workers, spec.compiled) as ex:
        while True:
            while len(in_flight) < workers and (job := schedule.next_job()) is not None:
                pol, rate = job
                fut = ex.submit(point_fn, pool, spec.profile, pol, rate, spec.duration_s, spec.seed)
                in_flight[fut] = job
            if not in_flight:
                break
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for fut in done:
                job, point = in_flight.pop(fut), fut.result()
                if point.get("compiled", spec.compiled) != spec.compiled:
                    raise RuntimeError(
                        f"{job[0]} @ {job[1]}: ran "
                        f"{'pure Python' if spec.compiled else 'compiled'}, "
                        "not as asked (a build that does not match the sources?)"
                    )
                if schedule.finished(job, point):
                    report(point)
            for pol, rate in schedule.settle():
                report({"policy": pol, "rate": rate, "skipped": True})
    return _output(spec, workload, pool, schedule, time.perf_counter() - t0)


def _output(
    spec: SweepSpec, workload: str, pool: Sequence[TraceRequest], schedule: _Schedule, wall: float
) -> dict[str, Any]:
    """The sweep's JSON: its settings, the SLO, and each policy's points and rates."""
    slo = schedule.slo
    assert slo is not None  # the reference run always completes
    out: dict[str, Any] = {
        "workload": workload,
        "profile": spec.profile,
        "duration_s": spec.duration_s,
        "seed": spec.seed,
        "rates": list(spec.rates),
        "pool_size": len(pool),
        "slo_normalized_latency": slo,
        "tail_slo_normalized_latency": TAIL_FACTOR * slo,
        "max_unfinished_fraction": MAX_UNFINISHED_FRACTION,
        "reference_policy": REFERENCE_POLICY,
        # No policy can sustain more (`bound`): work and memory with nothing wasted.
        "rate_bound": rate_bound(load_profile(spec.profile), pool),
        "full": spec.full,
        "compiled": spec.compiled,
        "wall_s": wall,
        "policies": {},
    }
    for pol in schedule.policies:
        points = [
            {**{k: schedule.results[(pol, r)][k] for k in POINT_FIELDS}, "skipped": False}
            if (pol, r) in schedule.results
            else skipped_point(r)
            for r in schedule.rates
        ]
        out["policies"][pol] = {
            "sustainable_rate_median": sustainable_rate(points, slo),
            "sustainable_rate_tail": sustainable_rate_tail(points, slo),
            "points": points,
        }
    return out


def skipped_point(rate: float) -> dict[str, Any]:
    """A rate that was not simulated: every metric None."""
    return {**dict.fromkeys(POINT_FIELDS), "rate": rate, "skipped": True}
