"""Synthetic workloads: table statistics, the context cap, determinism and name checking."""

from __future__ import annotations

import random
import statistics
from collections import Counter

import pytest

from interlude_workloads import (
    AUGMENTATIONS,
    MAX_CONTEXT,
    PROFILES,
    AugmentationProfile,
    TraceRequest,
    generate,
)
from interlude_workloads.generate import TABLE_WORKLOADS, _augmented


def _stats(reqs: list[TraceRequest]) -> tuple[float, float, float]:
    durations = [c.duration_s for r in reqs for c in r.calls]
    contexts = [x for r in reqs for x in r.contexts_at_calls]
    return (
        statistics.fmean(durations),
        statistics.fmean(r.num_calls for r in reqs),
        statistics.fmean(contexts),
    )


@pytest.mark.parametrize("name", AUGMENTATIONS)
def test_means_match_the_design_table(name: str) -> None:
    p = PROFILES[name]
    reqs = generate(name, 2000, seed=7)
    duration, calls, context = _stats(reqs)
    assert duration == pytest.approx(p.duration_mean_s, rel=0.15)
    assert calls == pytest.approx(p.calls_mean, rel=0.15)
    assert context == pytest.approx(p.context_mean, rel=0.15)
    # The table's spreads are standard deviations (see generate's docstring); looser check.
    durations = [c.duration_s for r in reqs for c in r.calls]
    assert statistics.pstdev(durations) == pytest.approx(p.duration_std_s, rel=0.2)
    contexts = [x for r in reqs for x in r.contexts_at_calls]
    assert statistics.pstdev(contexts) == pytest.approx(p.context_std, rel=0.25)


@pytest.mark.parametrize("name", TABLE_WORKLOADS)
def test_every_request_is_valid_and_capped(name: str) -> None:
    reqs = generate(name, 500, seed=3)
    assert len(reqs) == 500
    assert len({r.request_id for r in reqs}) == 500
    assert all(r.num_calls >= 1 for r in reqs)
    assert max(r.max_context for r in reqs) <= MAX_CONTEXT
    assert all(c.duration_s >= 0 and c.return_tokens >= 0 for r in reqs for c in r.calls)


def test_calls_carry_the_request_kind() -> None:
    for r in generate("mixed", 60, seed=1):
        assert {c.tool for c in r.calls} == {r.kind}


def test_context_cap_ends_long_requests_early() -> None:
    # A profile far beyond the window: requests must end early, never exceed the cap, and
    # still keep at least one call.
    huge = AugmentationProfile("huge", 1.0, 0.5, 40, 5, 6000, 1000, 500, 1500)
    rng = random.Random(0)
    reqs = [_augmented(rng, f"h{i}", huge) for i in range(200)]
    assert all(r.max_context <= MAX_CONTEXT for r in reqs)
    assert all(1 <= r.num_calls < 20 for r in reqs)
    assert max(r.max_context for r in reqs) > MAX_CONTEXT - 2000  # filled up to near the cap


def test_mixed_has_equal_shares_in_shuffled_order() -> None:
    reqs = generate("mixed", 600, seed=5)
    assert Counter(r.kind for r in reqs) == {k: 100 for k in AUGMENTATIONS}
    assert [r.kind for r in reqs[:6]] != list(AUGMENTATIONS)  # not round-robin


def test_toolbench_uses_several_different_apis() -> None:
    reqs = generate("toolbench", 1000, seed=2)
    for r in reqs:
        tools = [c.tool for c in r.calls]
        assert 2 <= len(tools) <= 8
        assert len(set(tools)) == len(tools)  # different APIs within a request
        assert all(t.startswith("toolbench:") for t in tools)
        assert all(0.2 <= c.duration_s <= 5.0 and 30 <= c.return_tokens <= 300 for c in r.calls)
        assert 800 <= r.prompt_tokens <= 2000
    assert r.kind == "toolbench"
    durations = sorted(c.duration_s for r in reqs for c in r.calls)
    assert 0.8 < durations[len(durations) // 2] < 1.25  # lognormal median about 1 s


def test_same_seed_same_workload_other_seed_differs() -> None:
    assert generate("mixed", 200, seed=42) == generate("mixed", 200, seed=42)
    assert generate("mixed", 200, seed=42) != generate("mixed", 200, seed=43)
    assert generate("toolbench", 50, seed=1) == generate("toolbench", 50, seed=1)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown workload 'bogus'.*math.*mixed.*toolbench"):
        generate("bogus", 10, seed=0)


def test_bad_count_rejected_and_zero_allowed() -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        generate("math", -1, seed=0)
    assert generate("math", 0, seed=0) == []


def test_profile_rejects_non_positive_numbers() -> None:
    with pytest.raises(ValueError, match="'broken': every number must be positive"):
        AugmentationProfile("broken", 1.0, 0.0, 1, 1, 1, 1, 1, 1)
