"""The numpy sort of a long queue gives the order Python's sort gives."""

from __future__ import annotations

import random

from interlude.sim.order import array_order


def test_array_order_is_sorted_order() -> None:
    rng = random.Random(3)
    for n in (1, 5, 200):
        # Few distinct values, so ties between keys are common and the sequence decides.
        keys = [(rng.choice((-1.0, 0.0)), float(rng.randrange(8)) / 3) for _ in range(n)]
        seqs = rng.sample(range(10 * n), n)
        expected = [i for _, _, i in sorted(zip(keys, seqs, range(n), strict=True))]
        assert array_order(keys, seqs) == expected


def test_array_order_leaves_odd_keys_to_python() -> None:
    assert array_order([(0.0, 1.0), (1.0,)], [1, 2]) is None  # lengths differ
    assert array_order([(0.0, 1), (0.0, 2.0)], [1, 2]) is None  # not all floats
    assert array_order([(0.0, float("nan")), (0.0, 2.0)], [1, 2]) is None
