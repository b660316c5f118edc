"""Memory-over-time ranking with a starvation guard: the queue discipline `interlude` and
`lamps` share.

A waiting request is ranked by the area under its predicted KV-memory-over-time curve until its
next call returns (`area.memory_time_area`; smallest first: short, memory-light work does not
wait behind the rest), except that promoted (starving) requests go first. The area depends on
how the request's call will be handled (`rank_strategy`) and on the running batch. A policy
keys its queue one of two ways, chosen by its `Traits.rescore_queued`:

* once, as a request enters its queue, from the batch of that moment (`interlude`): engines
  ask once per entry;
* again at every iteration from that iteration's batch, with the handling the three wastes'
  argmin (`lamps`, as the LAMPS authors' scheduler re-sorts its queues): engines ask every
  iteration, and `rekeyed.RekeyedKeys` answers. Re-keyed, `interlude` held the simulator's
  rates with a lower p99 past each edge, but on the real engine new conversations waited
  longer (docs/policies.md, "LAMPS's ranking re-keyed: shipped, then taken back");
  `variants.Rekeyed` is that variant.
"""

from __future__ import annotations

from collections.abc import Sequence

from interlude.policy.area import choose_strategy, memory_time_area
from interlude.policy.base import KeyArray, KeyRows, Policy, RowArray
from interlude.policy.predict import Predictor
from interlude.policy.profile import Profile
from interlude.policy.rekeyed import RekeyedKeys
from interlude.policy.starvation import StarvationGuard
from interlude.policy.types import (
    BatchMode,
    Handling,
    Phase,
    RequestView,
    SchedulerView,
    Traits,
)


class AreaRankedPolicy(Policy):
    """Base of policies that rank queues by memory-time area.

    Key of a queued request: (0.0, area) with the area of `memory_time_area` under
    `rank_strategy`, or (-1.0, promotion order) once the starvation guard has promoted it.
    Keyed at entry (the default `traits`), `rank_strategy` is `entry_strategy` from the batch
    last observed; re-keyed (`Traits.rescore_queued`), `rekeyed` prices the keys and keeps each
    request's strategy until its call returns. Side effects: keying a request counts a new
    queue entry with the starvation guard; `observe` takes in the batch and the guard's
    promotions.
    """

    traits = Traits(batch_mode=BatchMode.CHUNKED)

    def __init__(self, profile: Profile, predictor: Predictor | None = None) -> None:
        super().__init__(profile)
        self.predictor = predictor or Predictor()
        self.starvation = StarvationGuard()
        # Batch state seen at the last decision: C_other and running tokens for the equations,
        # and its iteration time.
        self.running_context = 0
        self.running_tokens = 0
        self.t_tok = profile.t_fwd(1)
        self.rekeyed = RekeyedKeys(self) if self.traits.rescore_queued else None

    def tokens_ahead(self, r: RequestView) -> float:
        """Predicted tokens `r` still generates before its next call (0 once it is paused)."""
        if r.phase is Phase.PAUSED:
            return 0.0
        return max(0.0, self.predictor.segment_tokens(r.kind) - r.generated_tokens)

    def call_duration(self, r: RequestView) -> float:
        """Predicted seconds of the call that ends `r`'s current segment."""
        return self.predictor.duration(r.kind)

    def rank_strategy(self, r: RequestView) -> Handling:
        """The handling `r`'s key is priced under: as last chosen when re-keyed (chosen now
        if never), else `entry_strategy`."""
        if self.rekeyed is not None:
            return self.rekeyed.strategy(r)
        return self.entry_strategy(r)

    def entry_strategy(self, r: RequestView) -> Handling:
        """The handling a key priced at queue entry assumes: the three wastes' argmin from the
        batch last observed (LAMPS's, keyed once); `interlude` prices its own."""
        return choose_strategy(
            self.profile,
            r.context_tokens + self.tokens_ahead(r),
            self.call_duration(r),
            self.running_context,
            self.running_tokens,
        )

    def preemption_order(self, running: Sequence[RequestView]) -> list[RequestView]:
        """vLLM's order (last admitted first), except that promoted requests go last: a
        starving request stays at the head "until it finishes", not until the next preemption."""
        order = super().preemption_order(running)
        if not self.starvation.any_promoted:
            return order  # every key below is False: the stable sort would change nothing
        return sorted(order, key=lambda r: self.starvation.promotion(r.request_id) is not None)

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        if self.rekeyed is not None:
            return self.queue_keys((req,), now)[0]
        self.starvation.on_queued(req)
        order = self.starvation.promotion(req.request_id)
        if order is not None:
            return (-1.0, float(order))
        gen = self.tokens_ahead(req)
        strategy = self.entry_strategy(req)
        duration = self.call_duration(req)
        area = memory_time_area(
            self.profile, req.context_tokens, gen, duration, strategy, self.t_tok
        )
        return (0.0, area)

    def queue_keys(self, reqs: Sequence[RequestView], now: float) -> list[tuple[float, ...]]:
        if self.rekeyed is not None:
            return self.rekeyed.keys(reqs)
        return [self.queue_key(r, now) for r in reqs]

    def rank_keys(
        self, reqs: Sequence[RequestView], now: float, rows: RowArray | None = None
    ) -> list[tuple[float, ...]] | KeyArray | KeyRows:
        if self.rekeyed is not None:
            return self.rekeyed.rank_keys(reqs, rows)
        return self.queue_keys(reqs, now)

    def observe(self, view: SchedulerView) -> tuple[tuple[str, ...], int | None]:
        """Take in this iteration's batch state; return (requeue ids, next review iteration).

        Promotions happen here and are announced as requeues (`Decision.requeue`)."""
        self.running_context = view.running_context
        self.running_tokens = view.running_tokens
        self.t_tok = self.profile.t_fwd(max(self.running_tokens, 1))
        out = self.starvation.update(view.iteration)
        if self.rekeyed is not None:
            for rid in out[0]:
                order = self.starvation.promotion(rid)
                if order is not None:
                    self.rekeyed.promote(rid, order)
        return out

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        """Learn the call's duration; the next call's strategy is chosen afresh."""
        self.predictor.observe_duration(req.kind, duration)
        if self.rekeyed is not None:
            self.rekeyed.resumed(req.request_id)

    def on_segment(self, req: RequestView, gen_tokens: int) -> None:
        self.predictor.observe_segment(req.kind, gen_tokens)

    def on_finish(self, req: RequestView, now: float) -> None:
        self.starvation.forget(req.request_id)
        if self.rekeyed is not None:
            self.rekeyed.forget(req.request_id)
