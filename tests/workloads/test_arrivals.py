"""Poisson arrival schedules and workload specs."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import Counter
from pathlib import Path

import pytest

from interlude_workloads import (
    Arrival,
    Segment,
    TraceCall,
    TraceRequest,
    generate,
    poisson_arrivals,
    resolve_workload,
)
from interlude_workloads.trace import TRACE_ENV

POOL = generate("mixed", 30, seed=0)


def test_count_close_to_rate_times_duration() -> None:
    arrivals = poisson_arrivals(POOL, rate=5.0, duration_s=2000.0, seed=1)
    # Poisson(10000): standard deviation 100, so 4 sigma is 400.
    assert abs(len(arrivals) - 10_000) < 400
    gaps = [b.time_s - a.time_s for a, b in itertools.pairwise(arrivals)]
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.05)  # exponential, mean 1/rate


def test_times_sorted_within_window_and_ids_unique() -> None:
    arrivals = poisson_arrivals(POOL, rate=2.0, duration_s=300.0, seed=3)
    times = [a.time_s for a in arrivals]
    assert times == sorted(times)
    assert times[0] > 0 and times[-1] < 300.0
    assert [a.arrival_id for a in arrivals] == [
        f"{i}:{a.request.request_id}" for i, a in enumerate(arrivals)
    ]
    assert len({a.arrival_id for a in arrivals}) == len(arrivals)


def test_sampling_is_uniform_with_replacement() -> None:
    pool = POOL[:3]
    arrivals = poisson_arrivals(pool, rate=10.0, duration_s=300.0, seed=4)
    counts = Counter(a.request.request_id for a in arrivals)
    assert len(arrivals) > len(pool)  # so some requests repeat
    assert set(counts) == {r.request_id for r in pool}
    expected = len(arrivals) / 3  # about 1000 each, binomial sd about 26
    assert all(abs(c - expected) < 150 for c in counts.values())
    assert all(a.request in pool for a in arrivals)


def test_same_seed_same_schedule() -> None:
    a = poisson_arrivals(POOL, rate=3.0, duration_s=100.0, seed=9)
    assert a == poisson_arrivals(POOL, rate=3.0, duration_s=100.0, seed=9)
    assert a != poisson_arrivals(POOL, rate=3.0, duration_s=100.0, seed=10)


@pytest.mark.parametrize(
    ("rate", "duration", "pool", "pattern"),
    [
        (0.0, 10.0, POOL, "rate"),
        (-1.0, 10.0, POOL, "rate"),
        (math.nan, 10.0, POOL, "rate"),
        (1.0, 0.0, POOL, "duration_s"),
        (1.0, -5.0, POOL, "duration_s"),
        (1.0, 10.0, [], "empty"),
    ],
)
def test_invalid_arguments(
    rate: float, duration: float, pool: list[TraceRequest], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        poisson_arrivals(pool, rate=rate, duration_s=duration, seed=0)


def test_arrival_validates_time() -> None:
    req = TraceRequest("r", "math", 1, (Segment(1, TraceCall("math", 0.0, 1)), Segment(1, None)))
    with pytest.raises(ValueError, match="time_s"):
        Arrival(-1.0, req, "0:r")
    with pytest.raises(ValueError, match="arrival_id"):
        Arrival(1.0, req, "")


def test_resolve_generated_and_path(tmp_path: Path) -> None:
    reqs = resolve_workload("generated:venv", seed=5)
    assert len(reqs) == 400 and {r.kind for r in reqs} == {"venv"}
    assert reqs == resolve_workload("generated:venv", seed=5)
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"a": [{"prompt_tokens": 3, "completion_tokens": 2}]}), "utf-8")
    (only,) = resolve_workload(str(path), seed=0)
    assert (only.request_id, only.prompt_tokens, only.num_calls) == ("a", 3, 0)


def test_resolve_errors_explain_the_forms(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown generated workload 'nope'.*generated:NAME"):
        resolve_workload("generated:nope", seed=0)
    with pytest.raises(ValueError, match=r"is not a file.*'shared'"):
        resolve_workload(str(tmp_path / "missing.json"), seed=0)


def test_resolve_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match="generated:mixed"):
        resolve_workload("shared", seed=0)
    trace = tmp_path / "present.json"
    trace.write_text(json.dumps({"s": [{"prompt": "hello", "completion": "hi"}]}), "utf-8")
    monkeypatch.setenv(TRACE_ENV, str(trace))
    (req,) = resolve_workload("shared", seed=0)
    assert (req.request_id, req.kind, req.prompt_tokens) == ("s", "chat", 2)
