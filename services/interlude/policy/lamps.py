"""LAMPS (a.k.a. MARS): a handling strategy chosen before the request runs, and a waiting queue
ranked by the area under each request's memory-over-time curve (DESIGN section 4).

The strategy is the argmin of the three waste equations for the predicted context at the call
and the predicted call duration (per request kind, from the shared online `Predictor`); it is
fixed when the request is first ranked and applied when it pauses: preserve keeps the KV,
discard frees it, swap moves it out within the per-iteration budget (what does not fit the
budget yet stays until it does; with host memory full it is discarded). A request that has
run once and then waited 100 iterations goes to the head of the queue until it finishes.
"""

from __future__ import annotations

from interlude.policy import waste
from interlude.policy.base import by_arrival, swap_out_budget_blocks
from interlude.policy.profile import Profile
from interlude.policy.ranking import AreaRankedPolicy
from interlude.policy.types import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
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


class LampsPolicy(AreaRankedPolicy):
    name = "lamps"
    traits = Traits(batch_mode=BatchMode.CHUNKED)
    description = (
        "Strategy per request chosen before it runs (argmin of predicted wastes), waiting "
        "queue ranked by memory-over-time area, starvation counter with threshold 100."
    )

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        # Strategy fixed for each request's upcoming call.
        self._strategy: dict[str, Handling] = {}

    def rank_strategy(self, r: RequestView) -> Handling:
        s = self._strategy.get(r.request_id)
        if s is None:
            ctx = r.context_tokens + self.tokens_ahead(r)
            s = choose_strategy(
                self.profile,
                ctx,
                self.predictor.duration(r.kind),
                self.running_context,
                self.running_tokens,
            )
            self._strategy[r.request_id] = s
        return s

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        super().on_resume(req, now, duration)
        self._strategy.pop(req.request_id, None)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self._strategy.pop(req.request_id, None)

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
