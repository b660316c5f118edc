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
from interlude.policy.base import Policy, paused_on_gpu, swap_out_budget_blocks
from interlude.policy.predict import PAST, TIE, Predictor
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
    # False: score paused requests straight from the waste equations (tests compare the two).
    cache_terms = True

    def __init__(self, profile: Profile, estimator: str = "elapsed") -> None:
        super().__init__(profile)
        if estimator not in self.ESTIMATORS:
            raise ValueError(f"infercept estimator must be one of {self.ESTIMATORS}")
        self.estimator = estimator
        self.predictor = Predictor()
        # request -> (context, its own chunked-discard terms): see `_score`.
        self._terms: dict[str, tuple[int, float, float]] = {}

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        self.predictor.observe_duration(req.kind, duration)
        self._terms.pop(req.request_id, None)

    def on_finish(self, req: RequestView, now: float) -> None:
        self._terms.pop(req.request_id, None)

    def estimate_interception(self, r: RequestView, now: float) -> float:
        if self.estimator == "tool-profile":
            return self.predictor.duration(r.kind)
        assert r.paused_at is not None  # only called for paused requests
        return now - r.paused_at

    def decide(self, view: SchedulerView) -> Decision:
        p = view.profile
        m = p.kv_bytes_per_token
        scored = self._score(view) if self.cache_terms else self._score_reference(view)
        budget = swap_out_budget_blocks(view)
        if budget:
            scored.sort(key=lambda s: (-s[0], s[3].arrival))
        elapsed = self.estimator == "elapsed"
        actions: list[KVAction] = []
        review_at: float | None = None
        for _, pres, disc, r in scored:
            rest = 0  # blocks left after the swap; without a budget, only a discard counts them
            if budget:
                blocks = p.blocks(r.gpu_tokens)
                swapped = min(blocks, budget)
                if swapped:
                    actions.append(KVAction(r.request_id, Handling.SWAP, swapped))
                    budget -= swapped
                rest = blocks - swapped
                if rest == 0:
                    continue
            if pres >= disc * (1 - TIE):  # a crossing within float noise counts as crossed
                rest = rest or p.blocks(r.gpu_tokens)
                actions.append(KVAction(r.request_id, Handling.DISCARD, rest))
            elif elapsed:
                # Preserve waste grows linearly with the estimate; it overtakes discard here.
                assert r.paused_at is not None
                cross = r.paused_at + disc / (r.context_tokens * m) + PAST
                review_at = cross if review_at is None or cross < review_at else review_at
        return Decision(kv=tuple(actions), review_at=review_at)

    def _score_reference(
        self, view: SchedulerView
    ) -> list[tuple[float, float, float, RequestView]]:
        """(min waste, preserve, chunked discard, request) of every paused request on the GPU,
        straight from the equations."""
        p = view.profile
        now = view.now
        discard_waste = waste.chunked_discard_of(p, view.running_context, view.running_tokens)
        scored: list[tuple[float, float, float, RequestView]] = []
        for r in view.paused:
            if r.gpu_tokens == 0:
                continue
            pres = waste.preserve(p, self.estimate_interception(r, now), r.context_tokens)
            disc = discard_waste(r.context_tokens)
            scored.append((min(pres, disc), pres, disc, r))
        return scored

    def _score(self, view: SchedulerView) -> list[tuple[float, float, float, RequestView]]:
        """`_score_reference`, fast: it runs for every paused request at every iteration.

        A paused request's context is fixed until it resumes, so the chunked-discard terms that
        depend on it alone (`waste.chunked_discard_of`: T_fwd(C_i) * C_i / 2 and a * C_i) are
        worked out once per pause; the sums keep the equations' order of operations, so every
        number is the one `_score_reference` computes (a test runs both).
        """
        p = view.profile
        m = p.kv_bytes_per_token
        a = p.fwd_a_ms / 1000.0
        now = view.now
        c_other = view.running_context
        elapsed = self.estimator == "elapsed"
        terms = self._terms
        scored: list[tuple[float, float, float, RequestView]] = []
        # Most paused requests hold no GPU KV once the memory is full: filter in one pass.
        for r in paused_on_gpu(view):
            c_i = r.context_tokens
            t = terms.get(r.request_id)
            if t is None or t[0] != c_i:
                t = terms[r.request_id] = (c_i, p.t_fwd(c_i) * c_i / 2, a * c_i)
            if elapsed:
                assert r.paused_at is not None  # paused requests have a call start
                pres = (now - r.paused_at) * c_i * m
            else:
                pres = self.predictor.duration(r.kind) * c_i * m
            disc = (t[1] + t[2] * c_other) * m
            scored.append((pres if pres < disc else disc, pres, disc, r))
        return scored
