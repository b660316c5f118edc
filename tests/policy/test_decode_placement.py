"""TetriInfer's decode placement rules (policy/decode_placement.py) and their synthetic bench
(bench/placement.py): each rule picks what it says, and imbalance costs light requests."""

from __future__ import annotations

import random

import pytest

from interlude.bench.placement import PlacementSpec, run_placement, run_rule
from interlude.bench.placement_report import markdown_rows
from interlude.policy import load_profile
from interlude.policy.decode_placement import DecodeLoad, choose_decode

# Two engines with room: the two drawn are always these two, so each rule's pick is known.
CROWDED_LIGHT = DecodeLoad(free_tokens=5000, heavy=2, light=10, predicted_tokens=3000.0)
FEW_HEAVY = DecodeLoad(free_tokens=4000, heavy=2, light=1, predicted_tokens=2500.0)
FULL = DecodeLoad(free_tokens=100, heavy=0, light=0)


@pytest.mark.parametrize(
    ("rule", "pick"),
    [
        ("heavy-light", 0),  # 2 of 12 heavy beats 2 of 3, though it holds four times the decodes
        ("least-loaded", 1),  # 3 decodes beat 12
        ("predicted-work", 1),  # 2,500 tokens to come beat 3,000
        ("worst", 1),  # the larger heavy share
    ],
)
def test_each_rule_picks_among_the_engines_with_room(rule: str, pick: int) -> None:
    loads = [CROWDED_LIGHT, FEW_HEAVY, FULL]
    for seed in range(5):
        assert choose_decode(loads, 1000, random.Random(seed), rule) == pick


def test_no_engine_with_room_is_no_choice_and_a_bad_rule_is_refused() -> None:
    assert choose_decode([FULL, FULL], 1000, random.Random(0)) is None
    assert choose_decode([FULL, CROWDED_LIGHT], 1000, random.Random(0), "random") == 1
    with pytest.raises(ValueError, match="rule must be one of"):
        choose_decode([CROWDED_LIGHT], 10, random.Random(0), "round-robin")
    assert DecodeLoad(10, 0, 0).heavy_share == 0.0


def test_imbalance_costs_light_requests_and_every_request_is_counted() -> None:
    spec = PlacementSpec(rate=8.0, duration_s=60.0, seed=0)
    profile = load_profile("llama3-8b-h100")
    runs = {rule: run_rule(spec, profile, rule) for rule in ("least-loaded", "random", "worst")}
    assert all(r["finished"] + r["unfinished"] == runs["worst"]["finished"] for r in runs.values())
    for rule in ("least-loaded", "random"):
        assert runs["worst"]["light_jct_p99_s"] > 1.5 * runs[rule]["light_jct_p99_s"], rule
        assert runs["worst"]["preemptions"] > runs[rule]["preemptions"], rule
    assert run_rule(spec, profile, "random") == runs["random"]  # the same arrivals, the same run


def test_the_bench_reports_every_rule_and_rate_with_its_rounds() -> None:
    spec = PlacementSpec(duration_s=20.0)
    result = run_placement(spec, load_profile("llama3-8b-h100"), (4.0, 6.0), (0, 1))
    assert len(result["rows"]) == 2 * 2 * 5
    lines = markdown_rows(result)
    assert len(lines) == 2 + 2 * 5 and all(line.count("|") == 8 for line in lines[2:])
    with pytest.raises(ValueError, match="kv_tokens"):
        PlacementSpec(kv_tokens=1000)
