"""LAMPS (a.k.a. MARS): a handling strategy chosen before the request runs, and queues ranked by
the area under each request's memory-over-time curve (DESIGN section 4).

Sources: Shahout et al., "Fast Inference for Augmented Large Language Models", arXiv 2410.18248
(NeurIPS 2025), and the authors' code, github.com/mars-repository/mars-codebase:
`vllm/core/scheduler_v2.py` (`classify`, `_schedule_chunk_and_fill`), `vllm/core/policy.py`
(`V2.get_priority`), `vllm/sequence.py` (the starvation counter), `exps/6B_bench.sh` (settings).

* Strategy: the argmin of the three wastes (preserve, chunked discard, synchronous swap) for the
  context at the call (context now + tokens still to generate before it) and the call's length.
* Rank: the memory-time area (`ranking.py`), lowest first, recomputed for every queued request
  at every iteration from the batch state of that iteration (`Traits.rescore_queued`): the
  authors' scheduler re-sorts its swapped and waiting requests each iteration
  (`skip_sorting_for_this_number_of_iterations` defaults to 0) with the running batch of the
  moment. The strategy is re-chosen with the rank, so the one applied at the pause is the one
  chosen at the last iteration the request waited, before it ran. (The authors' code classifies
  when a request is added and when it resumes; a request that resumes straight into the running
  batch gets its strategy here at the pause, from the state then.)
* At the pause: preserve keeps the KV, discard frees it, swap moves it out within the
  per-iteration budget (what does not fit yet stays until it does; with host memory full it is
  discarded).
* Starvation: a request that has run once and then waited 100 iterations goes to the head of the
  queue until it finishes (`--starvation-threshold 100` with a quantum of 100,000 iterations in
  `exps/6B_bench.sh`; `starvation.py`).

Which lengths the strategy and the rank use:
* `lamps` (the default): the request's true lengths, where the view carries them
  (`RequestView.oracle_gen_tokens`, `oracle_call_s`; the simulator fills them from the trace).
  That is how the paper's runs on this workload were made: the authors' benchmark
  (`benchmarks/fixed_final_tput_bench_real.py`) passes the dataset's pre-call length and call
  time as the "predicted" ones, plus noise whose knobs default to 0. Where the view has none
  (the vLLM engine), it falls back to the predictions below.
* `lamps-predicted`: per-kind online means from the shared `Predictor` (the estimates
  `interlude` gets too), taken when the request enters the queue: what a deployment without
  an oracle can have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from interlude.policy import waste
from interlude.policy.base import by_arrival, swap_out_budget_blocks
from interlude.policy.profile import Profile
from interlude.policy.ranking import AreaRankedPolicy
from interlude.policy.types import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
    Phase,
    RequestView,
    SchedulerView,
    Traits,
)


def choose_strategy(
    p: Profile, context: float, duration: float, c_other: int, running_tokens: int
) -> Handling:
    """Argmin of the three wastes for a call at `context` tokens lasting `duration` seconds."""
    c = max(1, round(context))
    options = {
        Handling.PRESERVE: waste.preserve(p, duration, c),
        Handling.DISCARD: waste.chunked_discard(p, c, c_other, running_tokens),
        Handling.SWAP: waste.sync_swap(p, c, c_other + c),
    }
    return min(options, key=lambda h: (options[h], h.value))


# The strategies in the order that breaks ties in `choose_strategy` (by name).
_BY_NAME = (Handling.DISCARD, Handling.PRESERVE, Handling.SWAP)


@dataclass(frozen=True, slots=True)
class _Entry:
    """What ranking a queued request needs, worked out once per queue entry: the request does
    not change while it waits (its lengths, true or predicted, are fixed for the segment, as
    the authors' code fixes them when a segment's request is created), only the batch does.
    The terms are those of `choose_strategy` and `memory_time_area`, in the same order of
    operations, so a key is the same number whichever way it is computed."""

    stamp: tuple[float, int]  # (queue time, queue iteration) of the entry
    c: int  # context at the call
    preserve: float  # waste.preserve
    own: float  # chunked discard: T_fwd(c) * c / 2, plus a * c per token of C_other
    per_other: float
    swap_rate: float  # sync swap: 2 * T_swap(c), times (C_other + c)
    decode: float  # memory-time of decoding up to the call, per second of iteration time
    area: tuple[float, float, float]  # memory-time during the call: discard, preserve, swap


class LampsPolicy(AreaRankedPolicy):
    name = "lamps"
    traits = Traits(batch_mode=BatchMode.CHUNKED, rescore_queued=True)
    description = (
        "Strategy per request chosen before it runs (argmin of the wastes at its next call), "
        "queues re-ranked every iteration by memory-over-time area, starvation counter with "
        "threshold 100; the trace's true lengths where the engine knows them."
    )
    # Whether the true lengths of the view (when present) replace the predictions.
    oracle: ClassVar[bool] = True

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        # The strategy for each request's upcoming call, as last chosen.
        self._strategy: dict[str, Handling] = {}
        self._entries: dict[str, _Entry] = {}
        self._t_tok = profile.t_fwd(1)  # iteration time of the batch last seen

    def tokens_ahead(self, r: RequestView) -> float:
        truth = r.oracle_gen_tokens if self.oracle else None
        if truth is None:
            return super().tokens_ahead(r)
        return 0.0 if r.phase is Phase.PAUSED else float(max(0, truth - r.generated_tokens))

    def call_duration(self, r: RequestView) -> float:
        truth = r.oracle_call_s if self.oracle else None
        return super().call_duration(r) if truth is None else truth

    def rank_strategy(self, r: RequestView) -> Handling:
        s = self._strategy.get(r.request_id)
        if s is None:
            s = choose_strategy(
                self.profile,
                r.context_tokens + self.tokens_ahead(r),
                self.call_duration(r),
                self.running_context,
                self.running_tokens,
            )
            self._strategy[r.request_id] = s
        return s

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        return self.queue_keys((req,), now)[0]

    def queue_keys(self, reqs: Sequence[RequestView], now: float) -> list[tuple[float, ...]]:
        """`AreaRankedPolicy.queue_key`, fast: engines ask it for every queued request at
        every iteration. The strategy is chosen again from this batch and the area priced."""
        entries, strategies = self._entries, self._strategy
        promotion = self.starvation.promotion
        m = self.profile.kv_bytes_per_token
        c_other, t_tok = self.running_context, self._t_tok
        keys: list[tuple[float, ...]] = []
        for req in reqs:
            rid = req.request_id
            stamp = (req.queue_time, req.queue_iteration)
            e = entries.get(rid)
            if e is None or e.stamp != stamp:  # a new queue entry
                self.starvation.on_queued(req)
                e = entries[rid] = self._entry(req, stamp)
            order = promotion(rid)
            if order is not None:
                keys.append((-1.0, float(order)))
                continue
            discard = (e.own + e.per_other * c_other) * m
            swap = e.swap_rate * (c_other + e.c) * m
            # choose_strategy's argmin, ties broken by name: discard < preserve < swap.
            if discard <= e.preserve and discard <= swap:
                i = 0
            elif e.preserve <= swap:
                i = 1
            else:
                i = 2
            strategies[rid] = _BY_NAME[i]
            keys.append((0.0, e.decode * t_tok + e.area[i]))
        return keys

    def _entry(self, req: RequestView, stamp: tuple[float, int]) -> _Entry:
        p = self.profile
        gen = self.tokens_ahead(req)
        duration = self.call_duration(req)
        c = max(1, round(req.context_tokens + gen))
        end = req.context_tokens + gen
        return _Entry(
            stamp=stamp,
            c=c,
            preserve=waste.preserve(p, duration, c),
            own=p.t_fwd(c) * c / 2,
            per_other=p.fwd_a_ms / 1000.0 * c,
            swap_rate=2 * p.t_swap(c),
            decode=req.context_tokens * gen + gen * gen / 2,
            area=(end * p.t_fwd(end) / 2, end * duration, end * 2 * p.t_swap(end)),
        )

    def observe(self, view: SchedulerView) -> tuple[tuple[str, ...], int | None]:
        out = super().observe(view)
        self._t_tok = self.profile.t_fwd(max(self.running_tokens, 1))
        return out

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        super().on_resume(req, now, duration)
        self._strategy.pop(req.request_id, None)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self._strategy.pop(req.request_id, None)
        self._entries.pop(req.request_id, None)

    def decide(self, view: SchedulerView) -> Decision:
        p = view.profile
        requeue, review = self.observe(view)
        budget = swap_out_budget_blocks(view)
        actions: list[KVAction] = []
        movable = [
            r
            for r in view.paused
            if r.gpu_tokens > 0 and self.rank_strategy(r) is not Handling.PRESERVE
        ]
        for r in sorted(movable, key=by_arrival):
            s = self.rank_strategy(r)
            blocks = p.blocks(r.gpu_tokens)
            if s is Handling.DISCARD:
                actions.append(KVAction(r.request_id, Handling.DISCARD, blocks))
            elif s is Handling.SWAP and view.free_cpu_blocks == 0:
                # Host memory is full: the swap cannot happen, fall back to recompute.
                actions.append(KVAction(r.request_id, Handling.DISCARD, blocks))
            elif s is Handling.SWAP and budget > 0:
                n = min(blocks, budget)
                budget -= n
                actions.append(KVAction(r.request_id, Handling.SWAP, n))
        return Decision(kv=tuple(actions), requeue=requeue, review_iteration=review)


class LampsPredictedPolicy(LampsPolicy):
    name = "lamps-predicted"
    description = (
        "lamps with per-kind online predictions of the pre-call length and the call's "
        "duration instead of the trace's true lengths."
    )
    oracle = False
