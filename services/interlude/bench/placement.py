"""Decode placement on a synthetic spread (TetriInfer's Figure 19 setup): decode engines of one
device profile, requests whose decodes are heavy or light, placed by each rule of
`policy/decode_placement.py` on the same arrivals, with a length predictor of a given accuracy.

Each engine runs vLLM's decode loop, reduced: a step takes the profile's T_fwd of its batch
(one token per running request), admits from its queue in order while a prompt fits in its free
KV, and when a step needs more KV than is free it preempts its newest request back to the head
of its queue (vLLM's recompute preemption: the KV is dropped and recomputed on readmission,
which costs the recompute here as prompt tokens in that step). Requests keep their engine.
What it leaves out: prefill (done elsewhere, as in disaggregation), chunking, swapping.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from interlude.policy.decode_placement import RULES, DecodeLoad, choose_decode
from interlude.policy.profile import Profile


@dataclass(frozen=True)
class PlacementSpec:
    engines: int = 4
    rate: float = 6.0  # requests/s
    duration_s: float = 120.0
    heavy_share: float = 0.5  # of requests whose decode is heavy
    light_tokens: tuple[int, int] = (16, 128)  # decode length range, uniform
    heavy_tokens: tuple[int, int] = (512, 2048)
    prompt_tokens: tuple[int, int] = (128, 1024)
    heavy_threshold: int = 256  # a decode predicted at least this long is heavy
    accuracy: float = 0.85  # the predictor's: a wrong prediction takes the other class
    kv_tokens: int = 24_000  # each engine's KV room
    max_batch: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.engines < 2 or self.rate <= 0 or self.duration_s <= 0:
            raise ValueError("PlacementSpec: engines >= 2, rate and duration > 0")
        if not 0 <= self.heavy_share <= 1 or not 0 <= self.accuracy <= 1:
            raise ValueError("PlacementSpec: heavy_share and accuracy within [0, 1]")
        if self.kv_tokens < self.prompt_tokens[1] + self.heavy_tokens[1]:
            raise ValueError("PlacementSpec: kv_tokens must hold the longest request")


@dataclass
class _Req:
    arrival: float
    prompt: int
    decode: int
    heavy: bool  # predicted
    done: int = 0
    start: float = -1.0
    finish: float = -1.0

    @property
    def held(self) -> int:
        return self.prompt + self.done


@dataclass
class _Engine:
    kv: int
    max_batch: int
    clock: float = 0.0
    queue: deque[_Req] = field(default_factory=deque)
    running: list[_Req] = field(default_factory=list)
    preemptions: int = 0

    @property
    def free(self) -> int:
        return self.kv - sum(r.held for r in self.running)

    def load(self, means: tuple[float, float]) -> DecodeLoad:
        """As the engine would report it; `means`: the predicted (light, heavy) lengths."""
        held = [*self.running, *self.queue]
        heavy = sum(r.heavy for r in held)
        reserved = sum(r.held for r in self.queue)
        work = sum(max(0.0, means[r.heavy] - r.done) for r in held)
        return DecodeLoad(self.free - reserved, heavy, len(held) - heavy, work)

    def advance(self, until: float, profile: Profile, done: list[_Req]) -> None:
        while self.clock < until and (self.running or self.queue):
            recompute = self._admit()
            self._make_room()
            batch = len(self.running)
            self.clock += profile.t_fwd(batch + recompute)
            for r in self.running:
                r.done += 1
            for r in [r for r in self.running if r.done >= r.decode]:
                r.finish = self.clock
                self.running.remove(r)
                done.append(r)
        self.clock = max(self.clock, until)

    def _admit(self) -> int:
        tokens = 0
        while self.queue and len(self.running) < self.max_batch:
            r = self.queue[0]
            if r.held + 1 > self.free:
                break
            self.queue.popleft()
            if r.start < 0:
                r.start = self.clock
            tokens += r.done  # generated before a preemption: recomputed now
            self.running.append(r)
        return tokens

    def _make_room(self) -> None:
        while self.running and self.free < len(self.running):
            victim = self.running.pop()
            self.queue.appendleft(victim)
            self.preemptions += 1


def _requests(spec: PlacementSpec) -> list[_Req]:
    rng = random.Random(spec.seed)
    out: list[_Req] = []
    t = 0.0
    while True:
        t += rng.expovariate(spec.rate)
        if t >= spec.duration_s:
            return out
        heavy = rng.random() < spec.heavy_share
        lo, hi = spec.heavy_tokens if heavy else spec.light_tokens
        decode = rng.randint(lo, hi)
        predicted = heavy if rng.random() < spec.accuracy else not heavy
        out.append(_Req(t, rng.randint(*spec.prompt_tokens), decode, predicted))


def run_rule(spec: PlacementSpec, profile: Profile, rule: str) -> dict[str, float]:
    """One rule on the spec's arrivals; latencies in seconds, unfinished counted, not dropped."""
    engines = [_Engine(spec.kv_tokens, spec.max_batch) for _ in range(spec.engines)]
    rng = random.Random(spec.seed + 1)
    done: list[_Req] = []
    reqs = _requests(spec)
    means = (sum(spec.light_tokens) / 2, sum(spec.heavy_tokens) / 2)
    for r in reqs:
        for e in engines:
            e.advance(r.arrival, profile, done)
        loads = [e.load(means) for e in engines]
        need = r.prompt + (spec.heavy_threshold if r.heavy else spec.light_tokens[0])
        i = choose_decode(loads, need, rng, rule)
        if i is None:  # no engine has the room now: the roomiest queues it
            i = max(range(len(loads)), key=lambda k: loads[k].free_tokens)
        engines[i].queue.append(r)
    horizon = spec.duration_s * 3
    for e in engines:
        e.advance(horizon, profile, done)
    jct = sorted(r.finish - r.arrival for r in done)
    tpot = sorted((r.finish - r.start) / r.decode for r in done)
    light = sorted(r.finish - r.arrival for r in done if r.decode <= spec.light_tokens[1])
    return {
        "finished": len(done),
        "unfinished": len(reqs) - len(done),
        "jct_mean_s": statistics.fmean(jct) if jct else math.nan,
        "jct_p99_s": _pct(jct, 0.99),
        "light_jct_p99_s": _pct(light, 0.99),
        "tpot_p50_ms": _pct(tpot, 0.5) * 1e3,
        "tpot_p99_ms": _pct(tpot, 0.99) * 1e3,
        "preemptions": sum(e.preemptions for e in engines),
    }


