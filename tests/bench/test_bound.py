"""The rate bound: a request pool's work and memory against a profile, nothing wasted."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.bench.bound import (
    calls_rate_bound,
    demand,
    host_rate_bound,
    kept_token_seconds,
    kv_capacity_tokens,
    min_iteration_s,
    min_kv_tokens,
    min_kv_tokens_with_calls,
    own_pool,
    pauses,
    rate_bound,
)
from interlude.policy import Profile
from interlude_workloads import Segment, TraceCall, TraceRequest

ONE = TraceRequest("a", "k", 100, (Segment(10, TraceCall("t", 1.0, 5)), Segment(20, None)))


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


LONG = TraceRequest(
    "b",
    "k",
    300,
    (Segment(10, TraceCall("t", 30.0, 5)), Segment(10, TraceCall("t", 2.0, 5)), Segment(10, None)),
)


def test_the_calls_move_longest_first_and_by_the_token() -> None:
    calls = pauses([ONE, LONG])
    # Contexts at the pause (per request of a pool of two), longest call first.
    assert calls.durations == (30.0, 2.0, 1.0)
    assert calls.contexts == (310 / 2, 325 / 2, 110 / 2)
    all_kept = 155 * 30 + 162.5 * 2 + 55 * 1
    assert kept_token_seconds(calls, 0) == all_kept
    assert kept_token_seconds(calls, 100) == all_kept - 100 * 30  # part of the longest call
    assert kept_token_seconds(calls, 155 + 62.5) == 100 * 2 + 55
    assert kept_token_seconds(calls, 1e9) == 0


def test_calls_cost_nothing_with_a_link_that_carries_everything(
    make_profile: Callable[..., Profile],
) -> None:
    fast = make_profile(swap_bandwidth_bps=1e15)
    assert calls_rate_bound(fast, [ONE, LONG]) == pytest.approx(rate_bound(fast, [ONE, LONG]))


def test_a_slow_link_lowers_the_bound_and_recompute_is_priced_at_its_best_amount(
    make_profile: Callable[..., Profile],
) -> None:
    pool = [ONE, LONG]
    slow, faster = make_profile(swap_bandwidth_bps=1e3), make_profile(swap_bandwidth_bps=1e5)
    bound = calls_rate_bound(slow, pool)
    assert bound < calls_rate_bound(faster, pool) < rate_bound(slow, pool)
    d, calls = demand(pool), pauses(pool)
    rate = 0.8 * bound
    least = min_kv_tokens_with_calls(slow, d, calls, rate)
    assert least <= kv_capacity_tokens(slow)
    # No recompute amount on a fine grid does better than the search found.
    a = slow.fwd_a_ms / 1000
    link = slow.swap_bandwidth_bps / slow.kv_bytes_per_token / rate / 2
    spare = 1 - a * rate * d.tokens
    top = min(sum(calls.contexts), spare / (a * rate))
    for i in range(400):
        r = top * i / 400
        iteration = slow.fwd_c_ms / 1000 / (spare - a * rate * r)
        need = rate * (d.decode_token_iterations * iteration + kept_token_seconds(calls, link + r))
        assert need >= least * (1 - 1e-9)
    # Keeping every call's KV through it is one choice among many: the least need is lower.
    kept_all = min_kv_tokens(slow, d, rate) + rate * kept_token_seconds(calls, 0)
    assert least < kept_all


def test_a_small_host_lowers_the_bound_and_a_large_one_changes_nothing(
    make_profile: Callable[..., Profile],
) -> None:
    pool = [ONE, LONG]
    # A link fast enough to carry every paused context: unlimited host memory makes the calls
    # free, a host that holds next to nothing (a byte) leaves keeping or recomputing.
    big = make_profile(swap_bandwidth_bps=1e15, cpu_kv_bytes=10**15)
    none = make_profile(swap_bandwidth_bps=1e15, cpu_kv_bytes=1)
    small = make_profile(swap_bandwidth_bps=1e15, cpu_kv_bytes=2_000)
    assert host_rate_bound(big, pool) == pytest.approx(calls_rate_bound(big, pool))
    assert host_rate_bound(none, pool) < host_rate_bound(small, pool)
    assert host_rate_bound(small, pool) < calls_rate_bound(small, pool)
    # With no host, the link is of no use: the same as a link that carries nothing.
    dead_link = make_profile(swap_bandwidth_bps=1e-9, cpu_kv_bytes=10**15)
    assert host_rate_bound(none, pool) == pytest.approx(calls_rate_bound(dead_link, pool))
    # What the host saves is what it holds: at a rate, kept token-seconds fall by at most
    # host tokens / rate against no host at all.
    d, calls = demand(pool), pauses(pool)
    rate = 0.5 * host_rate_bound(none, pool)
    no_host = min_kv_tokens_with_calls(none, d, calls, rate, host=True)
    some = min_kv_tokens_with_calls(small, d, calls, rate, host=True)
    host_tokens = small.cpu_kv_bytes / small.kv_bytes_per_token
    assert no_host - host_tokens <= some * (1 + 1e-9) and some < no_host


def test_a_shared_head_counts_once_in_every_bound(make_profile: Callable[..., Profile]) -> None:
    """Ten requests opening with the same 512 tokens: each brings its own part only, the head
    is held once (as the simulator holds it): every bound rises, the pool's own tokens fall."""
    p = make_profile()  # 16-token blocks
    calls = (Segment(10, TraceCall("t", 5.0, 5)), Segment(20, None))
    alone = [TraceRequest(f"r{i}", "k", 600, calls) for i in range(10)]
    grouped = [TraceRequest(f"r{i}", "k", 600, calls, 512, "agent") for i in range(10)]
    own, cap = own_pool(p, grouped)
    assert {t.prompt_tokens for t in own} == {600 - 512} and cap == kv_capacity_tokens(p) - 512
    assert own_pool(p, alone) == (alone, kv_capacity_tokens(p))
    for bound in (rate_bound, calls_rate_bound, host_rate_bound):
        assert bound(p, grouped) > 1.5 * bound(p, alone)
