"""Prefill and decode engines against mixed ones at equal hardware, in the simulator's cluster
(`sim/cluster.py`: the engine's and the gateway's rules, every engine a full simulated engine
with its policy, KV memory, chunked steps and swaps).

Two questions:
* `run_pd`: TetriInfer's Figure 16, its four workload classes (light or heavy prefill x light
  or heavy decode, `CLASSES`) at offered loads given as shares of an estimated capacity, all
  mixed against every prefill:decode split;
* `run_agents`: the same splits on an agent workload (requests that pause at tool calls), at
  given rates, with and without TetriInfer's rule that a resumed session whose KV was dropped
  is prefilled on a prefill engine (`ClusterSpec.resume_prefill`; the engine recomputes it on
  its decode engine): does disaggregation help paused sessions or hurt them?

Every latency counts unfinished requests censored at the horizon (`sim.metrics.summarize`).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from interlude.policy import load_profile, make_policy
from interlude.policy.flips import FlipRule
from interlude.policy.profile import Profile
from interlude.sim.cluster import Cluster, ClusterMetrics, ClusterSpec
from interlude_workloads import Segment, TraceRequest, poisson_arrivals

# TetriInfer's classes, our ranges (tokens, uniform): light/heavy prompt, light/heavy decode.
CLASSES: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "LPLD": ((64, 512), (16, 128)),
    "LPHD": ((64, 512), (256, 1024)),
    "HPLD": ((1024, 4096), (16, 128)),
    "HPHD": ((1024, 4096), (256, 1024)),
}
POOL_SIZE = 400
FLIP_EVERY_S = 15.0  # the operator's pass


@dataclass(frozen=True)
class PDSpec:
    engines: int = 4
    duration_s: float = 120.0  # seconds of arrivals; the run drains for as long again
    link_bytes_per_s: float = 40e9  # the host link's arena on an H200 (docs/disaggregation.md)
    policy: str = "interlude"
    # > 0: idle engines flip role after this many seconds (the operator's rule, checked every
    # `FLIP_EVERY_S`); 0: roles stay as the split sets them.
    flip_window_s: float = 0.0

    def __post_init__(self) -> None:
        if self.engines < 2:
            raise ValueError("PDSpec: engines >= 2")
        if self.flip_window_s < 0:
            raise ValueError("PDSpec: flip_window_s >= 0")
        if self.duration_s <= 0 or self.link_bytes_per_s <= 0:
            raise ValueError("PDSpec: duration and link bandwidth must be > 0")


def splits(engines: int) -> list[tuple[str, tuple[str, ...]]]:
    """All mixed, then every prefill:decode split of `engines`, as (name, roles)."""
    out = [("mixed", ("mixed",) * engines)]
    for p in range(1, engines):
        out.append((f"{p}P{engines - p}D", ("prefill",) * p + ("decode",) * (engines - p)))
    return out


def class_pool(klass: str, seed: int) -> list[TraceRequest]:
    """`POOL_SIZE` requests of one class, no tool calls."""
    if klass not in CLASSES:
        raise ValueError(f"class must be one of {sorted(CLASSES)}, got {klass!r}")
    rng = random.Random(seed)
    (p_lo, p_hi), (d_lo, d_hi) = CLASSES[klass]
    return [
        TraceRequest(
            f"{klass}-{i}",
            klass.lower(),
            rng.randint(p_lo, p_hi),
            (Segment(rng.randint(d_lo, d_hi), None),),
        )
        for i in range(POOL_SIZE)
    ]


def capacity_rps(p: Profile, klass: str, engines: int) -> float:
    """Requests/s the engines could finish: prompt tokens in full chunks, decode tokens in
    batches of 64 (an estimate, to set offered loads comparable across classes)."""
    (p_lo, p_hi), (d_lo, d_hi) = CLASSES[klass]
    prompt, decode = (p_lo + p_hi) / 2, (d_lo + d_hi) / 2
    s = p.saturation_tokens
    per_request = prompt * p.t_fwd(s) / s + decode * p.t_fwd(64) / 64
    return engines / per_request


def run_split(
    spec: PDSpec,
    p: Profile,
    pool: Sequence[TraceRequest],
    rate: float,
    roles: tuple[str, ...],
    seed: int,
    resume_prefill: bool = False,
) -> dict[str, Any]:
    """One cluster of `roles` on Poisson arrivals from `pool`; its metrics."""
    arrivals = poisson_arrivals(pool, rate, spec.duration_s, seed)
    flips = FlipRule(window_s=spec.flip_window_s) if spec.flip_window_s > 0 else None
    cluster_spec = ClusterSpec(
        roles,
        link_bytes_per_s=spec.link_bytes_per_s,
        resume_prefill=resume_prefill,
        flips=flips,
        flip_every_s=FLIP_EVERY_S,
        horizon_s=2 * spec.duration_s,
        seed=seed,
    )
    policy = spec.policy
    cluster = Cluster(p, lambda q: make_policy(policy, q), arrivals, cluster_spec, rate)
    return _row(cluster.run())


def _row(m: ClusterMetrics) -> dict[str, Any]:
    r = m.run
    return {
        "arrived": r.arrived,
        "unfinished": r.unfinished,
        "ttft_mean_s": r.ttft_mean,
        "ttft_p99_s": r.ttft_p99,
        "jct_p99_s": r.e2e_p99,
        "jct_mean_s": r.e2e_mean,
        "norm_p50_ms": r.normalized_latency_median * 1e3,
        "norm_p99_ms": r.normalized_latency_p99 * 1e3,
        "resume_wait_p50_s": m.resume_wait_p50_s,
        "resume_wait_p99_s": m.resume_wait_p99_s,
        "recomputed_tokens": r.recomputed_tokens,
        "swapped_tokens": r.swapped_tokens,
        "linked_tokens": m.linked_tokens,
        "remote_prefills": m.remote_prefills,
        "busy": list(m.busy_fraction),
        "flips": len(m.flips),
    }


def run_pd(
    spec: PDSpec,
    profile: str,
    loads: tuple[float, ...],
    seeds: tuple[int, ...],
    classes: Sequence[str] = tuple(CLASSES),
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every class at every load, all mixed against each prefill:decode split, one round per
    seed; rows of metrics."""
    p = load_profile(profile)
    rows = []
    for klass in classes:
        for load in loads:
            rate = load * capacity_rps(p, klass, spec.engines)
            for seed in seeds:
                pool = class_pool(klass, seed)
                for split, roles in splits(spec.engines):
                    metrics = run_split(spec, p, pool, rate, roles, seed)
                    rows.append(
                        {"class": klass, "load": load, "rate": rate, "seed": seed, "split": split}
                        | metrics
                    )
            progress(f"{klass} at {load:.0%} of capacity: {len(seeds)} rounds")
    return {"spec": asdict(spec), "profile": profile, "rows": rows}


