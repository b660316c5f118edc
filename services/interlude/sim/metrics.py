"""Per-run metrics, as defined in DESIGN section 4 (InferCept's evaluation method)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from interlude.sim.request import SimRequest


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of `xs` (need not be sorted); NaN for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


@dataclass
class Accounting:
    """Running sums the simulator adds to every step."""

    busy_s: float = 0.0  # time the GPU ran iterations
    recompute_s: float = 0.0  # share of busy time spent on recomputed tokens
    waste_preserve: float = 0.0  # byte-seconds held by paused requests on the GPU
    waste_recompute: float = 0.0  # byte-seconds others hold while the GPU recomputes
    waste_stall: float = 0.0  # byte-seconds held while a synchronous swap stalls the batch
    # Preserve waste accrued while requests queued for GPU memory: the part that cost someone.
    waste_contended: float = 0.0
    iterations: int = 0
    steps: int = 0  # simulator steps (a step may cover many identical iterations)

    def add(self, other: Accounting) -> None:
        """Add `other`'s sums to these (a cluster's engines, `sim/cluster.py`)."""
        self.busy_s += other.busy_s
        self.recompute_s += other.recompute_s
        self.waste_preserve += other.waste_preserve
        self.waste_recompute += other.waste_recompute
        self.waste_stall += other.waste_stall
        self.waste_contended += other.waste_contended
        self.iterations += other.iterations
        self.steps += other.steps


@dataclass(frozen=True)
class RunMetrics:
    policy: str
    rate: float
    arrived: int
    finished: int
    # Arrived but not finished at the horizon; every latency below counts them censored there.
    unfinished: int
    unfinished_fraction: float
    makespan_s: float
    # (end - start - tool time) / output tokens, tool-returned tokens counted as output.
    normalized_latency_median: float
    normalized_latency_p90: float
    normalized_latency_p99: float
    throughput_rps: float
    ttft_mean: float
    ttft_p99: float
    e2e_mean: float
    e2e_p99: float
    # GPU KV waste over (KV capacity x makespan).
    waste_fraction: float
    waste_gb_s: float
    # The three parts of the waste, as fractions of (KV capacity x makespan).
    waste_preserve_fraction: float
    waste_recompute_fraction: float
    waste_stall_fraction: float
    # Preserve waste while requests were queued for memory, same denominator.
    waste_contended_fraction: float
    # Share of forward time spent recomputing dropped KV.
    recompute_fraction: float
    recomputed_tokens: int
    swapped_tokens: int
    iterations: int
    steps: int
    # Dropped tokens found again in the prefix cache instead of recomputed.
    prefix_hit_tokens: int = 0
    # Prompt tokens found in a head the request's group shares (`sim/shared_heads.py`).
    shared_head_tokens: int = 0

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def session_metrics(
    sessions: int,
    norm: Sequence[float],
    ttft: Sequence[float],
    e2e: Sequence[float],
    makespan: float,
) -> dict[str, float]:
    """What a real run (an engine, or a server over HTTP) reports of its `sessions`: `norm`
    holds every session's normalized latency (unfinished ones censored at the horizon), `e2e`
    the finished ones' end-to-end times, `makespan` the run's span in seconds."""
    return {
        "makespan_s": makespan,
        "finished_per_s": len(e2e) / makespan,
        "unfinished_fraction": 1 - len(e2e) / sessions if sessions else 0.0,
        "median_norm_latency_s": quantile(norm, 0.5),
        "p90_norm_latency_s": quantile(norm, 0.9),
        "p99_norm_latency_s": quantile(norm, 0.99),
        "ttft_mean_s": mean(ttft),
        "ttft_p99_s": quantile(ttft, 0.99),
        "e2e_mean_s": mean(e2e),
        "e2e_p99_s": quantile(e2e, 0.99),
    }


def summarize(
    policy: str,
    rate: float,
    requests: Sequence[SimRequest],
    end: float,
    acc: Accounting,
    gpu_kv_bytes: int,
) -> RunMetrics:
    """Every latency statistic over every arrived request, censored at the horizon `end`.

    A request unfinished at `end` counts as if it ended there (its end-to-end and normalized
    latency are lower bounds), and one without a first token counts TTFT = end - arrival.
    Dropping them instead would be survivorship bias: the requests a policy starves would vanish
    from its tail, and an overloaded policy would look better the more it starved.
    """
    norm, ttft, e2e = [], [], []
    finished = 0
    for r in requests:
        if r.finished_at is not None:
            finished += 1
        done = r.finished_at if r.finished_at is not None else end
        norm.append((done - r.arrival - r.tool_time) / max(1, r.output_tokens))
        first = r.first_token_at if r.first_token_at is not None else end
        ttft.append(first - r.arrival)
        e2e.append(done - r.arrival)
    unfinished = len(requests) - finished
    start = min((r.arrival for r in requests), default=0.0)
    makespan = max(end - start, 1e-9)
    waste = acc.waste_preserve + acc.waste_recompute + acc.waste_stall
    return RunMetrics(
        policy=policy,
        rate=rate,
        arrived=len(requests),
        finished=finished,
        unfinished=unfinished,
        # No arrivals: nothing was left behind.
        unfinished_fraction=unfinished / len(requests) if requests else 0.0,
        makespan_s=makespan,
        normalized_latency_median=quantile(norm, 0.5),
        normalized_latency_p90=quantile(norm, 0.9),
        normalized_latency_p99=quantile(norm, 0.99),
        throughput_rps=finished / makespan,
        ttft_mean=mean(ttft),
        ttft_p99=quantile(ttft, 0.99),
        e2e_mean=mean(e2e),
        e2e_p99=quantile(e2e, 0.99),
        waste_fraction=waste / (gpu_kv_bytes * makespan),
        waste_gb_s=waste / 1e9,
        waste_preserve_fraction=acc.waste_preserve / (gpu_kv_bytes * makespan),
        waste_recompute_fraction=acc.waste_recompute / (gpu_kv_bytes * makespan),
        waste_stall_fraction=acc.waste_stall / (gpu_kv_bytes * makespan),
        waste_contended_fraction=acc.waste_contended / (gpu_kv_bytes * makespan),
        recompute_fraction=acc.recompute_s / acc.busy_s if acc.busy_s else 0.0,
        recomputed_tokens=sum(r.recomputed_tokens for r in requests),
        swapped_tokens=sum(r.swapped_tokens for r in requests),
        iterations=acc.iterations,
        steps=acc.steps,
        prefix_hit_tokens=sum(r.prefix_hit_tokens for r in requests),
        shared_head_tokens=sum(r.shared_head_tokens for r in requests),
    )
