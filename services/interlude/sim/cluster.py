"""Several simulated engines on one clock: mixed engines, or prefill and decode engines
(TetriInfer's disaggregation) with the KV crossing a link, placed as the gateway places them.

The rules are the engine's and the gateway's (docs/disaggregation.md):
* a new session goes to the better of two engines drawn among those that are not `prefill`, by
  `api.load.placement_score` (KV in use, contended waste, queue per slot), or by TetriInfer's
  heavy:light rule on a length predictor of a chosen accuracy (`decode_rule`);
* placed on a `decode` engine, a prompt of at least `remote_prefill_min_tokens` is prefilled on
  the better of two prefill engines by prompt tokens still to compute, in TetriInfer's order
  (`policy.prefill_jobs`); its KV then crosses the link (`link_bytes_per_s`), lands in the
  decode engine's host memory and is loaded as a swap-in is, over steps (the engine's
  `WAITING_FOR_REMOTE_KVS`), and the decode engine computes the prompt's last token to sample;
* a session stays on its decode engine: its calls pause it there under the policy. A resumed
  session whose KV was dropped recomputes there, as the engine does; with `resume_prefill` it
  is prefilled on a prefill engine first when that is at least the minimum (TetriInfer's rule,
  which the engine does not apply: the simulator measures whether it should).

Engines interleave conservatively: the cluster always moves the engine whose clock is lowest,
and an engine may run ahead only to the next moment anything could reach it (an arrival, a
landing, or a step of an engine that can hand work on), so a request joins an engine at most
one iteration after it arrives, as a request arriving mid-iteration does.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from interlude.api.load import RecentRate
from interlude.policy.base import Policy
from interlude.policy.decode_placement import RULES, choose_decode
from interlude.policy.flips import FlipRule, FlipState, step
from interlude.policy.prefill_jobs import PrefillJobs
from interlude.policy.profile import Profile
from interlude.sim.config import SimConfig, SimulationError
from interlude.sim.kv import OutOfBlocks
from interlude.sim.metrics import Accounting, RunMetrics, quantile, summarize
from interlude.sim.placement import (
    Landings,
    better_of_two,
    decode_load,
    flip_load,
    prefill_backlog,
    score,
)
from interlude.sim.request import SimRequest
from interlude.sim.shared_heads import own_arrivals
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival

ROLES = ("mixed", "prefill", "decode")
DECODE_RULES = ("score", *RULES)


@dataclass(frozen=True)
class ClusterSpec:
    roles: tuple[str, ...]  # one per engine
    link_bytes_per_s: float = 40e9  # the host link's arena on an H200 (docs/disaggregation.md)
    remote_prefill_min_tokens: int = 64  # the engine's --remote-prefill-min-tokens
    resume_prefill: bool = False  # a resumed session without KV is prefilled elsewhere
    decode_rule: str = "score"  # or one of `decode_placement.RULES` (with the predictor)
    heavy_tokens: int = 256  # a session predicted to generate this many is heavy
    predictor_accuracy: float = 1.0  # chance the predictor names the true class
    flips: FlipRule | None = None  # idle engines change role, as the operator flips them
    flip_every_s: float = 15.0  # the operator's pass (`metrics.intervalSeconds`)
    horizon_s: float | None = None
    check_integrity: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [r for r in self.roles if r not in ROLES]
        if not self.roles or bad:
            raise ValueError(f"ClusterSpec.roles: one of {ROLES} per engine, got {self.roles}")
        if all(r == "prefill" for r in self.roles):
            raise ValueError("ClusterSpec.roles: prefill engines need a decode or mixed engine")
        if "prefill" in self.roles and "decode" not in self.roles:
            raise ValueError("ClusterSpec.roles: prefill engines serve decode engines; none")
        if self.link_bytes_per_s <= 0 or self.remote_prefill_min_tokens < 1:
            raise ValueError("ClusterSpec: link bandwidth > 0, remote prefill minimum >= 1")
        if self.decode_rule not in DECODE_RULES:
            raise ValueError(f"ClusterSpec.decode_rule: one of {DECODE_RULES}")
        if not 0.0 <= self.predictor_accuracy <= 1.0 or self.heavy_tokens < 1:
            raise ValueError("ClusterSpec: predictor_accuracy in [0, 1], heavy_tokens >= 1")
        if self.flip_every_s <= 0:
            raise ValueError("ClusterSpec.flip_every_s must be > 0")


@dataclass(frozen=True)
class ClusterMetrics:
    run: RunMetrics  # over every request and every engine (waste over all engines' KV)
    resume_wait_p50_s: float  # a call's return to its turn's first token
    resume_wait_p99_s: float
    resumes_timed: int
    linked_tokens: int  # tokens whose KV crossed the link
    remote_prefills: int
    busy_fraction: tuple[float, ...]  # per engine: time running iterations over the run
    flips: tuple[tuple[float, int, str], ...] = ()  # (when, engine, its new role)


class Cluster:
    def __init__(
        self,
        profile: Profile,
        make_policy: Callable[[Profile], Policy],
        arrivals: Sequence[Arrival],
        spec: ClusterSpec,
        rate: float = 0.0,
    ) -> None:
        self.p, self.spec, self.rate = profile, spec, rate
        self.rng = random.Random(spec.seed)
        config = SimConfig(horizon_s=spec.horizon_s, check_integrity=spec.check_integrity)
        self.make_policy = make_policy
        self.engines = [
            Simulator(profile, self._policy(role), (), config, rate) for role in spec.roles
        ]
        self.roles = list(spec.roles)
        for i, role in enumerate(spec.roles):
            self._hooks(i, role)
        self.flip_state = [FlipState() for _ in spec.roles]
        self.draining: set[int] = set()
        self.flip_log: list[tuple[float, int, str]] = []
        self.busy = [RecentRate() for _ in spec.roles]  # each engine's busy share, as it reports
        self._next_flip = spec.flip_every_s if spec.flips is not None else math.inf
        capacity = profile.gpu_blocks * profile.block_size
        for a in arrivals:
            if a.request.max_context > capacity:
                raise SimulationError(f"{a.request.request_id!r} outgrows one engine's KV")
        cached = all(e.policy.traits.prefix_cache for e in self.engines)
        ordered, pinned = own_arrivals(arrivals, profile.block_size, cached)
        for e in self.engines:
            e.kv.pin(pinned)  # any engine may serve any group: each holds every head
        self.requests = [SimRequest(a.arrival_id, a.request, a.time_s, h) for a, h in ordered]
        self._next = 0
        self.home: dict[str, int] = {}  # request -> the engine that serves its session
        self.heavy: dict[str, bool] = {}  # request -> predicted heavy (decode rules)
        self.landings = Landings()
        # Sessions of each engine prefilled elsewhere or whose KV is crossing: the engine still
        # holds them (its sidecar waits for the prefill), so it is not drained.
        self.away: Counter[int] = Counter()
        self.linked_tokens = 0
        self.remote_prefills = 0
        self.now = 0.0

    # --- the loop ------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> ClusterMetrics:
        horizon = self.spec.horizon_s
        last_report = 0.0
        while True:
            t_arrival = (
                self.requests[self._next].arrival if self._next < len(self.requests) else math.inf
            )
            t_landing = self.landings.next_time()
            t_event = min(t_arrival, t_landing)  # work from outside the engines
            engine = min(self.engines, key=Simulator.next_time)
            t_engine = engine.next_time()
            if min(t_event, t_engine) == math.inf:
                break  # nothing left to do (flip passes alone are not work)
            t = min(t_event, t_engine, self._next_flip)
            if horizon is not None and t >= horizon:
                self.now = horizon
                break
            self.now = max(self.now, t)
            if self._next_flip <= min(t_event, t_engine + 1e-9):
                self._flip_pass(self._next_flip)
                self._next_flip += self.spec.flip_every_s
            elif t_event <= t_engine + 1e-9:
                if t_arrival <= t_landing:
                    self._arrive(self.requests[self._next])
                    self._next += 1
                else:
                    r, home = self.landings.pop()
                    self._land(r, home, t_landing)
            else:
                engine.bound = min(t_event, self._next_flip, self._emit_floor(engine))
                engine.tick()
                if progress is not None and engine.now - last_report >= 10.0:
                    last_report = engine.now
                    progress(engine.now)
        return self._metrics(self._end())

    def _emit_floor(self, engine: Simulator) -> float:
        """The earliest time another engine could hand work on: a prefill engine at its next
        step's end, a decode engine (with `resume_prefill`) at its next call's return."""
        floor = math.inf
        for other, role in zip(self.engines, self.roles, strict=True):
            if other is engine:
                continue
            if role == "prefill":
                floor = min(floor, other.next_time())
            elif role == "decode" and self.spec.resume_prefill:
                floor = min(floor, other.next_return())
        return floor

    def _end(self) -> float:
        return max([self.now, *(e.now for e in self.engines)])

    # --- roles ---------------------------------------------------------------------------
    def _policy(self, role: str) -> Policy:
        return PrefillJobs(self.p) if role == "prefill" else self.make_policy(self.p)

    def _hooks(self, i: int, role: str) -> None:
        sim = self.engines[i]
        sim.handoff = self._handoff if role == "prefill" else None
        resume = role == "decode" and self.spec.resume_prefill
        sim.reprefill = self._reprefill if resume else None

    def _flip_pass(self, now: float) -> None:
        """The operator's pass: every engine through `policy.flips.step` on its load."""
        rule = self.spec.flips
        assert rule is not None
        counts = Counter(
            role for role, st in zip(self.roles, self.flip_state, strict=True) if st.flip_to is None
        )
        for i, sim in enumerate(self.engines):
            role, before = self.roles[i], self.flip_state[i]
            busy = min(1.0, self.busy[i].update(sim.acc.busy_s, 1.0, now))
            out = step(flip_load(sim, role, self.away[i], busy), before, counts, now, rule)
            if out.state.flip_to is not None and before.flip_to is None:
                counts[role] -= 1  # leaving: the next engine of its role may not
            if out.set_role is not None:
                sim.set_policy(self._policy(out.set_role))
                self.roles[i] = out.set_role
                self._hooks(i, out.set_role)
                self.flip_log.append((now, i, out.set_role))
            self.flip_state[i] = out.state
            if out.drain:
                self.draining.add(i)
            else:
                self.draining.discard(i)

    def _serving(self) -> list[int]:
        """Engines taking new sessions: not prefill, not draining (all of them if every one
        is draining, as the gateway does)."""
        serving = [i for i, role in enumerate(self.roles) if role != "prefill"]
        return [i for i in serving if i not in self.draining] or serving

    def _prefilling(self) -> list[int]:
        """Prefill engines taking new prompts: none draining (the gateway's `choose_prefill`)."""
        return [i for i, r in enumerate(self.roles) if r == "prefill" and i not in self.draining]

    # --- placement -----------------------------------------------------------------------
    def _arrive(self, r: SimRequest) -> None:
        i = self._place(r, self._serving())
        self.home[r.request_id] = i
        if self.roles[i] == "decode" and r.pending_tokens >= self.spec.remote_prefill_min_tokens:
            self._to_prefill(r, r.arrival)
        else:
            self.engines[i].take(r, r.arrival)

    def _place(self, r: SimRequest, serving: list[int]) -> int:
        if len(serving) == 1:
            return serving[0]
        rule = self.spec.decode_rule
        if rule == "score":
            a, b = self.rng.sample(serving, 2)
            return better_of_two(a, b, lambda i: score(self.engines[i]))
        heavy = self._predict_heavy(r)
        loads = [decode_load(self.engines[i], self.heavy) for i in serving]
        need = r.context_tokens + (self.spec.heavy_tokens if heavy else 1)
        chosen = choose_decode(loads, need, self.rng, rule)
        if chosen is None:  # none has the room: the roomiest, as a gateway would
            chosen = max(range(len(serving)), key=lambda j: loads[j].free_tokens)
        return serving[chosen]

    def _predict_heavy(self, r: SimRequest) -> bool:
        true = sum(s.gen_tokens for s in r.segments) >= self.spec.heavy_tokens
        right = self.rng.random() < self.spec.predictor_accuracy
        self.heavy[r.request_id] = true if right else not true
        return self.heavy[r.request_id]

    def _to_prefill(self, r: SimRequest, at: float) -> None:
        prefill = self._prefilling()
        if not prefill:  # every prefill engine flipped away: the session's engine prefills
            self.engines[self.home[r.request_id]].take(r, at)
            return
        pair = self.rng.sample(prefill, 2) if len(prefill) > 1 else prefill * 2
        chosen = better_of_two(pair[0], pair[1], lambda i: prefill_backlog(self.engines[i]))
        self.remote_prefills += 1
        self.away[self.home[r.request_id]] += 1
        self.engines[chosen].take(r, at)

    # --- hand-offs -----------------------------------------------------------------------
    def _handoff(self, sim: Simulator, r: SimRequest) -> None:
        """A prefill engine computed `r`'s prompt (its KV freed there): the KV crosses the
        link to `r`'s decode engine. Until it lands, `r` holds KV nowhere."""
        r.pending_tokens, r.recompute_left = r.context_tokens, 0
        tokens = r.context_tokens - 1  # the decode engine computes the last one, to sample
        delay = tokens * self.p.kv_bytes_per_token / self.spec.link_bytes_per_s
        self.landings.push(sim.now + delay, r, self.home[r.request_id])

    def _land(self, r: SimRequest, home: int, at: float) -> None:
        self.away[home] -= 1
        if self.roles[home] == "prefill":  # it would hand the session to itself, forever
            raise SimulationError(f"{r.request_id}: its engine {home} flipped to prefill")
        d = self.engines[home]
        tokens = r.context_tokens - 1
        try:
            d.kv.set_cpu(r, tokens)
        except OutOfBlocks:  # no host room: the decode engine computes the prompt itself
            r.recompute_left = r.context_tokens
        else:
            r.pending_tokens -= tokens
            self.linked_tokens += tokens
        d.take(r, at)

    def _reprefill(self, sim: Simulator, r: SimRequest) -> bool:
        if r.pending_tokens < self.spec.remote_prefill_min_tokens:
            return False
        self._to_prefill(r, sim.now)
        return True

    # --- results -------------------------------------------------------------------------
    def _metrics(self, end: float) -> ClusterMetrics:
        acc = Accounting()
        for e in self.engines:
            acc.add(e.acc)
        arrived = self.requests[: self._next]
        # The sessions' policy (prefill engines run `PrefillJobs`; some engine always serves).
        name = next(
            e.policy.name for e, r in zip(self.engines, self.roles, strict=True) if r != "prefill"
        )
        kv_bytes = self.p.gpu_kv_bytes * len(self.engines)
        run = summarize(name, self.rate, arrived, end, acc, kv_bytes)
        # A link load is not a swap: the engines' loads counted both.
        linked = self.linked_tokens
        run = replace(run, swapped_tokens=run.swapped_tokens - linked)
        waits = [w for e in self.engines for w in e.resume_waits]
        span = max(end - min((r.arrival for r in arrived), default=0.0), 1e-9)
        return ClusterMetrics(
            run=run,
            resume_wait_p50_s=quantile(waits, 0.5),
            resume_wait_p99_s=quantile(waits, 0.99),
            resumes_timed=len(waits),
            linked_tokens=linked,
            remote_prefills=self.remote_prefills,
            busy_fraction=tuple(e.acc.busy_s / span for e in self.engines),
            flips=tuple(self.flip_log),
        )
