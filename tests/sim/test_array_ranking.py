"""Keys on arrays (`Policy.rank_keys`) and the queue's array form give the scalar paths' order.

The simulator re-ranks a LAMPS queue on numpy arrays once it is long; short queues take the
Python paths. These tests force each path on small inputs and compare: the queue operation by
operation, and whole runs bit for bit.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from interlude.policy import Profile, RequestView, SchedulerView
from interlude.policy import rekeyed as rekeyed_module
from interlude.policy.base import KeyRows, RowArray
from interlude.policy.ranking import AreaRankedPolicy
from interlude.sim import ranked_queue as queue_module
from interlude.sim.order import insertion_point, rows_order
from interlude.sim.ranked_queue import PREEMPTED, RankedQueue
from interlude.sim.request import SimRequest
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceRequest, generate, poisson_arrivals

SimFactory = Callable[..., Simulator]
Key = tuple[float, ...]
KEYS = (-1.0, 0.0, 0.5, 1.0, 2.5)  # few values: ties are common, the entry order decides


def _key(rng: random.Random) -> tuple[float, float]:
    return (rng.choice((-1.0, 0.0)), rng.choice(KEYS))


def test_insertion_point_is_bisect_right() -> None:
    rng = random.Random(7)
    for n in (0, 1, 9, 300):
        pairs = sorted((_key(rng), seq) for seq in range(n))
        columns = [np.array([k[j] for k, _ in pairs]) for j in range(2)]
        for _ in range(50):
            key = _key(rng)
            assert insertion_point(columns, key) == bisect.bisect_right(pairs, (key, n + 1))


def test_rows_order_is_sorted_order() -> None:
    rng = random.Random(8)
    for n in (1, 7, 400):
        keys = [_key(rng) for _ in range(n)]
        # Entry order among equal keys (stable sorts alone), or not (`np.lexsort` settles it).
        for seqs in (sorted(rng.sample(range(10 * n), n)), rng.sample(range(10 * n), n)):
            expected = [i for _, _, i in sorted(zip(keys, seqs, range(n), strict=True))]
            assert rows_order(np.array(keys), seqs) == expected
    assert rows_order(np.array([(0.0, float("nan")), (0.0, 1.0)]), [1, 2]) is None


@pytest.mark.parametrize("sort_from", [1, 48])
def test_queue_in_array_form_keeps_the_list_forms_order(
    sort_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two queues see the same pushes, admissions, removals and re-ranks; one is re-ranked by
    keys on an array, the other by the same keys as tuples. Their order never differs."""
    monkeypatch.setattr(queue_module, "ARRAY_SORT_FROM", sort_from)
    rng = random.Random(sort_from)
    arrays, tuples = RankedQueue(), RankedQueue()
    made = 0
    handed: list[int] = []
    for step in range(600):
        op = rng.random()
        if op < 0.45 or len(arrays) < 2:
            made += 1
            r = SimRequest(f"r{made}", TraceRequest("t", "k", 10, (Segment(5, None),)), 0.0)
            key = _key(rng) if rng.random() < 0.95 else (0.0,)  # a key of another length
            cls = PREEMPTED if rng.random() < 0.05 else queue_module.RANKED
            arrays.push(r, key, cls)
            tuples.push(r, key, cls)
        elif op < 0.6:
            n = rng.randrange(0, 4)
            arrays.pop_front(n)
            tuples.pop_front(n)
        elif op < 0.7:
            r = rng.choice(arrays.items)
            arrays.remove(r)
            tuples.remove(r)
        else:
            fresh = {r.request_id: _key(rng) for r in arrays.items}

            def on_array(
                rs: list[SimRequest], rows: RowArray | None = None, f: dict[str, Key] = fresh
            ) -> KeyRows:
                if rows is not None:  # handed back: the rows given for these requests, or -1
                    assert len(rows) == len(rs)
                    for r, row in zip(rs, rows.tolist(), strict=True):
                        assert row in (-1, int(r.request_id[1:])), (r.request_id, row)
                    handed.append(int((rows >= 0).sum()))
                ids = np.array([int(r.request_id[1:]) for r in rs], dtype=np.intp)
                return KeyRows(np.array([f[r.request_id] for r in rs]), ids)

            arrays.rekey(on_array)
            tuples.rekey(lambda rs, f=fresh: [f[r.request_id] for r in rs])
        assert arrays.items == tuples.items, step
        assert arrays.ranked_start() == tuples.ranked_start()
    assert made > 200
    assert sum(handed) > 100 or sort_from > 1  # rows came back from the queue


