"""LAMPS's ranking: every queued request keyed again at each iteration, from that iteration's
batch.

The key's handling is the argmin of the three wastes (`area.choose_strategy`) and both it and
the area depend on the running batch, so the LAMPS authors' scheduler re-sorts its queues every
iteration with the batch of the moment (github.com/mars-repository/mars-codebase,
`vllm/core/scheduler_v2.py`). A policy ranks so when its `Traits.rescore_queued` is set
(`lamps`, and `variants.Rekeyed`); `ranking.AreaRankedPolicy` then hands its keys to a
`RekeyedKeys`.

What a key needs from a request is fixed for its queue entry (`lamps_keys.Entry`), only the
batch changes, so long queues are keyed on arrays (`KeyTable`) and short ones one by one; the
two give the same numbers (tests/policy/test_lamps.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from interlude.policy import waste
from interlude.policy.area import BY_NAME, choose_strategy
from interlude.policy.base import KeyRows, RowArray
from interlude.policy.lamps_keys import Entry, KeyTable
from interlude.policy.types import Handling, RequestView

if TYPE_CHECKING:  # the owner imports this module
    from interlude.policy.ranking import AreaRankedPolicy

# Queues at least this long are keyed on arrays (`KeyTable.keys`); shorter ones one by one.
ARRAY_KEYS_FROM = 24

_INDEX = {h: i for i, h in enumerate(BY_NAME)}


class RekeyedKeys:
    """The keys of an `AreaRankedPolicy` that re-keys its queue at every iteration.

    Key of a queued request: (0.0, area) with the area of `memory_time_area` under the strategy
    `choose_strategy` picks from the batch the owner last observed, or (-1.0, promotion order)
    once its starvation guard has promoted it. Side effects: keying a request records its
    chosen strategy (`strategy` answers it until `resumed`) and counts a new queue entry once
    with the owner's starvation guard. Reads the owner's lengths (`tokens_ahead`,
    `call_duration`) and batch state; writes nothing of the owner's.
    """

    def __init__(self, owner: AreaRankedPolicy) -> None:
        self.owner = owner
        # Per request: its queue entry's terms and the strategy for its upcoming call, as last
        # chosen.
        self.table = KeyTable()
        # Promoted requests and their order. The starvation guard promotes only in the owner's
        # `observe`, and a promotion lasts until the request finishes (`forget`); asking the
        # guard about every queued request cost more than the keys.
        self.promoted: dict[str, int] = {}

    def strategy(self, r: RequestView) -> Handling:
        """The handling `r`'s next call was last ranked with (chosen now if never)."""
        table = self.table
        row = table.row_of(r.request_id)
        i = int(table.strategy[row])
        if i >= 0:
            return BY_NAME[i]
        o = self.owner
        s = choose_strategy(
            o.profile,
            r.context_tokens + o.tokens_ahead(r),
            o.call_duration(r),
            o.running_context,
            o.running_tokens,
        )
        table.strategy[row] = _INDEX[s]
        return s

    def keys(self, reqs: Sequence[RequestView]) -> list[tuple[float, ...]]:
        """The keys of `reqs` from the batch last observed: the strategy chosen again and the
        area priced."""
        if len(reqs) < ARRAY_KEYS_FROM:
            return self._keys_one_by_one(reqs)
        return list(map(tuple, self._key_array(reqs).keys.tolist()))

    def rank_keys(
        self, reqs: Sequence[RequestView], rows: RowArray | None = None
    ) -> list[tuple[float, ...]] | KeyRows:
        """`keys`: a list for short queues, an array for long ones (`KeyTable.keys`), with each
        request's row of the table.

        Engines ask this for queued requests whose current entry was keyed when it began
        (`Policy.queue_key`; the simulator ranks every entering request so), so their terms
        are kept: unlike `keys` it does not look for new entries among them, which cost as
        much as the keys (two passes over the queue in Python). A row stays the request's
        until it finishes, so the `rows` handed back need no look-up either.
        """
        if len(reqs) < ARRAY_KEYS_FROM:
            return self._keys_one_by_one(reqs)
        idx = self.table.known_rows(reqs, rows)
        if idx is None:  # some were never ranked: look for new entries after all
            return self._key_array(reqs)
        o = self.owner
        m = o.profile.kv_bytes_per_token
        return KeyRows(self.table.keys(idx, o.running_context, o.t_tok, m), idx)

    def promote(self, rid: str, order: int) -> None:
        """The owner's starvation guard promoted `rid`: it keys first from now on."""
        self.promoted[rid] = order
        self.table.promote(rid, order)

    def resumed(self, rid: str) -> None:
        """`rid`'s call returned: its next call's strategy is chosen afresh."""
        row = self.table.row.get(rid)
        if row is not None:
            self.table.strategy[row] = -1

    def forget(self, rid: str) -> None:
        """`rid` finished."""
        self.promoted.pop(rid, None)
        self.table.forget(rid)

    def _key_array(self, reqs: Sequence[RequestView]) -> KeyRows:
        """The keys of `reqs` on arrays, new queue entries among them kept first."""
        table = self.table
        idx, new = table.rows(reqs)
        for j in new:  # new queue entries, in queue order (the starvation guard counts them)
            idx[j] = self._enter(reqs[j])
        o = self.owner
        m = o.profile.kv_bytes_per_token
        return KeyRows(table.keys(idx, o.running_context, o.t_tok, m), idx)

    def _enter(self, req: RequestView) -> int:
        """`req` is in a queue entry not seen before: count it and keep its terms."""
        self.owner.starvation.on_queued(req)
        return self.table.enter(req.request_id, self._entry(req))

    def _keys_one_by_one(self, reqs: Sequence[RequestView]) -> list[tuple[float, ...]]:
        """`KeyTable.keys` as a loop, for short queues."""
        o = self.owner
        m = o.profile.kv_bytes_per_token
        c_other, t_tok = o.running_context, o.t_tok
        table, promoted = self.table, self.promoted
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
        o = self.owner
        p = o.profile
        gen = o.tokens_ahead(req)
        duration = o.call_duration(req)
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
