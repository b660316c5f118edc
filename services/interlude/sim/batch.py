"""Batch formation for one iteration: which requests decode, which prefill how many tokens,
and whom to preempt when the GPU runs out of blocks. It allocates the blocks it schedules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interlude.policy.base import Policy
from interlude.policy.batching import step_budget
from interlude.policy.profile import Profile
from interlude.policy.types import BatchMode, Phase
from interlude.sim.kv import KVBook
from interlude.sim.ranked_queue import RankedQueue
from interlude.sim.request import SimRequest
from interlude.sim.running import Decoding, Running


@dataclass
class Batch:
    """What one iteration computes. Built and consumed inside one simulator step."""

    decodes: list[SimRequest] = field(default_factory=list)
    # (request, tokens prefilled this iteration, of which recomputation)
    chunks: list[tuple[SimRequest, int, int]] = field(default_factory=list)
    admitted: list[SimRequest] = field(default_factory=list)
    # Running requests with tokens still to prefill when the batch was formed.
    partial: list[SimRequest] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    # GPU blocks set aside for the tokens this iteration samples (decodes, finished prefills).
    reserved_blocks: int = 0
    # The decoding requests `decodes` lists, kept as one cohort (see `running.py`).
    decoding: Decoding | None = None

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n, _ in self.chunks)

    @property
    def recompute_tokens(self) -> int:
        return sum(r for _, _, r in self.chunks)

    @property
    def tokens(self) -> int:
        return len(self.decodes) + self.prefill_tokens


def _fit(kv: KVBook, r: SimRequest, want: int, free: int) -> int:
    """Most of `want` tokens `r` can add on the GPU with `free` blocks."""
    room = (kv.blocks(r.gpu_tokens) + free) * kv.bs - r.gpu_tokens
    return max(0, min(want, room))


def _prefill(kv: KVBook, batch: Batch, r: SimRequest, n: int) -> None:
    recompute = min(n, r.recompute_left)
    kv.set_gpu(r, r.gpu_tokens + n)
    r.pending_tokens -= n
    r.recompute_left -= recompute
    r.recomputed_tokens += recompute
    batch.chunks.append((r, n, recompute))


@dataclass(frozen=True)
class _Admission:
    """What bounds one iteration's admissions besides memory and the token budget."""

    now: float
    iteration: int
    hold: frozenset[str]  # the policy's held requests: passed over, kept in place
    admit_limit: int | None  # at most this many from the queue's head (None: no limit)
    parked_slots: int  # paused requests holding `max_num_seqs` slots (their KV is on the GPU)
    reserve: int  # free blocks admissions leave alone (`SwapIns.reserve`)