def _force(monkeypatch: pytest.MonkeyPatch, arrays: bool) -> None:
    """Arrays for every queue (keys and sort), or for none."""
    monkeypatch.setattr(rekeyed_module, "ARRAY_KEYS_FROM", 0 if arrays else 10**9)
    monkeypatch.setattr(queue_module, "ARRAY_SORT_FROM", 1 if arrays else 10**9)


@pytest.mark.parametrize("name", ["lamps", "lamps-predicted", "interlude.policy.variants:Rekeyed"])
def test_area_ranking_runs_the_same_on_arrays_and_one_by_one(
    name: str,
    pressure_arrivals: list[Arrival],
    make_simulator: SimFactory,
    make_profile: Callable[..., Profile],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whole runs with every key and sort on arrays equal runs with none, bit for bit; and
    `rank_keys` is only ever asked about queue entries the policy has ranked (its
    precondition)."""
    p = make_profile(gpu_kv_bytes=600 * 16_000, cpu_kv_bytes=300 * 16_000)
    generated = poisson_arrivals(generate("mixed", 40, seed=2), 3.0, 10.0, seed=3)
    asked = [0]

    def run(arrivals: list[Arrival], profile: Profile | None) -> tuple[object, list[str]]:
        sim = make_simulator(name, arrivals, profile=profile, horizon_s=30.0)
        policy = sim.policy
        assert isinstance(policy, AreaRankedPolicy) and policy.rekeyed is not None
        table = policy.rekeyed.table
        rank_keys = policy.rank_keys

        def checked(
            reqs: Sequence[RequestView], now: float, rows: RowArray | None = None
        ) -> list[tuple[float, ...]] | npt.NDArray[np.float64] | KeyRows:
            if reqs and rekeyed_module.ARRAY_KEYS_FROM == 0:
                known, new = table.rows(reqs)
                assert len(reqs) == 1 or new == [], "rank_keys asked about an unranked entry"
                if rows is not None:  # the queue hands back rows it was given: still theirs
                    assert ((rows == known) | (rows == -1)).all()
                asked[0] += len(reqs)
            return rank_keys(reqs, now, rows)

        monkeypatch.setattr(policy, "rank_keys", checked)
        return sim.run(), sim.finish_log

    for arrivals, profile in ((pressure_arrivals, None), (generated, p)):
        _force(monkeypatch, arrays=True)
        on_arrays = run(arrivals, profile)
        _force(monkeypatch, arrays=False)
        one_by_one = run(arrivals, profile)
        assert on_arrays == one_by_one
    assert asked[0] > 100  # the array path really ran


@pytest.mark.parametrize("name", ["interlude", "infercept", "lamps", "continuum"])
def test_the_views_kv_shortcuts_change_no_decision(
    name: str,
    pressure_arrivals: list[Arrival],
    make_simulator: SimFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator hands policies its list of paused KV holders and says no waiting request
    holds KV (`SchedulerView.paused_with_kv`, `waiting_holds_kv`; the integrity check verifies
    both every step). A run with them equals a run where policies work them out, bit for bit."""
    seen = {"shorter": 0}
    view_of = Simulator._view

    def with_shortcuts(sim: Simulator) -> SchedulerView:
        view = view_of(sim)
        assert view.paused_with_kv is not None and view.waiting_holds_kv is False
        seen["shorter"] += len(view.paused_with_kv) < len(view.paused)
        return view

    def without(sim: Simulator) -> SchedulerView:
        return replace(view_of(sim), paused_with_kv=None, waiting_holds_kv=None)

    runs = []
    for view in (with_shortcuts, without):
        monkeypatch.setattr(Simulator, "_view", view)
        sim = make_simulator(name, pressure_arrivals, horizon_s=60.0)
        runs.append((sim.run(), sim.finish_log))
    assert runs[0] == runs[1]
    assert seen["shorter"] > 0  # some paused requests held no KV: the shortcut filtered
