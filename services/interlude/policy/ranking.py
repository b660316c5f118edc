"""Memory-over-time ranking with a starvation guard: the queue discipline of `lamps` and
`interlude`.

A waiting request is ranked by the area under its predicted KV-memory-over-time curve until its
next call returns (smallest first: short, memory-light work does not wait behind the rest),
except that promoted (starving) requests go first. Predictions come from the shared online
`Predictor`, so both policies see the same information.
"""

from __future__ import annotations

from collections.abc import Sequence

from interlude.policy.base import Policy
from interlude.policy.predict import Predictor
from interlude.policy.profile import Profile
from interlude.policy.starvation import StarvationGuard
from interlude.policy.types import Handling, Phase, RequestView, SchedulerView


def memory_time_area(
    p: Profile, context: float, gen: float, duration: float, strategy: Handling, t_tok: float
) -> float:
    """Token-seconds of KV a request holds until its next call returns, under `strategy`.

    Decoding `gen` tokens from `context` holds (context*gen + gen^2/2)*t_tok; during the call
    preserve holds the whole context, discard holds nothing but pays a recompute spike, swap
    holds it for the copy out and back.
    """
    end = context + gen
    area = (context * gen + gen * gen / 2) * t_tok
    if strategy is Handling.PRESERVE:
        return area + end * duration
    if strategy is Handling.DISCARD:
        return area + end * p.t_fwd(end) / 2
    return area + end * 2 * p.t_swap(end)


class AreaRankedPolicy(Policy):
    """Base of policies that rank queues by memory-time area; subclasses pick the strategy."""

    def __init__(self, profile: Profile, predictor: Predictor | None = None) -> None:
        super().__init__(profile)
        self.predictor = predictor or Predictor()
        self.starvation = StarvationGuard()
        # Batch state seen at the last decision: C_other and running tokens for the equations.
        self.running_context = 0
        self.running_tokens = 0

    def tokens_ahead(self, r: RequestView) -> float:
        """Predicted tokens `r` still generates before its next call (0 once it is paused)."""
        if r.phase is Phase.PAUSED:
            return 0.0
        return max(0.0, self.predictor.segment_tokens(r.kind) - r.generated_tokens)

    def call_duration(self, r: RequestView) -> float:
        """Predicted seconds of the call that ends `r`'s current segment."""
        return self.predictor.duration(r.kind)

    def rank_strategy(self, r: RequestView) -> Handling:
        """The handling `r` is expected to get at its next call."""
        raise NotImplementedError

    def preemption_order(self, running: Sequence[RequestView]) -> list[RequestView]:
        """vLLM's order (last admitted first), except that promoted requests go last: a
        starving request stays at the head "until it finishes", not until the next preemption."""
        order = super().preemption_order(running)
        if not self.starvation.any_promoted:
            return order  # every key below is False: the stable sort would change nothing
        return sorted(order, key=lambda r: self.starvation.promotion(r.request_id) is not None)

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        self.starvation.on_queued(req)
        order = self.starvation.promotion(req.request_id)
        if order is not None:
            return (-1.0, float(order))
        p = self.profile
        gen = self.tokens_ahead(req)
        t_tok = p.t_fwd(max(self.running_tokens, 1))
        strategy = self.rank_strategy(req)
        area = memory_time_area(
            p, req.context_tokens, gen, self.call_duration(req), strategy, t_tok
        )
        return (0.0, area)

    def observe(self, view: SchedulerView) -> tuple[tuple[str, ...], int | None]:
        """Take in this iteration's batch state; return (requeue ids, next review iteration)."""
        self.running_context = view.running_context
        self.running_tokens = view.running_tokens
        return self.starvation.update(view.iteration)

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        self.predictor.observe_duration(req.kind, duration)

    def on_segment(self, req: RequestView, gen_tokens: int) -> None:
        self.predictor.observe_segment(req.kind, gen_tokens)

    def on_finish(self, req: RequestView, now: float) -> None:
        self.starvation.forget(req.request_id)