def run_placement(
    spec: PlacementSpec,
    profile: Profile,
    rates: tuple[float, ...],
    seeds: tuple[int, ...],
    rules: tuple[str, ...] = RULES,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every rule at every rate, one round per seed (new arrivals and predictions each)."""
    rows = []
    for rate in rates:
        for seed in seeds:
            run = replace(spec, rate=rate, seed=seed)
            for rule in rules:
                rows.append(
                    {"rate": rate, "seed": seed, "rule": rule} | run_rule(run, profile, rule)
                )
            progress(f"rate {rate:g}/s, seed {seed}: {len(rules)} rules")
    return {"spec": asdict(spec), "profile": profile.name, "rules": list(rules), "rows": rows}


METRICS = ("light_jct_p99_s", "tpot_p99_ms", "jct_p99_s", "preemptions")


def summary(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (rate, rule): the median over rounds of each metric, with its min and max."""
    out = []
    rates = sorted({r["rate"] for r in result["rows"]})
    for rate in rates:
        for rule in result["rules"]:
            rows = [r for r in result["rows"] if r["rate"] == rate and r["rule"] == rule]
            row: dict[str, Any] = {"rate": rate, "rule": rule, "rounds": len(rows)}
            for m in (*METRICS, "unfinished"):
                xs = [float(r[m]) for r in rows]
                row[m] = (statistics.median(xs), min(xs), max(xs))
            out.append(row)
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    return xs[min(len(xs) - 1, int(q * len(xs)))]
