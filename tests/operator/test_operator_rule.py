"""The scaling rule on its own (pure): recommendations, windows, bounds, no flapping."""

from __future__ import annotations

import math

import pytest

from interlude_operator.decide import (
    Decision,
    History,
    Observation,
    Recommendation,
    decide,
    recommend,
    recommend_by_role,
)
from interlude_operator.spec import Scaling, Targets

TARGETS = Targets(kv_usage=0.8, contended_waste=0.1, queue_depth=4)


def scaling(**kw: float) -> Scaling:
    args = {"min_replicas": 1, "max_replicas": 6, "up_window_s": 30.0, "down_window_s": 300.0}
    return Scaling(**{**args, **kw})  # type: ignore[arg-type]


def run(
    observations: list[tuple[float, Observation]], current: int, s: Scaling
) -> list[tuple[float, Decision, int]]:
    """Drive the rule as the operator does: one pass per observation, applying each decision."""
    history = History()
    out = []
    for at, obs in observations:
        latest = recommend(obs, TARGETS, current)
        history = history.add(at, latest.replicas, max(s.up_window_s, s.down_window_s))
        d = decide(history, at, current, latest, s)
        current = d.desired
        out.append((at, d, current))
    return out


def test_recommendation_is_proportional_to_the_metric_over_its_target() -> None:
    assert recommend(Observation(kv_usage=0.96, engines=2), TARGETS, 2).replicas == 3
    assert recommend(Observation(kv_usage=0.81, engines=4), TARGETS, 4).replicas == 5  # +1 at least
    # The largest ratio wins, whichever metric it is.
    r = recommend(Observation(kv_usage=0.5, queue_depth=12, engines=2), TARGETS, 2)
    assert r.replicas == 6 and "queueDepth" in r.reason
    r = recommend(Observation(kv_usage=0.5, contended_waste=0.25, engines=2), TARGETS, 2)
    assert r.replicas == 5 and "contendedWaste" in r.reason


def test_recommendation_holds_within_the_tolerance_and_shrinks_below_it() -> None:
    assert recommend(Observation(kv_usage=0.75, engines=3), TARGETS, 3).replicas == 3
    assert recommend(Observation(kv_usage=0.3, engines=4), TARGETS, 4).replicas == 2
    assert recommend(Observation(kv_usage=0.0, queue_depth=0, engines=4), TARGETS, 4).replicas == 0


def test_no_metrics_and_zero_targets() -> None:
    # No engine reported: hold, never read silence as idleness.
    assert recommend(Observation(), TARGETS, 3) == Recommendation(
        3, "no engine reported metrics: holding"
    )
    zero = Targets(kv_usage=0.8, contended_waste=0.0, queue_depth=0)
    assert recommend(Observation(queue_depth=1, engines=2), zero, 2).replicas == 3
    assert recommend(Observation(queue_depth=0, engines=2), zero, 2).replicas == 0


def test_observation_and_scaling_validate() -> None:
    with pytest.raises(ValueError, match="kv_usage"):
        Observation(kv_usage=-0.1)
    with pytest.raises(ValueError, match="kv_usage"):
        Observation(kv_usage=math.nan)
    with pytest.raises(ValueError, match="maxReplicas"):
        Scaling(min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="scaler"):
        Scaling(min_replicas=1, max_replicas=2, scaler="keda")
    with pytest.raises(ValueError, match="time order"):
        History((History().add(5, 1, 10).samples[0], History().add(1, 1, 10).samples[0]))


def test_history_keeps_the_sample_in_force_at_the_window_start() -> None:
    h = History()
    for t in range(0, 100, 10):
        h = h.add(t, t, keep_s=25)
    assert [s.at for s in h.samples] == [60, 70, 80, 90]  # 60 was in force at 90 - 25 = 65
    assert [s.replicas for s in h.window(90, 25) or ()] == [60, 70, 80, 90]
    assert [s.replicas for s in h.window(90, 15) or ()] == [70, 80, 90]
    assert [s.replicas for s in h.window(90, 0) or ()] == [90]
    assert h.window(90, 31) is None  # nothing reaches back to 59


def test_scale_up_waits_for_the_up_window_then_takes_its_lowest_recommendation() -> None:
    s = scaling(up_window_s=30)
    hot = Observation(kv_usage=0.96, engines=2)
    hotter = Observation(kv_usage=1.0, queue_depth=16, engines=2)
    steps = run([(0, hot), (10, hot), (20, hotter), (29, hotter), (30, hotter)], 2, s)
    assert [c for _, _, c in steps] == [2, 2, 2, 2, 3]
    assert steps[3][1].code == "wait-up" and "window 29 of 30 s" in steps[3][1].reason
    # At 30 s the window holds recommendations 3, 3, 8, 8, 8: the lowest wins.
    assert steps[-1][1] == Decision(3, "up", steps[-1][1].reason, "up")


def test_scale_up_stops_at_max_and_says_so() -> None:
    s = scaling(max_replicas=4, up_window_s=0)
    steps = run([(t, Observation(kv_usage=1.0, queue_depth=40, engines=4)) for t in (0, 1)], 4, s)
    assert [c for _, _, c in steps] == [4, 4]
    assert steps[-1][1].code == "bound" and "maxReplicas 4" in steps[-1][1].reason


