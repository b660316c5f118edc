"""Prefill and decode engines against mixed ones at equal hardware, on TetriInfer's four workload
classes (Figure 16: light or heavy prefill x light or heavy decode): a reduced cluster model,
not the simulator (which runs one engine over a whole trace; a steppable cluster layer is not
built). Discrete events on a device profile:

* a **mixed** engine runs vLLM's chunked prefill: each step its decodes make a token each (up to
  `max_num_seqs`) and waiting prompts fill the rest of `saturation_tokens` in arrival order;
  the step takes T_fwd of all its tokens; a prompt's last chunk makes its first token;
* a **prefill** engine runs prompt chunks alone, `saturation_tokens` a step, and its first
  token; the KV then crosses to a **decode** engine at `link_bytes_per_s` (the prompt's KV
  bytes over it), which makes a token per request per step;
* new requests go to the engine with the fewest outstanding tokens of their phase (prompt
  tokens queued, or decodes held), as the gateway's placement does.

Left out: KV capacity (the profiles' GPUs hold far more than these loads), preemption, tool
calls (an agent's resumed turn is a short prefill on its decode engine), prefix caching. So it
answers where splitting the same engines by phase pays in TTFT and job time, not the agent
question; that needs the simulator's cluster layer.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from interlude.policy.profile import Profile

# TetriInfer's classes, our ranges (tokens, uniform): light/heavy prompt, light/heavy decode.
CLASSES: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "LPLD": ((64, 512), (16, 128)),
    "LPHD": ((64, 512), (256, 1024)),
    "HPLD": ((1024, 4096), (16, 128)),
    "HPHD": ((1024, 4096), (256, 1024)),
}


@dataclass(frozen=True)
class PDSpec:
    engines: int = 4
    klass: str = "LPLD"
    load: float = 0.6  # offered work over the engines' estimated capacity
    duration_s: float = 120.0
    link_bytes_per_s: float = 40e9  # the host link's arena on an H200 (docs/disaggregation.md)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.engines < 2 or self.klass not in CLASSES:
            raise ValueError(f"PDSpec: engines >= 2 and klass one of {sorted(CLASSES)}")
        if self.load <= 0 or self.duration_s <= 0 or self.link_bytes_per_s <= 0:
            raise ValueError("PDSpec: load, duration and link bandwidth must be > 0")


@dataclass
class _Req:
    arrival: float
    prompt: int
    decode: int
    left: int = 0  # prompt tokens still to compute
    made: int = 0  # output tokens so far
    first: float = -1.0
    finish: float = -1.0


@dataclass
class _Engine:
    role: str  # mixed | prefill | decode
    queue: list[_Req] = field(default_factory=list)  # prompts, arrival order
    decoding: list[_Req] = field(default_factory=list)
    busy: bool = False
    plan: tuple[list[tuple[_Req, int]], list[_Req]] = ([], [])

    def outstanding(self) -> int:
        return sum(r.left for r in self.queue) if self.role != "decode" else len(self.decoding)


def capacity_rps(p: Profile, klass: str, engines: int) -> float:
    """Requests/s the engines could finish: prompt tokens in full chunks, decode tokens in
    batches of 64 (an estimate, to set offered loads comparable across classes)."""
    (p_lo, p_hi), (d_lo, d_hi) = CLASSES[klass]
    prompt, decode = (p_lo + p_hi) / 2, (d_lo + d_hi) / 2
    s = p.saturation_tokens
    per_request = prompt * p.t_fwd(s) / s + decode * p.t_fwd(64) / 64
    return engines / per_request


def _requests(spec: PDSpec, rate: float) -> list[_Req]:
    rng = random.Random(spec.seed)
    (p_lo, p_hi), (d_lo, d_hi) = CLASSES[spec.klass]
    out: list[_Req] = []
    t = 0.0
    while (t := t + rng.expovariate(rate)) < spec.duration_s:
        prompt = rng.randint(p_lo, p_hi)
        out.append(_Req(t, prompt, rng.randint(d_lo, d_hi), left=prompt))
    return out


def run_split(spec: PDSpec, p: Profile, prefill_engines: int) -> dict[str, float]:
    """`prefill_engines` prefill and the rest decode engines (0: all mixed), on the spec's
    arrivals; latencies in seconds, unfinished requests counted."""
    roles = ["mixed"] * spec.engines
    if prefill_engines:
        roles = ["prefill"] * prefill_engines + ["decode"] * (spec.engines - prefill_engines)
    engines = [_Engine(r) for r in roles]
    rate = spec.load * capacity_rps(p, spec.klass, spec.engines)
    reqs = _requests(spec, rate)
    events: list[tuple[float, int, str, Any]] = []
    seq = itertools.count()
    for r in reqs:
        heapq.heappush(events, (r.arrival, next(seq), "arrive", r))

    def start(e: _Engine, now: float) -> None:
        if e.busy:
            return
        decodes = e.decoding[: p.max_num_seqs] if e.role != "prefill" else []
        budget = p.saturation_tokens - len(decodes)
        chunks: list[tuple[_Req, int]] = []
        for r in e.queue if e.role != "decode" else []:
            if budget <= 0:
                break
            n = min(r.left, budget)
            chunks.append((r, n))
            budget -= n
        tokens = len(decodes) + sum(n for _, n in chunks)
        if tokens == 0:
            return
        e.busy, e.plan = True, (chunks, decodes)
        heapq.heappush(events, (now + p.t_fwd(tokens), next(seq), "step", e))

    def end(e: _Engine, now: float) -> None:
        chunks, decodes = e.plan
        e.busy = False
        for r in decodes:
            r.made += 1
            if r.made >= r.decode:
                r.finish = now
                e.decoding.remove(r)
        for r, n in chunks:
            r.left -= n
            if r.left == 0:
                e.queue.remove(r)
                r.first, r.made = now, 1
                if r.made >= r.decode:
                    r.finish = now
                elif e.role == "mixed":
                    e.decoding.append(r)
                else:
                    arrive = now + r.prompt * p.kv_bytes_per_token / spec.link_bytes_per_s
                    heapq.heappush(events, (arrive, next(seq), "handoff", r))

    decoders = [e for e in engines if e.role == "decode"]
    takers = [e for e in engines if e.role != "decode"]
    horizon = spec.duration_s * 4
    while events and events[0][0] <= horizon:
        now, _, kind, item = heapq.heappop(events)
        if kind == "arrive":
            target = min(takers, key=_Engine.outstanding)
            target.queue.append(item)
        elif kind == "handoff":
            target = min(decoders, key=_Engine.outstanding)
            target.decoding.append(item)
        else:
            end(item, now)
            target = item
        start(target, now)
        if kind == "step":
            for e in engines:
                start(e, now)
    return _metrics(reqs)


def _metrics(reqs: list[_Req]) -> dict[str, float]:
    done = [r for r in reqs if r.finish >= 0]
    ttft = sorted(r.first - r.arrival for r in reqs if r.first >= 0)
    jct = sorted(r.finish - r.arrival for r in done)
    tpot = sorted((r.finish - r.first) / (r.decode - 1) for r in done if r.decode > 1)
    return {
        "arrived": len(reqs),
        "unfinished": len(reqs) - len(done),
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p99_s": _pct(ttft, 0.99),
        "jct_p50_s": _pct(jct, 0.5),
        "jct_p99_s": _pct(jct, 0.99),
        "tpot_p50_ms": _pct(tpot, 0.5) * 1e3,
        "tpot_p99_ms": _pct(tpot, 0.99) * 1e3,
        "jct_mean_s": statistics.fmean(jct) if jct else math.nan,
    }


def run_pd(
    spec: PDSpec,
    p: Profile,
    loads: tuple[float, ...],
    seeds: tuple[int, ...],
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every class at every load, all mixed against each prefill:decode split, one round per
    seed; rows of metrics."""
    rows = []
    for klass in CLASSES:
        for load in loads:
            for seed in seeds:
                run = PDSpec(
                    spec.engines, klass, load, spec.duration_s, spec.link_bytes_per_s, seed
                )
                rate = load * capacity_rps(p, klass, spec.engines)
                for prefill in range(spec.engines):
                    split = "mixed" if prefill == 0 else f"{prefill}P{spec.engines - prefill}D"
                    metrics = run_split(run, p, prefill)
                    rows.append(
                        {"class": klass, "load": load, "rate": rate, "seed": seed}
                        | {"split": split}
                        | metrics
                    )
            progress(f"{klass} at {load:.0%} of capacity: {len(seeds)} rounds")
    return {"spec": asdict(spec), "profile": p.name, "rows": rows}


def summary(result: Mapping[str, Any], key: str) -> dict[tuple[str, float, str], float]:
    """(class, load, split) -> the median over rounds of `key`."""
    groups: dict[tuple[str, float, str], list[float]] = {}
    for r in result["rows"]:
        groups.setdefault((r["class"], r["load"], r["split"]), []).append(float(r[key]))
    return {k: statistics.median(v) for k, v in groups.items()}


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


def best_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (class, load): mixed, and the prefill:decode split with the lowest median p99 job
    time, each with its median p99 TTFT, p99 job time and p99 time per output token."""
    keys = ("ttft_p99_s", "jct_p99_s", "tpot_p99_ms", "unfinished")
    med = {k: summary(result, k) for k in keys}
    splits = sorted({r["split"] for r in result["rows"]} - {"mixed"})
    out = []
    for klass, load in dict.fromkeys((r["class"], r["load"]) for r in result["rows"]):
        best = min(splits, key=lambda s: med["jct_p99_s"][klass, load, s])
        row: dict[str, Any] = {"class": klass, "load": load, "best_split": best}
        for name, split in (("mixed", "mixed"), ("pd", best)):
            row[name] = {k: med[k][klass, load, split] for k in keys}
        out.append(row)
    return out
