"""The rate bound: a request pool's work and memory against a profile, nothing wasted."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.bench.bound import (
    demand,
    kv_capacity_tokens,
    min_iteration_s,
    min_kv_tokens,
    rate_bound,
)
from interlude.policy import Profile
from interlude_loadgen import Segment, ToolCall, TraceRequest

ONE = TraceRequest("a", "k", 100, (Segment(10, ToolCall("t", 1.0, 5)), Segment(20, None)))


def test_demand_counts_every_token_and_the_context_each_decode_attends() -> None:
    d = demand([ONE])
    assert d.tokens == 100 + 10 + 5 + 20
    # 10 tokens from 100 of context, then 20 from 100 + 10 + 5.
    assert d.decode_token_iterations == (10 * 100 + 10 * 10 / 2) + (20 * 115 + 20 * 20 / 2)
    two = TraceRequest("b", "k", 300, (Segment(10, None),))
    assert demand([ONE, two]).tokens == (135 + 310) / 2
    with pytest.raises(ValueError, match="empty"):
        demand([])


def test_iterations_slow_down_as_tokens_fill_the_gpu(make_profile: Callable[..., Profile]) -> None:
    p = make_profile()  # 10 ms + 0.05 ms per token
    d = demand([ONE])
    assert min_iteration_s(p, d, 0.0) == pytest.approx(0.010)
    # 100 req/s x 135 tokens x 0.05 ms = 0.675 s of every second: 10 ms / 0.325.
    assert min_iteration_s(p, d, 100.0) == pytest.approx(0.010 / 0.325)
    assert min_iteration_s(p, d, 1000.0 / (0.05 * 135)) == float("inf")


def test_the_bound_is_where_the_kv_in_use_meets_the_capacity(
    make_profile: Callable[..., Profile],
) -> None:
    p = make_profile()
    pool = [ONE]
    bound = rate_bound(p, pool)
    cap = kv_capacity_tokens(p)
    assert min_kv_tokens(p, demand(pool), bound) == pytest.approx(cap, rel=1e-6)
    assert min_kv_tokens(p, demand(pool), bound * 1.01) > cap
    # Twice the KV space: a higher bound, but less than twice (iterations slow down).
    bigger = rate_bound(make_profile(gpu_kv_bytes=2 * p.gpu_kv_bytes), pool)
    assert bound < bigger < 2 * bound
