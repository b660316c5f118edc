"""LAMPS (a.k.a. MARS): a handling strategy chosen before the request runs, and queues ranked by
the area under each request's memory-over-time curve (DESIGN section 4).

Sources: Shahout et al., "Fast Inference for Augmented Large Language Models", arXiv 2410.18248
(NeurIPS 2025), and the authors' code, github.com/mars-repository/mars-codebase:
`vllm/core/scheduler_v2.py` (`classify`, `_schedule_chunk_and_fill`), `vllm/core/policy.py`
(`V2.get_priority`), `vllm/sequence.py` (the starvation counter), `exps/6B_bench.sh` (settings).

* Strategy: the argmin of the three wastes (preserve, chunked discard, synchronous swap) for the
  context at the call (context now + tokens still to generate before it) and the call's length.
* Rank: the memory-time area (`ranking.py`, which `interlude` shares), lowest first,
  recomputed for every queued request at every iteration from the batch state of that iteration
  (`Traits.rescore_queued`; `rekeyed.py`): the authors' scheduler re-sorts its swapped and
  waiting requests each iteration (`skip_sorting_for_this_number_of_iterations` defaults to 0)
  with the running batch of the moment. The strategy is re-chosen with the rank, so the one
  applied at the pause is the one chosen at the last iteration the request waited, before it
  ran. (The authors' code classifies when a request is added and when it resumes; a request
  that resumes straight into the running batch gets its strategy here at the pause, from the
  state then.)
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

from typing import ClassVar

from interlude.policy.base import by_arrival, paused_on_gpu, swap_out_budget_blocks
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


class LampsPolicy(AreaRankedPolicy):
    name = "lamps"
    description = (
        "Strategy per request chosen before it runs (argmin of the wastes at its next call), "
        "queues re-ranked every iteration by memory-over-time area, starvation counter with "
        "threshold 100; the trace's true lengths where the engine knows them."
    )
    traits = Traits(batch_mode=BatchMode.CHUNKED, rescore_queued=True)
    # Whether the true lengths of the view (when present) replace the predictions.
    oracle: ClassVar[bool] = True

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        # The strategies of paused requests (a paused request is not queued, so nothing
        # chooses again until its call returns): `decide` asks them at every iteration.
        self._held: dict[str, Handling] = {}

    def tokens_ahead(self, r: RequestView) -> float:
        truth = r.oracle_gen_tokens if self.oracle else None
        if truth is None:
            return super().tokens_ahead(r)
        return 0.0 if r.phase is Phase.PAUSED else float(max(0, truth - r.generated_tokens))

    def call_duration(self, r: RequestView) -> float:
        truth = r.oracle_call_s if self.oracle else None
        return super().call_duration(r) if truth is None else truth

    def rank_strategy(self, r: RequestView) -> Handling:
        """The strategy last chosen, and applied at the pause: held until the call returns."""
        rid = r.request_id
        s = self._held.get(rid)
        if s is not None:
            return s
        s = super().rank_strategy(r)
        if r.phase is Phase.PAUSED:
            self._held[rid] = s
        return s

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        super().on_resume(req, now, duration)
        self._held.pop(req.request_id, None)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self._held.pop(req.request_id, None)

    def decide(self, view: SchedulerView) -> Decision:
        p = view.profile
        requeue, review = self.observe(view)
        budget = swap_out_budget_blocks(view)
        actions: list[KVAction] = []
        movable = [r for r in paused_on_gpu(view) if self.rank_strategy(r) is not Handling.PRESERVE]
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
