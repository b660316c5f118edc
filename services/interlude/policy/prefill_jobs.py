"""A prefill engine's queue, TetriInfer's order (section 3.3), for the engine and the simulator.

A prefill job is a prompt computed for a decode engine: its first token is sampled there, its
KV handed on. TetriInfer ranks jobs shortest-job-first by prompt length, its best, within
*scheduling batches*: jobs are numbered by arrival and grouped into batches of `batch`; a batch
runs before the next, and within one the shorter prompt goes first, so a long prompt waits
behind at most a batch of shorter ones that came after it.

`PrefillBatches` is the rule; the engine's scheduler keys its prefill jobs with it
(`enginecore/prefill_order.py`), and the simulator's prefill engines run `PrefillJobs`, a policy
that keys every queued request with it and handles no KV (a prefill engine has no paused
sessions).
"""

from __future__ import annotations

import itertools

from interlude.policy.base import Policy
from interlude.policy.profile import Profile
from interlude.policy.types import BatchMode, Decision, RequestView, SchedulerView, Traits

SCHEDULING_BATCH = 16


class PrefillBatches:
    """Keys of prefill jobs. Invariant: a job keeps its number, so its key, for as long as it is
    known (asking again after a preemption or a re-rank gives the same key)."""

    def __init__(self, batch: int = SCHEDULING_BATCH) -> None:
        if batch < 1:
            raise ValueError(f"PrefillBatches: batch must be >= 1, got {batch}")
        self.batch = batch
        self._seq: dict[str, int] = {}
        self._next = itertools.count()

    def key(self, request_id: str, prompt_tokens: int) -> tuple[float, float, float]:
        """(scheduling batch, prompt tokens, arrival number): lower runs first."""
        seq = self._seq.get(request_id)
        if seq is None:
            seq = self._seq[request_id] = next(self._next)
        return (float(seq // self.batch), float(prompt_tokens), float(seq))

    def forget(self, request_id: str) -> None:
        self._seq.pop(request_id, None)


class PrefillJobs(Policy):
    name = "prefill-jobs"
    # As the engine's scheduler runs any policy: vLLM v1's chunked steps.
    traits = Traits(batch_mode=BatchMode.THRESHOLD)
    description = "A prefill engine: jobs in TetriInfer's order, no sessions, no KV actions."

    def __init__(self, profile: Profile, batch: int = SCHEDULING_BATCH) -> None:
        super().__init__(profile)
        self.batches = PrefillBatches(batch)

    def decide(self, view: SchedulerView) -> Decision:
        return Decision()

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        # The whole context: a job's prompt, or a resumed session's to recompute.
        return self.batches.key(req.request_id, req.context_tokens)

    def on_finish(self, req: RequestView, now: float) -> None:
        self.batches.forget(req.request_id)
