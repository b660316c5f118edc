"""Sorting a long queue by (key, entry sequence) in numpy.

A policy that re-ranks its queue (LAMPS) has the simulator sort hundreds to thousands of
requests at most iterations of an overloaded run; Python's sort compares the (key, sequence)
tuples one pair at a time in the interpreter, and that was most of such a run's time. numpy
orders the same float64 numbers the same way (`<` on floats; NaN, which tuples do not order
consistently, is left to Python), so the order is the one `sorted` gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# Queues shorter than this are sorted by Python: numpy's set-up costs more than it saves.
ARRAY_SORT_FROM = 48


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
        a = np.array(column, dtype=np.float64)
        if np.isnan(a).any():
            return None
        arrays.append(a)
    # lexsort's last key is the primary one.
    order = np.lexsort((np.array(seqs, dtype=np.int64), *reversed(arrays)))
    result: list[int] = order.tolist()
    return result
