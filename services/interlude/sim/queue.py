"""A queue kept in the policy's order: each request is ranked once, when it enters.

Ranks sort as (class, policy key, entry sequence): preempted requests first (vLLM puts them back
at the head), then everything else by the policy's `queue_key`, ties in entry order. Keeping the
queue sorted on entry makes ordering cost O(log n) per entry instead of a sort per iteration;
only a policy that re-ranks every iteration (`Traits.rescore_queued`) pays for a sort (`rekey`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from interlude.sim.request import SimRequest

PREEMPTED, RANKED = 0, 1

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
        seqs = [rank[2] for rank in self._ranks[n:]]
        # Sorted by (key, entry sequence); sequences are unique, so requests are never compared.
        ranked = sorted(zip(keys(rest), seqs, rest, strict=True))
        self._ranks[n:] = [(RANKED, k, seq) for k, seq, _ in ranked]
        self.items[n:] = [r for _, _, r in ranked]

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