class Batcher:
    def __init__(self, profile: Profile, policy: Policy, kv: KVBook) -> None:
        self.p = profile
        self.policy = policy
        self.kv = kv
        self.mode = policy.traits.batch_mode
        self.step = step_budget(self.mode, profile)

    def form(
        self,
        running: Running,
        waiting: RankedQueue,
        now: float,
        iteration: int,
        hold: frozenset[str] = frozenset(),
        admit_limit: int | None = None,
        parked_slots: int = 0,
        reserve: int = 0,
    ) -> Batch:
        """Schedule one iteration. Mutates `running` (admissions, preemptions) and allocates.

        `waiting` is in the policy's order; admitted requests are removed from it. Requests
        named in `hold` (the policy's admission control) stay queued and are passed over; at
        most `admit_limit` requests are admitted from the queue's head (None: no limit).
        `parked_slots` paused requests (those with GPU KV) count against `max_num_seqs`.
        Admissions leave `reserve` free blocks alone.
        """
        admission = _Admission(now, iteration, hold, admit_limit, parked_slots, reserve)
        preempted: list[SimRequest] = []
        while True:
            batch = self._form_once(running, waiting, admission, preempted)
            if batch.tokens or not running:
                return batch
            # Every running request is mid-prefill and none can get a block: free the
            # lowest-priority one so the others make progress (vLLM v1 does the same).
            victim = self.policy.preemption_order(list(running))[0]
            self._preempt(running.all[victim.request_id], running, batch)
            preempted = batch.preempted

    def _form_once(
        self,
        running: Running,
        waiting: RankedQueue,
        admission: _Admission,
        preempted: list[SimRequest],
    ) -> Batch:
        batch = Batch(preempted=list(preempted))
        self._reserve_decodes(running, batch)
        whole = self.mode is BatchMode.PREFILL_FIRST
        # vLLM v0's prefill iteration runs no decodes: its budget is all the prompts'.
        budget = self.step.total - (0 if whole else len(batch.decodes))
        self._fill(running, waiting, batch, max(0, budget), whole, admission)
        if whole and batch.chunks:  # vLLM v0: a prefill iteration runs no decodes
            self.kv.gpu_free += batch.reserved_blocks
            batch.reserved_blocks = 0
            batch.decodes = []
        return batch

    def _reserve_decodes(self, running: Running, batch: Batch) -> None:
        # This runs every step: the cohort of decodes says how many blocks they need (a decode
        # needs a new block exactly when its GPU tokens fill whole blocks) without a pass over
        # the running requests.
        decoding = running.decoding
        need = decoding.need()
        if need > self.kv.gpu_free:
            victims = self.policy.preemption_order(list(running))
            for view in victims:
                if need <= self.kv.gpu_free:
                    break
                v = running.all[view.request_id]
                if v.pending_tokens == 0:
                    need -= self.kv.grow_cost(v, 1)
                self._preempt(v, running, batch)
        batch.decodes = list(decoding.members.values())
        batch.decoding = decoding
        batch.partial = list(running.prefilling.values())
        batch.reserved_blocks = need
        self.kv.gpu_free -= need

    def _preempt(self, r: SimRequest, running: Running, batch: Batch) -> None:
        """vLLM's recompute preemption: drop all GPU KV, back to the waiting queue."""
        running.remove(r)
        dropped = self.kv.free_cached(r)  # found again at its re-admission, if still cached
        r.pending_tokens += dropped
        r.recompute_left += dropped
        r.phase = Phase.WAITING  # running requests hold nothing in host memory
        batch.preempted.append(r)

    def _fill(
        self,
        running: Running,
        waiting: RankedQueue,
        batch: Batch,
        budget: int,
        whole: bool,
        admission: _Admission,
    ) -> None:
        # Running requests with pending tokens (resumed, or mid-prefill) go before admissions.
        partial = batch.partial
        if len(partial) > 1:
            partial.sort(key=lambda r: r.arrival)
        for r in partial:
            if budget <= 0:
                return
            if not self._take(r, batch, budget, whole, first=not batch.chunks):
                return
            budget -= batch.chunks[-1][1]
        if batch.preempted and not whole:
            # vLLM v1 admits nobody in a step that preempted (`if not preempted_reqs` before
            # its waiting loop): the blocks just freed go to the running requests first.
            return
        self._admit(running, waiting, batch, budget, whole, admission)

    def _admit(
        self,
        running: Running,
        waiting: RankedQueue,
        batch: Batch,
        budget: int,
        whole: bool,
        admission: _Admission,
    ) -> None:
        """Admit from the waiting queue's head, in its order, within `budget` tokens."""
        admitted = 0
        passed_over = False
        items = waiting.items
        # A re-rank left for later happens when admission reaches the ranked part (it keeps
        # the preempted head, so the requests before it stay where they are).
        ranked = waiting.ranked_start() if waiting.stale else -1
        kv = self.kv
        n_running, cap = len(running) + admission.parked_slots, self.p.max_num_seqs
        hold, now, iteration = admission.hold, admission.now, admission.iteration
        limit = len(items) if admission.admit_limit is None else admission.admit_limit
        # The loop passes over every held request (admission control can hold most of the
        # queue), so it counts the running requests itself.
        for i in range(len(items)):
            # Waiting requests hold no GPU blocks: with none free, none can be admitted.
            if budget <= 0 or n_running >= cap or kv.gpu_free == 0 or admitted >= limit:
                break
            if i == ranked:
                waiting.settle()
            r = items[i]
            if hold and r.request_id in hold:
                passed_over = True
                continue
            first = not batch.chunks
            if not self._take(r, batch, budget, whole, first, admission=admission.reserve):
                break  # FCFS in the policy's order: no skipping ahead of the head
            budget -= batch.chunks[-1][1]
            running.add(r, prefilling=True)  # it samples its first token when the chunk ends
            n_running += 1
            r.phase = Phase.RUNNING
            r.queue_time, r.queue_iteration = now, iteration
            r.scheduled_once = True
            batch.admitted.append(r)
            admitted += 1
        if not passed_over:
            waiting.pop_front(admitted)
            return
        # Held requests stay where they were: the admitted ones are not a prefix of the queue.
        for r in batch.admitted:
            waiting.remove(r)

    def _take(
        self,
        r: SimRequest,
        batch: Batch,
        budget: int,
        whole: bool,
        first: bool,
        admission: int | None = None,
    ) -> bool:
        """Prefill up to `budget` tokens of `r`; False when it cannot be scheduled now.

        Prefill-first (vLLM v0) schedules whole prompts only, except that the first one of an
        iteration may be cut to the token budget so that no prompt waits forever. An admission
        (`admission` not None: from the waiting queue, leaving that many free blocks alone)
        needs free blocks for all of its pending tokens, even when only a chunk is prefilled
        now: vLLM 0.32's `scheduler_reserve_full_isl`, on by default (`full_sequence_must_fit`
        in its `allocate_slots`), the engine's rule.
        """
        kv = self.kv
        if admission is not None and kv.grow_cost(r, r.pending_tokens) + admission > kv.gpu_free:
            return False
        # The cached blocks of an admission's context are free blocks it takes, so the check
        # above counts them, as vLLM's `allocate_slots` does; they are not computed again.
        hit = kv.take_cached(r) if admission is not None and r.gpu_tokens == 0 else 0
        want = min(r.pending_tokens, budget, self.step.per_request)
        n = _fit(kv, r, want, kv.gpu_free)
        if n == r.pending_tokens and _fit(kv, r, n + 1, kv.gpu_free) <= n:
            n -= 1  # finishing the prefill samples a token, which needs a slot too
        if n <= 0 or (whole and (n < want or (want < r.pending_tokens and not first))):
            if hit:
                kv.untake_cached(r, hit)
            return False
        _prefill(kv, batch, r, n)
        if r.pending_tokens == 0:
            extra = kv.grow_cost(r, 1)
            kv.gpu_free -= extra
            batch.reserved_blocks += extra
        return True
