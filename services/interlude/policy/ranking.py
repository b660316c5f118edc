"""Memory-over-time ranking with a starvation guard, re-keyed every iteration: LAMPS's queue
discipline, and the base `interlude` shares.

A waiting request is ranked by the area under its predicted KV-memory-over-time curve until its
next call returns (smallest first: short, memory-light work does not wait behind the rest),
except that promoted (starving) requests go first. The area depends on how the request's call
will be handled, chosen as the argmin of the three wastes (`choose_strategy`), and both depend
on the running batch; so every queued request is keyed again at every iteration from the batch
of that iteration (`Traits.rescore_queued`), as the LAMPS authors' scheduler re-sorts its queues
(github.com/mars-repository/mars-codebase, `vllm/core/scheduler_v2.py`).

`lamps` ranks so. `interlude` keeps the shared parts (predictor, starvation guard, area) but
overrides the keys to price each request once, at queue entry: re-keyed, it held the
simulator's rates with a lower p99 past each edge, but on the real engine new conversations
waited longer (docs/policies.md, "LAMPS's ranking re-keyed: shipped, then taken back");
`variants.Rekeyed` is that re-keyed `interlude`.

What a key needs from a request is fixed for its queue entry (`lamps_keys.Entry`), only the
batch changes, so long queues are keyed on arrays (`KeyTable`) and short ones one by one; the
two give the same numbers (tests/policy/test_lamps.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from interlude.policy import waste
from interlude.policy.base import KeyArray, KeyRows, Policy, RowArray
from interlude.policy.lamps_keys import Entry, KeyTable
from interlude.policy.predict import Predictor
from interlude.policy.profile import Profile
from interlude.policy.starvation import StarvationGuard
from interlude.policy.types import (
    BatchMode,
    Handling,
    Phase,
    RequestView,
    SchedulerView,
    Traits,
)

# Queues at least this long are keyed on arrays (`KeyTable.keys`); shorter ones one by one.
ARRAY_KEYS_FROM = 24

# The strategies in the order that breaks ties in `choose_strategy` (by name).
BY_NAME = (Handling.DISCARD, Handling.PRESERVE, Handling.SWAP)
_INDEX = {h: i for i, h in enumerate(BY_NAME)}


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
    """Base of policies that rank queues by memory-time area, re-keyed every iteration.

    Key of a queued request: (0.0, area) with the area of `memory_time_area` under the
    strategy `choose_strategy` picks from the batch last observed, or (-1.0, promotion order)
    once the starvation guard has promoted it. Side effects: keying a request records its
    chosen strategy (`rank_strategy` answers it until the request resumes from its call) and
    counts a new queue entry once for the starvation guard.
    """

    traits = Traits(batch_mode=BatchMode.CHUNKED, rescore_queued=True)

    def __init__(self, profile: Profile, predictor: Predictor | None = None) -> None:
        super().__init__(profile)
        self.predictor = predictor or Predictor()
        self.starvation = StarvationGuard()
        # Batch state seen at the last decision: C_other and running tokens for the equations.
        self.running_context = 0
        self.running_tokens = 0
        # Per request: its queue entry's terms and the strategy for its upcoming call, as last
        # chosen.
        self._table = KeyTable()
        # Promoted requests and their order. The starvation guard promotes only in `observe`,
        # which returns them as requeues, and a promotion lasts until the request finishes
        # (`on_finish`); asking the guard about every queued request cost more than the keys.
        self._promoted: dict[str, int] = {}
        self._t_tok = profile.t_fwd(1)  # iteration time of the batch last seen

    def tokens_ahead(self, r: RequestView) -> float:
        """Predicted tokens `r` still generates before its next call (0 once it is paused)."""
        if r.phase is Phase.PAUSED:
            return 0.0
        return max(0.0, self.predictor.segment_tokens(r.kind) - r.generated_tokens)

    def call_duration(self, r: RequestView) -> float:
        """Predicted seconds of the call that ends `r`'s current segment."""
        return self.predictor.duration(r.kind)

    def rank_strategy(self, r: RequestView) -> Handling:
        """The handling `r`'s next call was last ranked with (chosen now if never)."""
        table = self._table
        row = table.row_of(r.request_id)
        i = int(table.strategy[row])
        if i >= 0:
            return BY_NAME[i]
        s = choose_strategy(
            self.profile,
            r.context_tokens + self.tokens_ahead(r),
            self.call_duration(r),
            self.running_context,
            self.running_tokens,
        )
        table.strategy[row] = _INDEX[s]
        return s

    def preemption_order(self, running: Sequence[RequestView]) -> list[RequestView]:
        """vLLM's order (last admitted first), except that promoted requests go last: a
        starving request stays at the head "until it finishes", not until the next preemption."""
        order = super().preemption_order(running)
        if not self.starvation.any_promoted:
            return order  # every key below is False: the stable sort would change nothing
        return sorted(order, key=lambda r: self.starvation.promotion(r.request_id) is not None)

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        return self.queue_keys((req,), now)[0]

    def queue_keys(self, reqs: Sequence[RequestView], now: float) -> list[tuple[float, ...]]:
        """The keys of `reqs` from this batch: engines ask it for every queued request at
        every iteration. The strategy is chosen again and the area priced."""
        if len(reqs) < ARRAY_KEYS_FROM:
            return self._keys_one_by_one(reqs)
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
            return self._keys_one_by_one(reqs)
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

    def _keys_one_by_one(self, reqs: Sequence[RequestView]) -> list[tuple[float, ...]]:
        """`KeyTable.keys` as a loop, for short queues."""
        m = self.profile.kv_bytes_per_token
        c_other, t_tok = self.running_context, self._t_tok
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
        """The terms of `choose_strategy` and `memory_time_area` that depend on `req` alone."""
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
        """Take in this iteration's batch state; return (requeue ids, next review iteration).

        Promotions happen here and are announced as requeues (`Decision.requeue`)."""
        self.running_context = view.running_context
        self.running_tokens = view.running_tokens
        self._t_tok = self.profile.t_fwd(max(self.running_tokens, 1))
        out = self.starvation.update(view.iteration)
        for rid in out[0]:
            order = self.starvation.promotion(rid)
            if order is not None:
                self._promoted[rid] = order
                self._table.promote(rid, order)
        return out

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        """Learn the call's duration; the next call's strategy is chosen afresh."""
        self.predictor.observe_duration(req.kind, duration)
        row = self._table.row.get(req.request_id)
        if row is not None:
            self._table.strategy[row] = -1

    def on_segment(self, req: RequestView, gen_tokens: int) -> None:
        self.predictor.observe_segment(req.kind, gen_tokens)

    def on_finish(self, req: RequestView, now: float) -> None:
        rid = req.request_id
        self.starvation.forget(rid)
        self._promoted.pop(rid, None)
        self._table.forget(rid)
