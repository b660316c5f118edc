"""Reproducibility: the same seed gives the same run, to the last bit."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable

import pytest

from interlude.policy import POLICIES, Decision, Handling, Profile, SchedulerView
from interlude.policy.infercept import InferCeptPolicy
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.predict import PAST, KindStats
from interlude.sim.metrics import RunMetrics
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, generate, poisson_arrivals

POOL = generate("mixed", 60, seed=11)


@pytest.fixture
def profile(make_profile: Callable[..., Profile]) -> Profile:
    # 600 blocks = 9,600 tokens: the generated contexts (<= 8,192) fit, a few at once do not.
    return make_profile(gpu_kv_bytes=600 * 16_000, cpu_kv_bytes=300 * 16_000, saturation_tokens=384)


def arrivals(seed: int) -> list[Arrival]:
    return poisson_arrivals(POOL, rate=2.0, duration_s=15.0, seed=seed)


def run(
    make_simulator: Callable[..., Simulator], name: str, profile: Profile, seed: int
) -> RunMetrics:
    return make_simulator(name, arrivals(seed), profile=profile, horizon_s=40.0).run()


@pytest.mark.parametrize("name", list(POLICIES))
def test_same_seed_same_metrics(
    name: str, profile: Profile, make_simulator: Callable[..., Simulator]
) -> None:
    first = run(make_simulator, name, profile, seed=5)
    second = run(make_simulator, name, profile, seed=5)
    assert first == second  # dataclass equality: every field, floats bit for bit
    assert first.arrived > 10 and first.finished > 0


@pytest.mark.parametrize("name", list(POLICIES))
def test_different_seed_different_run(
    name: str, profile: Profile, make_simulator: Callable[..., Simulator]
) -> None:
    assert arrivals(5) != arrivals(6)
    assert run(make_simulator, name, profile, seed=5) != run(make_simulator, name, profile, 6)


def cached_and_equations(
    make: Callable[[], InferCeptPolicy | InterludePolicy],
    profile: Profile,
    make_simulator: Callable[..., Simulator],
    record_decisions: Callable[..., list[tuple[SchedulerView, Decision]]],
) -> list[Decision]:
    """Run a fresh policy from `make` with its cached waste terms and without; assert the two
    runs and every decision are equal; return the decisions."""
    runs = []
    for cached in (True, False):
        policy = make()
        policy.cache_terms = cached
        sim = make_simulator(policy, arrivals(5), profile=profile, horizon_s=40.0)
        log = record_decisions(sim)
        runs.append((sim.run(), [d for _, d in log]))
    assert runs[0] == runs[1]
    return runs[0][1]


@pytest.mark.parametrize("estimator", InferCeptPolicy.ESTIMATORS)
def test_infercept_cached_terms_decide_as_the_equations(
    estimator: str,
    profile: Profile,
    make_simulator: Callable[..., Simulator],
    record_decisions: Callable[..., list[tuple[SchedulerView, Decision]]],
) -> None:
    """InferCept's per-pause cache of the discard terms gives every decision, bit for bit, that
    the waste equations give (`cache_terms = False` scores straight from them)."""
    decisions = cached_and_equations(
        lambda: InferCeptPolicy(profile, estimator=estimator),
        profile,
        make_simulator,
        record_decisions,
    )
    assert any(d.kv for d in decisions)  # it discarded or swapped: the scores mattered
    if estimator == "elapsed":
        assert any(d.review_at is not None for d in decisions)


def _exceeds_at_by_scan(ks: KindStats, elapsed: float, threshold: float, scan: int) -> float | None:
    """`KindStats.residual_exceeds_at` as it was written first: a scan of the sample points
    with the residual worked out at each one (no cache)."""
    values = sorted(ks._recent)
    suffix = [0.0] * (len(values) + 1)
    for j in range(len(values) - 1, -1, -1):
        suffix[j] = suffix[j + 1] + values[j]
    i = bisect.bisect_right(values, elapsed)
    for j in range(i, min(len(values), i + scan)):
        t = values[j]
        k = bisect.bisect_right(values, t)
        if k == len(values):
            return max(t, threshold) + PAST
        if suffix[k] / (len(values) - k) - t > threshold:
            return t + PAST
    if i + scan < len(values):
        return values[i + scan - 1] + PAST
    return threshold + PAST if threshold > elapsed else None


def test_residual_scans_kept_between_adds_answer_as_a_fresh_scan() -> None:
    """The predictor keeps each scan until the next sample arrives; every answer must be the
    one a scan from scratch gives (ties, repeated samples and a full window included)."""
    rng = random.Random(7)
    asked = 0
    for window in (1, 3, 40):
        ks = KindStats(window)
        for _ in range(120):
            ks.add(rng.choice([rng.expovariate(0.2), round(rng.uniform(0, 5), 1), 2.0]))
            for _ in range(4):
                elapsed = rng.choice([rng.uniform(0, 20), 2.0, 0.0])
                threshold = rng.choice([rng.uniform(0, 15), 0.0])
                scan = rng.choice([32, 4])
                want = _exceeds_at_by_scan(ks, elapsed, threshold, scan)
                assert ks.residual_exceeds_at(elapsed, threshold, scan) == want
                asked += want is not None
    assert asked > 500


def test_interlude_cached_terms_decide_as_the_equations(
    profile: Profile,
    make_simulator: Callable[..., Simulator],
    record_decisions: Callable[..., list[tuple[SchedulerView, Decision]]],
) -> None:
    """interlude's per-request cache of the swap and discard terms gives every decision, bit
    for bit, that the waste equations give (`cache_terms = False`)."""
    decisions = cached_and_equations(
        lambda: InterludePolicy(profile), profile, make_simulator, record_decisions
    )
    assert any(a.handling is Handling.SWAP for d in decisions for a in d.kv)
    assert any(a.handling is Handling.DISCARD for d in decisions for a in d.kv)
    assert any(d.review_at is not None for d in decisions)
