"""Sorting a long queue by (key, entry sequence) in numpy.

A policy that re-ranks its queue (LAMPS) has the simulator sort hundreds to thousands of
requests at most iterations of an overloaded run; Python's sort compares the (key, sequence)
tuples one pair at a time in the interpreter, and that was most of such a run's time. numpy
orders the same float64 numbers the same way (`<` on floats; NaN, which tuples do not order
consistently, is left to Python), so the order is the one `sorted` gives.

Keys come as tuples (`array_order`) or, from a policy that computes them on arrays, as one
(n, k) array (`rows_order`): the second skips turning tuples into columns, which cost about as
much as the sort itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# Queues shorter than this are sorted by Python: numpy's set-up costs more than it saves.
ARRAY_SORT_FROM = 48

KeyArray = npt.NDArray[np.float64]  # row i: the key of request i, as the tuple's floats


def array_order(keys: Sequence[tuple[float, ...]], seqs: Sequence[int]) -> list[int] | None:
    """Indices that sort `keys` as `sorted(zip(keys, seqs))` would (`seqs` unique), or None
    when the keys are not all float tuples of one length (then Python must compare them)."""
    if len(set(map(len, keys))) != 1:
        return None
    columns = list(zip(*keys, strict=True))
    if not columns:
        return None
    arrays: list[npt.NDArray[np.float64]] = []
    for column in columns:
        # Only floats: an int beyond 2**53 would compare differently once converted.
        if set(map(type, column)) != {float}:
            return None
        arrays.append(np.array(column, dtype=np.float64))
    return rows_order(np.column_stack(arrays), seqs)


def rows_order(keys: KeyArray, seqs: Sequence[int] | npt.NDArray[np.int64]) -> list[int] | None:
    """Indices that sort the rows of `keys` as `sorted(zip(map(tuple, keys.tolist()), seqs))`
    would (`seqs` unique), or None when a key holds NaN (then Python must compare them)."""
    ranked = sort_rows(keys, seqs)
    return None if ranked is None else ranked[0].tolist()


def sort_rows(
    keys: KeyArray, seqs: Sequence[int] | npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.intp], list[npt.NDArray[np.float64]]] | None:
    """`rows_order` as an array of indices, with the key columns in that order.

    A queue re-ranked at every iteration is nearly in order already, and equal keys are in
    entry order (the last sort put them so, and an entry joins behind its equals). Stable sorts
    by each column, last to first, keep the rows' order among equal keys; numpy's stable sort
    is quick on nearly sorted data (4,000 rows: about 30 us, against 480 for `np.lexsort` with
    the sequences). Runs of equal keys found out of entry order are then sorted by sequence.
    """
    if keys.ndim != 2 or keys.shape[1] == 0 or np.isnan(keys).any():
        return None
    columns = [keys[:, j] for j in range(keys.shape[1])]
    order: npt.NDArray[np.intp] = np.argsort(columns[-1], kind="stable")
    for column in reversed(columns[:-1]):
        ranked = column[order]
        if len(ranked) and (ranked != ranked[0]).any():  # a constant column changes nothing
            order = order[np.argsort(ranked, kind="stable")]
    ranked_columns = [c[order] for c in columns]
    seq = np.asarray(seqs, dtype=np.int64)[order]
    equal = ranked_columns[0][1:] == ranked_columns[0][:-1]
    for c in ranked_columns[1:]:
        equal &= c[1:] == c[:-1]
    if (equal & (seq[1:] < seq[:-1])).any():
        # Some equal keys are out of entry order (an entry ranked with this iteration's key
        # joined rows ranked with older ones): put each run of equal keys in sequence order.
        run = np.concatenate(([0], np.cumsum(~equal)))
        fix = np.argsort(run * (int(seq.max()) + 1) + seq, kind="stable")
        order = order[fix]
        ranked_columns = [c[fix] for c in ranked_columns]
    return order, ranked_columns


def insertion_point(columns: Sequence[npt.NDArray[np.float64]], key: tuple[float, ...]) -> int:
    """Where `bisect.bisect_right` would put (key, a sequence above every other) among rows
    sorted by (key, sequence), the rows' keys given as `columns`: the count of rows whose key
    is <= `key` (tuple order). Each column is sorted within the rows equal on the ones before,
    so a binary search per column narrows the rows down."""
    lo, hi = 0, len(columns[0])
    for column, x in zip(columns, key, strict=True):
        part = column[lo:hi]
        lo, hi = (
            lo + int(np.searchsorted(part, x, "left")),
            lo + int(np.searchsorted(part, x, "right")),
        )
        if lo == hi:
            break
    return hi
