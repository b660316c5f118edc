"""`KindStats` and `Predictor`: the online per-kind estimates behind lamps and interlude."""

from __future__ import annotations

import pytest

from interlude.policy.predict import KindStats, Predictor, PredictorConfig


def test_kind_stats_mean_and_sliding_window() -> None:
    s = KindStats(window=3)
    for x in (1.0, 2.0, 3.0):
        s.add(x)
    assert len(s) == 3
    assert s.mean() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    s.add(10.0)  # the oldest sample, 1, falls out
    assert len(s) == 3
    assert s.mean() == pytest.approx(5.0)  # (2 + 3 + 10) / 3


def test_kind_stats_mean_residual_exact() -> None:
    s = KindStats(window=10)
    for x in (3.0, 1.0, 10.0, 2.0):
        s.add(x)
    assert s.mean_residual(0.0) == pytest.approx(4.0)  # (1 + 2 + 3 + 10) / 4 - 0
    assert s.mean_residual(2.5) == pytest.approx(4.0)  # samples > 2.5: (3 + 10) / 2 - 2.5
    assert s.mean_residual(2.0) == pytest.approx(4.5)  # strictly greater: (3 + 10) / 2 - 2
    assert s.mean_residual(3.0) == pytest.approx(7.0)  # only 10 outlives 3 s: 10 - 3
    assert s.mean_residual(10.0) is None  # nothing outlives the longest sample
    assert s.mean_residual(11.0) is None


def test_kind_stats_residual_follows_new_and_evicted_samples() -> None:
    s = KindStats(window=2)
    s.add(5.0)
    assert s.mean_residual(0.0) == pytest.approx(5.0)
    s.add(5.0)
    s.add(7.0)  # evicts one of the two 5s, the other stays
    assert s.mean() == pytest.approx(6.0)  # (5 + 7) / 2
    assert s.mean_residual(0.0) == pytest.approx(6.0)  # cache rebuilt after the adds
    assert s.mean_residual(5.0) == pytest.approx(2.0)  # 7 - 5: the 5 does not outlive 5


def test_predictor_priors_before_any_sample() -> None:
    pr = Predictor()
    assert pr.duration("chat") == 1.0
    assert pr.segment_tokens("chat") == 100.0
    cfg = PredictorConfig(prior_duration_s=2.5, prior_segment_tokens=40.0)
    pr = Predictor(cfg)
    assert (pr.duration("x"), pr.segment_tokens("x")) == (2.5, 40.0)


def test_predictor_learns_per_kind() -> None:
    pr = Predictor()
    pr.observe_duration("chat", 20.0)
    pr.observe_duration("chat", 40.0)
    pr.observe_segment("chat", 50)
    pr.observe_segment("chat", 70)
    assert pr.duration("chat") == pytest.approx(30.0)
    assert pr.segment_tokens("chat") == pytest.approx(60.0)
    assert pr.duration("math") == 1.0  # other kinds keep the prior


def test_predictor_window_drops_old_samples() -> None:
    pr = Predictor(PredictorConfig(window=2))
    for d in (1.0, 2.0, 9.0):
        pr.observe_duration("qa", d)
    assert pr.duration("qa") == pytest.approx(5.5)  # (2 + 9) / 2; the 1 s sample is gone


def test_remaining_duration() -> None:
    pr = Predictor()
    # No samples: InferCept's estimate, the elapsed time itself.
    assert pr.remaining_duration("chat", 3.5) == 3.5
    pr.observe_duration("chat", 20.0)
    pr.observe_duration("chat", 40.0)
    assert pr.remaining_duration("chat", 0.0) == pytest.approx(30.0)  # (20 + 40) / 2
    assert pr.remaining_duration("chat", 25.0) == pytest.approx(15.0)  # only 40 left: 40 - 25
    # Outlived every sample: fall back to the elapsed time.
    assert pr.remaining_duration("chat", 40.0) == 40.0
    assert pr.remaining_duration("chat", 55.0) == 55.0


@pytest.mark.parametrize(
    "kwargs",
    [{"window": 0}, {"prior_duration_s": -1.0}, {"prior_segment_tokens": 0.0}],
)
def test_predictor_config_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"PredictorConfig"):
        PredictorConfig(**kwargs)  # type: ignore[arg-type]


def test_kinds_past_the_cap_share_one_bucket() -> None:
    from interlude.policy.predict import OTHER_KIND

    p = Predictor(PredictorConfig(max_kinds=2))
    p.observe_duration("a", 1.0)
    p.observe_duration("b", 3.0)
    for i in range(100):  # a client inventing kinds
        p.observe_duration(f"k{i}", 10.0)
    assert p.duration("a") == 1.0 and p.duration("b") == 3.0
    assert p.duration("new") == p.duration(OTHER_KIND) == 10.0
    assert set(p._durations) == {"a", "b", OTHER_KIND}
