"""Continuum: a time-to-live for a paused program's KV, and program-level FCFS.

Source: H. Li et al., "Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling with KV
Cache Time-to-Live", arXiv:2511.02230 (https://arxiv.org/abs/2511.02230; abstract and intro);
preview code https://github.com/Hanchenli/vllm-continuum (`vllm/v1/core/estimate_with_func.py`,
`vllm/v1/core/sched/scheduler.py`; not fetchable here, read through its forks
Whrlicht/vllm-continuum and burninglhw/vllm-continuum).

What it does, per paused request (a program stopped at a tool call):

* **Pin with a TTL.** At the call, the KV stays on the GPU for tau seconds, tau maximising
  U(tau) = P(D <= tau) * (T * eta + Reload(C)) - tau: the chance the tool is back within tau
  times what keeping the KV saves (a reload of the C-token context, plus the queueing delay T
  an evicted request suffers, scaled by eta), minus the time the memory is held. P is the
  empirical CDF of the tool's observed durations (candidates: 0 and every observed duration;
  ties go to the shorter TTL); T is the running mean wait of requests whose KV was dropped;
  eta = -corr(k, N - k) over finished programs (k calls done of N turns), the paper's weight
  on how much of that queueing delay a kept cache saves.
* **Expire.** When now > pinned_at + tau and the tool has not returned, the KV is dropped
  (DISCARD); the continuation recomputes. Under memory pressure pins go early, whole programs,
  latest program arrival first: when decodes would need more blocks than are free (the code
  unpins before it preempts), or when nothing runs and the queue head's context does not fit.
* **Program-level FCFS.** Queues and preemption follow the program's first arrival; a program
  that still holds its KV goes ahead of one that does not.

From the paper as available here (the arXiv abstract and introduction, and the equations of
v6 as quoted by the burninglhw/vllm-continuum reconstruction, docs/continuum-paper.md): the
utility, the empirical CDF, eta, T, and the cold start: with at most 100 observed calls in
all, an exponential prior of mean 1 s and eta = 1 (then tau = ln(B / 1 s) when B > 1 s, else
0); with more, but at most 100 of this tool, the pooled CDF of all tools. From the released
preview code (its README says "without the estimation in the paper"): a fixed 2 s TTL for
tools whose mean observed duration is at most 2 s, none for the others; pass
`fixed_ttl_s=2.0` for that variant, registered as `continuum-fixed-ttl`.

Assumptions, marked because neither source fixes them: Reload(C) is a chunked recompute of C
tokens alone, a*C + ceil(C/S)*c from the profile (the paper fits measured prefill times; CPU
offload, LMCache in the paper, is not modelled: Continuum here never swaps); the duration CDF
keeps the last `window` calls per tool and in all, T the last 256 waits and eta the last 256
programs; T counts only requests whose KV this policy dropped (the engine's own preemptions
are not shown to a policy).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from interlude.policy.base import Policy, call_key, paused_on_gpu
from interlude.policy.predict import PAST
from interlude.policy.profile import Profile
from interlude.policy.types import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
    RequestView,
    SchedulerView,
    Traits,
)

COLD_START_CALLS = 100  # v6 section 4.2: calls observed before an empirical CDF is trusted
PRIOR_MEAN_S = 1.0  # the cold-start exponential prior's mean
HISTORY = 256  # waits (T) and finished programs (eta) kept; an assumption
WINDOW = 1000  # tool durations kept per tool and in all; an assumption
RELEASED_TTL_S = 2.0  # the released preview code's fixed TTL


class Correlation:
    """-corr(k, N - k) over the (k, N - k) pairs of the last `size` finished programs."""

    def __init__(self, size: int = HISTORY) -> None:
        self.programs: deque[int] = deque()
        self.size = size
        self.sums = [0.0] * 6  # n, x, y, xx, yy, xy

    def _add(self, turns: int, sign: int) -> None:
        for k in range(1, turns):
            x, y = k, turns - k
            for i, v in enumerate((1, x, y, x * x, y * y, x * y)):
                self.sums[i] += sign * v

    def observe(self, turns: int) -> None:
        self.programs.append(turns)
        self._add(turns, 1)
        if len(self.programs) > self.size:
            self._add(self.programs.popleft(), -1)

    def eta(self) -> float:
        n, x, y, xx, yy, xy = self.sums
        vx, vy = n * xx - x * x, n * yy - y * y
        if n < 2 or vx <= 0 or vy <= 0:
            return 0.0  # undefined correlation: no ordering benefit claimed
        return max(-1.0, min(1.0, -(n * xy - x * y) / math.sqrt(vx * vy)))


def best_ttl(durations: Iterable[float], benefit: float) -> float:
    """argmax over tau in {0} + observed durations of F(tau) * benefit - tau (ties: shorter)."""
    values = sorted(durations)
    n = len(values)
    best_tau, best = 0.0, 0.0
    for i, d in enumerate(values):
        if i + 1 < n and values[i + 1] == d:
            continue  # F jumps after the last copy of a value
        u = (i + 1) / n * benefit - d
        if u > best:
            best_tau, best = d, u
    return best_tau


class DurationWindow:
    """The last `size` call durations, kept sorted as well, with `best_ttl`'s candidates as
    arrays until the next sample: a TTL is chosen at every pause over up to `size` samples, and
    sorting and scanning them each time was most of a loaded run."""

    def __init__(self, size: int) -> None:
        self.recent: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []
        # (each value's last copy in sorted order, its share F(value) of the samples)
        self._candidates: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None

    def append(self, x: float) -> None:
        if len(self.recent) == self.recent.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self.recent[0])]
        self.recent.append(x)
        bisect.insort(self._sorted, x)
        self._candidates = None

    def __len__(self) -> int:
        return len(self.recent)

    def __iter__(self) -> Iterator[float]:
        return iter(self.recent)

    def best_ttl(self, benefit: float) -> float:
        """`best_ttl(self, benefit)`: the same numbers, in the same order of operations."""
        if self._candidates is None:
            values = np.array(self._sorted, dtype=np.float64)
            n = len(values)
            # F jumps after the last copy of a value: where the next one differs.
            last = np.flatnonzero(np.append(values[1:] != values[:-1], n > 0))
            # (i + 1) / n as Python divides: both exact in float64, the quotient rounded once.
            self._candidates = (values[last], (last + 1) / max(n, 1))
        values, share = self._candidates
        if len(values) == 0:
            return 0.0
        utility = share * benefit - values
        # The first largest utility, if above 0: `best_ttl` keeps the first strictly larger.
        i = int(np.argmax(utility))
        return float(values[i]) if utility[i] > 0.0 else 0.0


class ContinuumPolicy(Policy):
    name = "continuum"
    traits = Traits(batch_mode=BatchMode.CHUNKED)
    description = (
        "Pins a paused request's KV for a TTL maximising P(tool back) x (reload + queueing) "
        "- TTL, from per-tool duration CDFs; drops it when the TTL expires or memory runs "
        "out (latest program first); program-level FCFS (Continuum)."
    )

    def __init__(
        self,
        profile: Profile,
        fixed_ttl_s: float | None = None,
        window: int = WINDOW,
        prior_mean_s: float = PRIOR_MEAN_S,
    ) -> None:
        super().__init__(profile)
        if window < 1 or (fixed_ttl_s is not None and fixed_ttl_s < 0) or prior_mean_s <= 0:
            raise ValueError("continuum: window >= 1, fixed_ttl_s >= 0 and prior_mean_s > 0")
        self.fixed_ttl_s = fixed_ttl_s
        self.prior_mean_s = prior_mean_s
        self.window = window
        self.durations: dict[str, DurationWindow] = {}
        self.all_durations = DurationWindow(window)
        self.calls_seen = 0
        self.waits: deque[float] = deque(maxlen=HISTORY)
        self.correlation = Correlation()
        self.deadline: dict[str, float] = {}  # pinned request -> when its TTL ends
        self._dropped: set[str] = set()  # KV dropped by us: its wait feeds T
        self._queued_at: dict[str, float] = {}

    # --- the TTL -------------------------------------------------------------------------
    def reload_s(self, context: int) -> float:
        p = self.profile
        chunks = max(1, -(-context // p.saturation_tokens))
        return (p.fwd_a_ms * context + chunks * p.fwd_c_ms) / 1000.0

    def queue_delay_s(self) -> float:
        return sum(self.waits) / len(self.waits) if self.waits else 0.0

    def ttl(self, tool: str, context: int) -> float:
        own = self.durations.get(tool)
        if self.fixed_ttl_s is not None:
            mean = sum(own) / len(own) if own else 0.0
            return self.fixed_ttl_s if mean <= self.fixed_ttl_s else 0.0
        cold = self.calls_seen <= COLD_START_CALLS
        eta = 1.0 if cold else self.correlation.eta()
        benefit = self.queue_delay_s() * eta + self.reload_s(context)
        if cold:
            # U(tau) = (1 - exp(-tau/mu)) * B - tau is largest at tau = mu * ln(B / mu).
            mu = self.prior_mean_s
            return mu * math.log(benefit / mu) if benefit > mu else 0.0
        samples = own if own is not None and len(own) > COLD_START_CALLS else self.all_durations
        return samples.best_ttl(benefit)

    # --- hooks ---------------------------------------------------------------------------
    def on_pause(self, req: RequestView, now: float) -> None:
        self.deadline[req.request_id] = now + self.ttl(call_key(req), req.context_tokens)

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        self.deadline.pop(req.request_id, None)
        tool = call_key(req)
        own = self.durations.get(tool)
        if own is None:
            own = self.durations[tool] = DurationWindow(self.window)
        own.append(duration)
        self.all_durations.append(duration)
        self.calls_seen += 1

    def on_finish(self, req: RequestView, now: float) -> None:
        self.correlation.observe(req.calls_done + 1)
        for table in (self.deadline, self._queued_at):
            table.pop(req.request_id, None)
        self._dropped.discard(req.request_id)

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        if req.request_id in self._dropped:
            self._queued_at.setdefault(req.request_id, req.queue_time)
        # Program-level FCFS; a program still holding its KV first (v6 section 4.3).
        return (0.0 if req.gpu_tokens > 0 else 1.0, req.arrival)

    def preemption_order(self, running: Sequence[RequestView]) -> list[RequestView]:
        """The latest program first (the code preempts the latest job entry)."""
        return sorted(running, key=lambda r: (r.arrival, r.request_id), reverse=True)

    # --- every iteration -----------------------------------------------------------------
    def decide(self, view: SchedulerView) -> Decision:
        for r in view.running if self._queued_at else ():
            since = self._queued_at.pop(r.request_id, None)
            if since is not None:
                # The running view's queue time is its admission (RequestView contract).
                self.waits.append(max(0.0, r.queue_time - since))
                self._dropped.discard(r.request_id)
        p = view.profile
        now = view.now
        pinned = []
        drop: list[RequestView] = []
        for r in paused_on_gpu(view):
            if r.request_id not in self.deadline:
                assert r.paused_at is not None
                self.on_pause(r, r.paused_at)
            if now > self.deadline[r.request_id]:
                drop.append(r)
            else:
                pinned.append(r)
        # Only pinned requests answer a deficit: without any, it need not be worked out.
        deficit = self._deficit(view) if pinned else 0
        # Latest program arrival first: the oldest programs keep their place (FCFS).
        for r in sorted(pinned, key=lambda r: (r.arrival, r.request_id), reverse=True):
            if deficit <= 0:
                break
            pinned.remove(r)
            drop.append(r)
            deficit -= p.blocks(r.gpu_tokens)
        for r in drop:
            self._dropped.add(r.request_id)
        kv = tuple(KVAction(r.request_id, Handling.DISCARD, p.blocks(r.gpu_tokens)) for r in drop)
        review = min((self.deadline[r.request_id] for r in pinned), default=None)
        return Decision(kv=kv, review_at=None if review is None else review + PAST)

    def _deficit(self, view: SchedulerView) -> int:
        """GPU blocks short of progress: the decodes' next blocks, or, with nothing running,
        the queue head's whole context (so it does not start, stall and get preempted)."""
        p = view.profile
        if view.running:
            if len(view.running) <= view.free_gpu_blocks:
                # Each running request needs at most one block: no deficit (the caller only
                # compares it with 0), without a pass over the batch.
                return len(view.running) - view.free_gpu_blocks
            bs = p.block_size
            need = sum(r.pending_tokens == 0 and r.gpu_tokens % bs == 0 for r in view.running)
        elif view.waiting:
            head = view.waiting[0]
            need = p.blocks(head.context_tokens + 1) - p.blocks(head.gpu_tokens)
        else:
            return 0
        return need - view.free_gpu_blocks


class ContinuumFixedTtlPolicy(ContinuumPolicy):
    """Continuum as its released preview code runs: a fixed 2 s TTL for tools whose mean
    observed duration is at most 2 s, none for the others ("without the estimation in the
    paper", its README). `continuum` is the paper's estimator; the tables show the better."""

    name = "continuum-fixed-ttl"
    family = "continuum"
    description = (
        "Continuum's released preview: pin a paused request's KV for 2 s when its tool's "
        "mean duration is at most 2 s, else drop it; program-level FCFS."
    )

    def __init__(self, profile: Profile, window: int = WINDOW) -> None:
        super().__init__(profile, fixed_ttl_s=RELEASED_TTL_S, window=window)
