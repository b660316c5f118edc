"""A queue kept in the policy's order: each request is ranked once, when it enters.

Ranks sort as (class, policy key, entry sequence): preempted requests first (vLLM puts them back
at the head), then everything else by the policy's `queue_key`, ties in entry order. Keeping the
queue sorted on entry makes ordering cost O(log n) per entry instead of a sort per iteration;
only a policy that re-ranks every iteration (`Traits.rescore_queued`) pays for a sort (`rekey`).

The preempted head is a count (its requests are in entry order: a later one never ranks ahead),
and the ranked part keeps its (key, sequence) pairs in one of two forms: a list of pairs, or,
once a policy has re-ranked it by keys on an array (LAMPS, `Policy.rank_keys`), arrays. A long
queue re-ranked at most iterations then never turns keys into Python tuples and back: its rows
are sorted, sliced and inserted into by numpy, in the order the list form would have.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from interlude.policy.base import KeyRows, RowArray
from interlude.sim.order import (
    ARRAY_SORT_FROM,
    KeyArray,
    array_order,
    insertion_point,
    sort_rows,
)
from interlude.sim.request import SimRequest

PREEMPTED, RANKED = 0, 1
_SEQ = itemgetter(1)  # a ranked pair's entry sequence

# The keys of a whole queue: tuples, or the same floats as the rows of one array, maybe with
# the policy's rows (`Policy.rank_keys`); a queue that keeps rows passes them as a second
# argument, aligned with the requests.
Keys = Callable[..., Sequence[tuple[float, ...]] | KeyArray | KeyRows]
_NO_ROW = np.full(1, -1, dtype=np.intp)


class RankedQueue:
    def __init__(self) -> None:
        self.items: list[SimRequest] = []
        self._head = 0  # preempted requests at the front
        # The ranked part's (key, entry sequence) in queue order, as a list of pairs, or (when
        # `_columns` is not None) as one array per key column and one of sequences.
        self._ranks: list[tuple[tuple[float, ...], int]] = []
        self._columns: list[npt.NDArray[np.float64]] | None = None
        self._seqs: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        # The policy's rows of the ranked requests in array form (`KeyRows`; -1: none yet).
        self._rows: RowArray = np.zeros(0, dtype=np.intp)
        self._seq = 0
        self._later: Keys | None = None  # see `rekey_later`

    def push(self, r: SimRequest, key: tuple[float, ...], cls: int = RANKED) -> None:
        self._seq += 1
        if cls == PREEMPTED:  # behind the preempted ones already there (entry order)
            self.items.insert(self._head, r)
            self._head += 1
            return
        columns = self._columns
        if columns is not None and self._fits(key, columns):
            i = insertion_point(columns, key)
            # (np.insert does the same with more set-up than the copy itself.)
            self._columns = [
                np.concatenate((c[:i], (x,), c[i:])) for c, x in zip(columns, key, strict=True)
            ]
            self._seqs = np.concatenate((self._seqs[:i], (self._seq,), self._seqs[i:]))
            self._rows = np.concatenate((self._rows[:i], _NO_ROW, self._rows[i:]))
        else:
            self._to_list()
            pair = (key, self._seq)
            i = bisect.bisect_right(self._ranks, pair)
            self._ranks.insert(i, pair)
        self.items.insert(self._head + i, r)

    @staticmethod
    def _fits(key: tuple[float, ...], columns: list[npt.NDArray[np.float64]]) -> bool:
        """Whether `key` compares with the array rows as its tuple does with theirs: floats
        (an int beyond 2**53 would compare differently once converted), none NaN, as many."""
        return (
            len(key) == len(columns)
            and all(type(x) is float for x in key)
            and all(x == x for x in key)  # NaN is the one float not equal to itself
        )

    def _to_list(self) -> None:
        """Keep the ranked part's pairs as a list from now on."""
        if self._columns is not None:
            keys = zip(*(c.tolist() for c in self._columns), strict=True)
            self._ranks = list(zip(keys, self._seqs.tolist(), strict=True))
            self._columns = None

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
        return self._head

    def rekey(self, keys: Keys) -> None:
        """Rank the ranked requests again by `keys` (all of them in one call); preempted ones
        keep the head, and equal keys keep their entry order."""
        n = self._head
        rest = self.items[n:]
        if not rest:
            return
        answer = keys(rest) if self._columns is None else keys(rest, self._rows)
        ks, rows = (answer.keys, answer.rows) if isinstance(answer, KeyRows) else (answer, None)
        if isinstance(ks, np.ndarray):
            seqs = self._seqs if self._columns is not None else list(map(_SEQ, self._ranks))
            ranked = sort_rows(ks, seqs) if len(rest) >= ARRAY_SORT_FROM else None
            if ranked is not None:
                # A policy re-ranks (LAMPS) at most iterations over a long queue: the rows
                # stay arrays, and only the requests are put in order in Python (in C).
                order, self._columns = ranked
                self._seqs = np.asarray(seqs, dtype=np.int64)[order]
                self._rows = np.full(len(rest), -1, np.intp) if rows is None else rows[order]
                self._ranks = []
                positions: list[int] = order.tolist()
                # itemgetter picks many items quicker than a map; with one it returns the item.
                self.items[n:] = itemgetter(*positions)(rest) if n < len(self.items) - 1 else rest
                return
            ks = list(map(tuple, ks.tolist()))
        self._to_list()
        seqs = list(map(_SEQ, self._ranks))
        order_list = array_order(ks, seqs) if len(rest) >= ARRAY_SORT_FROM else None
        if order_list is None:
            # Sorted by (key, entry sequence); sequences are unique, so requests are never
            # compared.
            in_order = sorted(zip(ks, seqs, rest, strict=True))
            new_keys, new_seqs, new_items = zip(*in_order, strict=True)
            self._ranks = list(zip(new_keys, new_seqs, strict=True))
            self.items[n:] = new_items
            return
        pairs = zip(map(ks.__getitem__, order_list), map(seqs.__getitem__, order_list), strict=True)
        self._ranks = list(pairs)
        self.items[n:] = map(rest.__getitem__, order_list)

    def pop_front(self, n: int) -> None:
        del self.items[:n]
        head = min(n, self._head)
        self._head -= head
        self._drop_ranked(slice(0, n - head))

    def remove(self, r: SimRequest) -> None:
        i = self.items.index(r)
        del self.items[i]
        if i < self._head:
            self._head -= 1
        else:
            self._drop_ranked(slice(i - self._head, i - self._head + 1))

    def _drop_ranked(self, where: slice) -> None:
        start, stop = where.start, where.stop
        if stop == start:
            return
        if self._columns is None:
            del self._ranks[where]
        elif start == 0:  # admissions take the head: views, nothing copied
            self._columns = [c[stop:] for c in self._columns]
            self._seqs = self._seqs[stop:]
            self._rows = self._rows[stop:]
        else:
            self._columns = [np.concatenate((c[:start], c[stop:])) for c in self._columns]
            self._seqs = np.concatenate((self._seqs[:start], self._seqs[stop:]))
            self._rows = np.concatenate((self._rows[:start], self._rows[stop:]))

    def __iter__(self) -> Iterator[SimRequest]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)