def run_agents(
    spec: PDSpec,
    profile: str,
    workload: Sequence[TraceRequest],
    rates: tuple[float, ...],
    seeds: tuple[int, ...],
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """An agent workload at every rate: all mixed against each split, each split also with
    resumed sessions that lost their KV prefilled on a prefill engine (`+resume`). The caller
    names the workload in the result (`"workload"`)."""
    p = load_profile(profile)
    rows = []
    for rate in rates:
        for seed in seeds:
            for split, roles in splits(spec.engines):
                for resume in (False, True) if split != "mixed" else (False,):
                    metrics = run_split(spec, p, workload, rate, roles, seed, resume)
                    name = split + ("+resume" if resume else "")
                    rows.append({"rate": rate, "seed": seed, "split": name} | metrics)
        progress(f"{rate:g} req/s: {len(seeds)} rounds")
    return {"spec": asdict(spec), "profile": profile, "rows": rows}


def summary(
    result: Mapping[str, Any], key: str, by: tuple[str, ...]
) -> dict[tuple[Any, ...], float]:
    """(the row's values of `by`..., split) -> the median over rounds of `key`."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in result["rows"]:
        groups.setdefault((*(r[b] for b in by), r["split"]), []).append(float(r[key]))
    return {k: statistics.median(v) for k, v in groups.items()}


KEYS = ("ttft_p99_s", "jct_p99_s", "norm_p99_ms", "unfinished")


def best_rows(
    result: Mapping[str, Any], by: tuple[str, ...] = ("class", "load")
) -> list[dict[str, Any]]:
    """Per group of `by`: mixed, and the split with the lowest median p99 job time, each with
    its medians of `KEYS`."""
    med = {k: summary(result, k, by) for k in KEYS}
    names = sorted({r["split"] for r in result["rows"]} - {"mixed"})
    out = []
    for group in dict.fromkeys(tuple(r[b] for b in by) for r in result["rows"]):
        best = min(names, key=lambda s: med["jct_p99_s"][(*group, s)])
        row: dict[str, Any] = dict(zip(by, group, strict=True)) | {"best_split": best}
        for name, split in (("mixed", "mixed"), ("pd", best)):
            row[name] = {k: med[k][(*group, split)] for k in KEYS}
        out.append(row)
    return out
