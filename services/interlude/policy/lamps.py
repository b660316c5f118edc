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
from typing import ClassVar

from interlude.policy import waste
from interlude.policy.base import (
    KeyArray,
    KeyRows,
    RowArray,
    by_arrival,
    paused_on_gpu,
    swap_out_budget_blocks,
)
from interlude.policy.lamps_keys import Entry, KeyTable
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
_INDEX = {h: i for i, h in enumerate(_BY_NAME)}

# Queues at least this long are keyed on arrays (`KeyTable.keys`); shorter ones one by one.
ARRAY_KEYS_FROM = 24


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
        # Per request: its queue entry's terms and the strategy for its upcoming call, as last
        # chosen.
        self._table = KeyTable()
        # The strategies of paused requests (a paused request is not queued, so nothing
        # chooses again until its call returns): `decide` asks them at every iteration.
        self._held: dict[str, Handling] = {}
        # Promoted requests and their order. The starvation guard promotes only in `observe`,
        # which returns them as requeues, and a promotion lasts until the request finishes
        # (`on_finish`); asking the guard about every queued request cost more than the keys.
        self._promoted: dict[str, int] = {}
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
        rid = r.request_id
        s = self._held.get(rid)
        if s is not None:
            return s
        table = self._table
        row = table.row_of(rid)
        i = int(table.strategy[row])
        if i < 0:
            s = choose_strategy(
                self.profile,
                r.context_tokens + self.tokens_ahead(r),
                self.call_duration(r),
                self.running_context,
                self.running_tokens,
            )
            table.strategy[row] = _INDEX[s]
        else:
            s = _BY_NAME[i]
        if r.phase is Phase.PAUSED:
            self._held[rid] = s
        return s

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        return self.queue_keys((req,), now)[0]

    def queue_keys(self, reqs: Sequence[RequestView], now: float) -> list[tuple[float, ...]]:
        """`AreaRankedPolicy.queue_key`, fast: engines ask it for every queued request at
        every iteration. The strategy is chosen again from this batch and the area priced."""
        if len(reqs) < ARRAY_KEYS_FROM:
            return self._keys_one_by_one(reqs, self.running_context, self._t_tok)
        return list(map(tuple, self._key_array(reqs).keys.tolist()))

    def rank_keys(
        self, reqs: Sequence[RequestView], now: float, rows: RowArray | None = None
    ) -> list[tuple[float, ...]] | KeyArray | KeyRows:
        """`queue_keys`: a list for short queues, an array for long ones (`KeyTable.keys`),
        with each request's row of the table.

        Engines ask this for queued requests whose current entry the policy ranked when it
        began (`queue_key`; the simulator ranks every entering request so), so their terms
        are kept: unlike `queue_keys` it does not look for new entries among them, which cost
        as much as the keys (two passes over the queue in Python). A row stays the request's
        until it finishes, so the `rows` handed back need no look-up either.
        """
        if len(reqs) < ARRAY_KEYS_FROM:
            return self._keys_one_by_one(reqs, self.running_context, self._t_tok)
        idx = self._table.known_rows(reqs, rows)
        if idx is None:  # some were never ranked: look for new entries after all
            return self._key_array(reqs)
        m = self.profile.kv_bytes_per_token
        return KeyRows(self._table.keys(idx, self.running_context, self._t_tok, m), idx)

    def _key_array(self, reqs: Sequence[RequestView]) -> KeyRows:
        """The keys of `reqs` on arrays, new queue entries among them kept first."""
        table = self._table
        idx, new = table.rows(reqs)
        for j in new:  # new queue entries, in queue order (the starvation guard counts them)
            idx[j] = self._enter(reqs[j])
        m = self.profile.kv_bytes_per_token
        return KeyRows(table.keys(idx, self.running_context, self._t_tok, m), idx)

    def _enter(self, req: RequestView) -> int:
        """`req` is in a queue entry not seen before: count it and keep its terms."""
        self.starvation.on_queued(req)
        return self._table.enter(req.request_id, self._entry(req))

    def _keys_one_by_one(
        self, reqs: Sequence[RequestView], c_other: int, t_tok: float
    ) -> list[tuple[float, ...]]:
        """`KeyTable.keys` as a loop, for short queues."""
        m = self.profile.kv_bytes_per_token
        table, promoted = self._table, self._promoted
        entries = table.entry
        keys: list[tuple[float, ...]] = []
        for req in reqs:
            rid = req.request_id
            e = entries.get(rid)
            if e is None or e.stamp != (req.queue_time, req.queue_iteration):
                self._enter(req)
                e = entries[rid]
            order = promoted.get(rid)
            if order is not None:
                keys.append((-1.0, float(order)))
                continue
            e = entries[rid]
            discard = (e.own + e.per_other * c_other) * m
            swap = e.swap_rate * (c_other + e.c) * m
            # choose_strategy's argmin, ties broken by name: discard < preserve < swap.
            if discard <= e.preserve and discard <= swap:
                i = 0
            elif e.preserve <= swap:
                i = 1
            else:
                i = 2
            table.strategy[table.row[rid]] = i  # (entering may have grown the table)
            keys.append((0.0, e.decode * t_tok + e.area[i]))
        return keys

    def _entry(self, req: RequestView) -> Entry:
        p = self.profile
        gen = self.tokens_ahead(req)
        duration = self.call_duration(req)
        c = max(1, round(req.context_tokens + gen))
        end = req.context_tokens + gen
        return Entry(
            stamp=(req.queue_time, req.queue_iteration),
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
        # Promotions happen here and are announced as requeues (`Decision.requeue`).
        for rid in out[0]:
            order = self.starvation.promotion(rid)
            if order is not None:
                self._promoted[rid] = order
                self._table.promote(rid, order)
        return out

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        super().on_resume(req, now, duration)
        rid = req.request_id
        self._held.pop(rid, None)
        row = self._table.row.get(rid)
        if row is not None:
            self._table.strategy[row] = -1

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        rid = req.request_id
        self._held.pop(rid, None)
        self._promoted.pop(rid, None)
        self._table.forget(rid)

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
