"""LAMPS's queue keys for a whole queue at once.

Engines ask LAMPS for the key of every queued request at every iteration that admits from the
queue (`Traits.rescore_queued`), and an overloaded queue holds hundreds of requests: a Python
loop over them was most of a loaded run's time. What a key needs from a request is fixed for its
queue entry (`Entry`), only the batch state changes, so the per-entry terms are kept as rows of
an array and a whole queue is keyed with a few array operations.

The array operations are the scalar ones, in the same order, on the same float64 numbers
(numpy applies each operation elementwise, rounding as Python does), so a key is the same
number whichever way it is computed; `RekeyedKeys.keys` keys short queues one by one,
where the array set-up would cost more than it saves, and a test checks both agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from interlude.policy.types import RequestView

_ID = attrgetter("request_id")
_TIME = attrgetter("queue_time")
_ITERATION = attrgetter("queue_iteration")

# The terms kept per request (the rows of `KeyTable.terms`): `Entry`'s terms in its order, then
# the promotion order and the entry's stamp (queue time and iteration; NaN: no entry).
C, PRESERVE, OWN, PER_OTHER, SWAP_RATE, DECODE, AREA = range(7)  # AREA: 3 columns
PROMOTED, TIME, ITERATION = 9, 10, 11
_COLUMNS = 12


@dataclass(frozen=True, slots=True)
class Entry:
    """What ranking a queued request needs, worked out once per queue entry: the request does
    not change while it waits (its lengths, true or predicted, are fixed for the segment, as
    the authors' code fixes them when a segment's request is created), only the batch does.
    The terms are those of `choose_strategy` and `memory_time_area`, in the same order of
    operations, so a key is the same number whichever way it is computed."""

    stamp: tuple[float, int]  # (queue time, queue iteration) of the entry
    c: int  # context at the call
    preserve: float  # waste.preserve
    own: float  # chunked discard: T_fwd(c) * c / 2, plus a * c per token of C_other
    per_other: float
    swap_rate: float  # sync swap: 2 * T_swap(c), times (C_other + c)
    decode: float  # memory-time of decoding up to the call, per second of iteration time
    area: tuple[float, float, float]  # memory-time during the call: discard, preserve, swap


class KeyTable:
    """One row per known request: its current entry's terms, its promotion order (0 when not
    promoted) and its strategy as last chosen (-1: none). The terms are stored a column per
    array row (`terms[column, row]`): keying a queue gathers its rows of each column, which
    then sit contiguous in memory for the arithmetic (about twice as fast as row-major)."""

    def __init__(self, rows: int = 64) -> None:
        self.terms = self._blank(rows)
        self.strategy = np.full(rows, -1, dtype=np.int8)
        self.row: dict[str, int] = {}
        self.entry: dict[str, Entry] = {}  # the same terms as Python floats (short queues)
        self._free = list(range(rows - 1, -1, -1))

    @staticmethod
    def _blank(rows: int) -> npt.NDArray[np.float64]:
        terms = np.zeros((_COLUMNS, rows))
        terms[TIME] = np.nan
        return terms

    def row_of(self, request_id: str) -> int:
        row = self.row.get(request_id)
        if row is None:
            if not self._free:
                self._grow()
            row = self.row[request_id] = self._free.pop()
        return row

    def _grow(self) -> None:
        n = len(self.strategy)
        self.terms = np.concatenate([self.terms, self._blank(n)], axis=1)
        self.strategy = np.concatenate([self.strategy, np.full(n, -1, dtype=np.int8)])
        self._free.extend(range(2 * n - 1, n - 1, -1))

    def known_rows(
        self, reqs: Sequence[RequestView], rows: npt.NDArray[np.intp] | None = None
    ) -> npt.NDArray[np.intp] | None:
        """Each request's row, or None when some have none: `rows` where given (rows this
        table gave, -1 where not), the others looked up (all of them in one pass, in C)."""
        if rows is not None:
            missing = np.flatnonzero(rows < 0).tolist()
            if not missing:
                return rows
            if len(missing) < len(rows):
                filled = rows.copy()
                for j in missing:
                    row = self.row.get(reqs[j].request_id)
                    if row is None:
                        return None
                    filled[j] = row
                return filled
        try:
            looked_up = map(self.row.__getitem__, map(_ID, reqs))
            return np.fromiter(looked_up, dtype=np.intp, count=len(reqs))
        except KeyError:
            return None

    def rows(self, reqs: Sequence[RequestView]) -> tuple[npt.NDArray[np.intp], list[int]]:
        """Each request's row, and the positions of those whose current queue entry is not
        kept yet (their rows are -1 or hold an older entry)."""
        n = len(reqs)
        idx = self.known_rows(reqs)
        if idx is None:
            found = map(self.row.get, map(_ID, reqs), repeat(-1))
            idx = np.fromiter(found, dtype=np.intp, count=n)
        # Rows -1 (none yet) read the last row here: `idx >= 0` below rules them out.
        stamps = self.terms[TIME : ITERATION + 1, idx]
        # An iteration is an integer, exact in float64 (below 2**53) as the time is.
        times = np.fromiter(map(_TIME, reqs), dtype=np.float64, count=n)
        iterations = np.fromiter(map(_ITERATION, reqs), dtype=np.float64, count=n)
        same = (stamps[0] == times) & (stamps[1] == iterations) & (idx >= 0)
        new: list[int] = np.flatnonzero(~same).tolist()
        return idx, new

    def enter(self, request_id: str, e: Entry) -> int:
        """Keep `e` as the terms of the request's current queue entry; return its row."""
        row = self.row_of(request_id)
        self.entry[request_id] = e
        t = self.terms
        t[:PROMOTED, row] = (e.c, e.preserve, e.own, e.per_other, e.swap_rate, e.decode, *e.area)
        t[TIME, row], t[ITERATION, row] = e.stamp
        return row

    def promote(self, request_id: str, order: int) -> None:
        row = self.row_of(request_id)  # first: a new row may grow (replace) `terms`
        self.terms[PROMOTED, row] = order

    def forget(self, request_id: str) -> None:
        row = self.row.pop(request_id, None)
        if row is None:
            return
        self.entry.pop(request_id, None)
        self.terms[:, row] = self._blank(1)[:, 0]
        self.strategy[row] = -1
        self._free.append(row)

    def keys(
        self, idx: npt.NDArray[np.intp], c_other: int, t_tok: float, m: int
    ) -> npt.NDArray[np.float64]:
        """The keys of the entries in rows `idx` (`RekeyedKeys.keys`'s loop, on arrays),
        one row each: (0.0, area), or (-1.0, promotion order) for a promoted entry. Records
        each unpromoted entry's strategy."""
        t = self.terms.take(idx, axis=1)
        discard = (t[OWN] + t[PER_OTHER] * c_other) * m
        # C_other + c is a sum of integers, exact in float64 as in Python.
        swap = t[SWAP_RATE] * (c_other + t[C]) * m
        preserve = t[PRESERVE]
        # choose_strategy's argmin, ties broken by name: discard < preserve < swap.
        first = (discard <= preserve) & (discard <= swap)
        second = ~first & (preserve <= swap)
        choice = np.where(first, 0, np.where(second, 1, 2))
        area = np.where(first, t[AREA], np.where(second, t[AREA + 1], t[AREA + 2]))
        keys = np.zeros((len(idx), 2))
        keys[:, 1] = t[DECODE] * t_tok + area
        promoted = t[PROMOTED]
        waiting = promoted == 0
        if waiting.all():
            self.strategy[idx] = choice
            return keys
        self.strategy[idx[waiting]] = choice[waiting]
        keys[~waiting, 0] = -1.0
        keys[~waiting, 1] = promoted[~waiting]
        return keys