def test_scale_down_only_after_the_whole_window_and_one_engine_at_a_time() -> None:
    s = scaling(down_window_s=300)
    idle = Observation(kv_usage=0.05, engines=4)
    steps = run([(t, idle) for t in range(0, 301, 30)], 4, s)
    counts = [c for _, _, c in steps]
    assert counts[:-1] == [4] * 10  # 0..270 s: the window is not covered yet
    assert counts[-1] == 3 and steps[-1][1].direction == "down"  # one, though 1 would do
    assert "scale-down window 270 of 300 s" in steps[-2][1].reason


def test_a_busy_moment_in_the_window_blocks_the_scale_down() -> None:
    s = scaling(down_window_s=100)
    idle = Observation(kv_usage=0.05, engines=3)
    busy = Observation(kv_usage=0.78, engines=3)  # within the tolerance: recommends 3
    obs = [(0, idle), (50, busy), (100, idle), (150, idle), (199, idle), (200, idle)]
    counts = [c for _, _, c in run(obs, 3, s)]
    # The busy reading held from 50 s until the next one at 100 s: the window must pass that.
    assert counts == [3, 3, 3, 3, 3, 2]


def test_bounds_are_restored_first() -> None:
    s = scaling(min_replicas=2, max_replicas=4)
    assert run([(0, Observation())], 1, s)[0][1] == Decision(2, "up", "below minReplicas 2", "min")
    assert run([(0, Observation())], 6, s)[0][1].desired == 5  # one at a time, by draining


def test_load_hovering_around_the_target_does_not_flap() -> None:
    s = scaling(up_window_s=30, down_window_s=120)
    # KV usage swinging 0.70..0.95 every 10 s for 20 minutes on 3 engines.
    obs = [
        (t, Observation(kv_usage=0.95 if t % 20 else 0.7, engines=3)) for t in range(0, 1200, 10)
    ]
    assert [d for _, d, _ in run(obs, 3, s) if d.direction != "hold"] == []


def test_a_surge_then_calm_moves_up_once_then_down_step_by_step() -> None:
    # The engines share a load of `pools` KV pools' worth of work; usage = load / engines.
    s = scaling(up_window_s=30, down_window_s=120)
    history, current, moves = History(), 3, []
    for t in range(0, 600, 10):
        pools = 2.85 if t < 100 else 0.6
        obs = Observation(kv_usage=min(1.0, pools / current), engines=current)
        latest = recommend(obs, TARGETS, current)
        history = history.add(t, latest.replicas, 120)
        d = decide(history, t, current, latest, s)
        if d.direction != "hold":
            moves.append((t, d.direction, d.desired))
        current = d.desired
    assert [m[1:] for m in moves] == [("up", 4), ("down", 3), ("down", 2), ("down", 1)]
    assert moves[0][0] == 30  # the surge lasted the up window
    assert moves[1][0] >= 100 + 120  # the calm lasted the down window


def test_engines_still_starting_count_as_idle_up_and_block_down() -> None:
    # 2 of 4 engines report 0.96 while 2 still load their model: spread over all 4 it is
    # under target, so no more engines are asked for meanwhile.
    hot = Observation(kv_usage=0.96, engines=2)
    r = recommend(hot, TARGETS, 4, starting=2)
    assert r.replicas == 4 and "2 engines still starting" in r.reason
    # Far over target even spread out: up, on the spread value. The queue per engine is 4x its
    # target on the 3 that report, 3x over all 4: 4 x 3 = 12.
    far = Observation(kv_usage=1.0, queue_depth=16, engines=3)
    assert recommend(far, TARGETS, 4, starting=1).replicas == 12
    assert recommend(Observation(kv_usage=0.1, engines=2), TARGETS, 3, starting=1).replicas == 3
    assert recommend(Observation(kv_usage=0.1, engines=2), TARGETS, 3, starting=0).replicas == 1


def test_a_pool_with_roles_scales_each_role_on_its_own_engines() -> None:
    """Decode engines read every target; prefill engines only their queue, whose KV (freed as
    each prompt leaves) would look idle and, in one mean, hide the decode engines' load."""
    hot = Observation(kv_usage=0.96, contended_waste=0.0, queue_depth=1.0, engines=3)
    idle_prefill = Observation(kv_usage=0.0, contended_waste=0.0, queue_depth=0.0, engines=1)
    latest, prefill = recommend_by_role(hot, idle_prefill, TARGETS, 3, 1)
    assert (latest.replicas, prefill) == (5, 1)  # decode 3 -> 4 (0.96 / 0.8), prefill kept
    # One mean over all four engines would have held: (3 x 0.96) / 4 = 0.72 < 0.8.
    mixed = Observation(kv_usage=0.72, contended_waste=0.0, queue_depth=0.75, engines=4)
    assert recommend(mixed, TARGETS, 4).replicas == 4
    # Prompts queue on the prefill engine: the prefill count grows, the decode count holds.
    calm = Observation(kv_usage=0.78, contended_waste=0.0, queue_depth=1.0, engines=3)
    queued = Observation(kv_usage=0.0, contended_waste=0.0, queue_depth=10.0, engines=1)
    latest, prefill = recommend_by_role(calm, queued, TARGETS, 3, 1)
    assert (latest.replicas, prefill) == (3 + 3, 3)  # ceil(1 x 10 / 4)
    # An idle prefill role shrinks to its minimum, never below.
    latest, prefill = recommend_by_role(calm, idle_prefill, TARGETS, 3, 2, min_prefill=1)
    assert prefill == 1 and latest.replicas == 3 + 1
    # No prefill engine reported yet: the count holds.
    latest, prefill = recommend_by_role(calm, Observation(), TARGETS, 3, 1)
    assert prefill == 1 and "no engine reported" in latest.reason
