"""InferCept's min-waste schedule (DESIGN section 4).

Sources: Abhyankar et al., "InferCept: Efficient Intercept Support for Augmented Large Language
Model Inference", ICML 2024, arXiv 2402.01869, and the authors' code, github.com/WukLab/InferCept,
`vllm/core/scheduler_v2.py` (`_schedule_chunk_and_fill`, `discard_waste`).

Every iteration: each paused request's waste is min(Preserve, ChunkedDiscard) with the
interception time estimated as t_now - t_call; requests are swapped out in descending waste
while the swap budget lasts (partially if need be); of what is not swapped, a request is
preserved when Preserve < ChunkedDiscard and discarded otherwise. All queues are FCFS by the
original arrival time; recompute goes in chunks that fill the batch up to S.

The paper's alternative estimate, a per-tool duration profile, is `estimator="tool-profile"`:
T_INT is then the mean observed duration of the request kind's calls (learned online).
"""

from __future__ import annotations

from interlude.policy import waste
from interlude.policy.base import Policy, swap_out_budget_blocks
from interlude.policy.predict import PAST, Predictor
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


class InferCeptPolicy(Policy):
    name = "infercept"
    traits = Traits(batch_mode=BatchMode.CHUNKED)
    description = (
        "Min-waste handling (preserve vs chunked discard, eq. 4) with T_INT estimated as "
        "t_now - t_call, budgeted swap of the highest-waste paused requests, chunked "
        "recompute up to S, FCFS by original arrival."
    )

    ESTIMATORS = ("elapsed", "tool-profile")

    def __init__(self, profile: Profile, estimator: str = "elapsed") -> None:
        super().__init__(profile)
        if estimator not in self.ESTIMATORS:
            raise ValueError(f"infercept estimator must be one of {self.ESTIMATORS}")
        self.estimator = estimator
        self.predictor = Predictor()

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        self.predictor.observe_duration(req.kind, duration)

    def estimate_interception(self, r: RequestView, now: float) -> float:
        if self.estimator == "tool-profile":
            return self.predictor.duration(r.kind)
        assert r.paused_at is not None  # only called for paused requests
        return now - r.paused_at

    def decide(self, view: SchedulerView) -> Decision:
        p = view.profile
        m = p.kv_bytes_per_token
        now = view.now
        discard_waste = waste.chunked_discard_of(p, view.running_context, view.running_tokens)
        scored: list[tuple[float, float, float, RequestView]] = []
        for r in view.paused:
            if r.gpu_tokens == 0:
                continue
            pres = waste.preserve(p, self.estimate_interception(r, now), r.context_tokens)
            disc = discard_waste(r.context_tokens)
            scored.append((min(pres, disc), pres, disc, r))
        budget = swap_out_budget_blocks(view)
        if budget:
            scored.sort(key=lambda s: (-s[0], s[3].arrival))
        actions: list[KVAction] = []
        review_at: float | None = None
        for _, pres, disc, r in scored:
            blocks = p.blocks(r.gpu_tokens)
            swapped = min(blocks, budget)
            if swapped:
                actions.append(KVAction(r.request_id, Handling.SWAP, swapped))
                budget -= swapped
            rest = blocks - swapped
            if rest == 0:
                continue
            if pres >= disc:
                actions.append(KVAction(r.request_id, Handling.DISCARD, rest))
            elif self.estimator == "elapsed":
                # Preserve waste grows linearly with the estimate; it overtakes discard here.
                assert r.paused_at is not None
                cross = r.paused_at + disc / (r.context_tokens * m) + PAST
                review_at = cross if review_at is None or cross < review_at else review_at
        return Decision(kv=tuple(actions), review_at=review_at)
