"""A queue kept in the policy's order: each request is ranked once, when it enters.

Ranks sort as (class, policy key, entry sequence): preempted requests first (vLLM puts them back
at the head), then everything else by the policy's `queue_key`, ties in entry order. Keeping the
queue sorted on entry makes ordering cost O(log n) per entry instead of a sort per iteration;
only a policy that re-ranks every iteration (`Traits.rescore_queued`) pays for a sort (`rekey`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import itemgetter

from interlude.sim.order import ARRAY_SORT_FROM, array_order
from interlude.sim.request import SimRequest

PREEMPTED, RANKED = 0, 1
_SEQ = itemgetter(2)  # a rank's entry sequence

Keys = Callable[[list[SimRequest]], list[tuple[float, ...]]]


class RankedQueue:
    def __init__(self) -> None:
        self.items: list[SimRequest] = []
        self._ranks: list[tuple[int, tuple[float, ...], int]] = []
        self._seq = 0
        self._later: Keys | None = None  # see `rekey_later`

    def push(self, r: SimRequest, key: tuple[float, ...], cls: int = RANKED) -> None:
        self._seq += 1
        rank = (cls, key, self._seq)
        i = bisect.bisect_right(self._ranks, rank)
        self._ranks.insert(i, rank)
        self.items.insert(i, r)

    def rekey_later(self, keys: Keys) -> None:
        """`rekey` with `keys` when the ranked part's order is next needed (`settle`), not now.

        For a queue whose order is only read at admission: a re-rank costs a key per queued
        request, and most iterations of an overloaded run admit nothing from the ranked part
        (memory is full, or the batch is). Until then the ranked part keeps the last order.
        """
        # Requests ranked after this (entering ones) get this iteration's keys anyway.
        self._later = keys if self.ranked_start() < len(self.items) else None

    @property
    def stale(self) -> bool:
        return self._later is not None

    def settle(self) -> None:
        """Carry out a re-rank left for later, if any."""
        if self._later is not None:
            keys, self._later = self._later, None
            self.rekey(keys)

    def ranked_start(self) -> int:
        """Index of the first ranked request (the preempted ones are ahead of it)."""
        return bisect.bisect_left(self._ranks, (RANKED,))

    def rekey(self, keys: Keys) -> None:
        """Rank the ranked requests again by `keys` (all of them in one call); preempted ones
        keep the head, and equal keys keep their entry order."""
        n = bisect.bisect_left(self._ranks, (RANKED,))  # the preempted head
        rest = self.items[n:]
        if not rest:
            return
        # A policy that re-ranks (LAMPS) has this run at most iterations over a long queue:
        # the loops below are zips and maps, which run in C, and long queues sort in numpy.
        seqs = list(map(_SEQ, self._ranks[n:]))
        ks = keys(rest)
        order = array_order(ks, seqs) if len(rest) >= ARRAY_SORT_FROM else None
        if order is None:
            # Sorted by (key, entry sequence); sequences are unique, so requests are never
            # compared.
            ranked = sorted(zip(ks, seqs, rest, strict=True))
            new_keys, new_seqs, new_items = zip(*ranked, strict=True)
            self._ranks[n:] = zip(repeat(RANKED), new_keys, new_seqs)
            self.items[n:] = new_items
            return
        self._ranks[n:] = zip(
            repeat(RANKED), map(ks.__getitem__, order), map(seqs.__getitem__, order)
        )
        self.items[n:] = map(rest.__getitem__, order)

    def pop_front(self, n: int) -> None:
        del self.items[:n]
        del self._ranks[:n]

    def remove(self, r: SimRequest) -> None:
        i = self.items.index(r)
        del self.items[i]
        del self._ranks[i]

    def __iter__(self) -> Iterator[SimRequest]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)
