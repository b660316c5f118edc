"""`interlude bench engine --rates`: the SLO rules on engine rows, ratios per round, and a
small real sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from interlude.bench.engine_bench import EngineBenchSpec
from interlude.bench.engine_report import plot_engine_sweep, sweep_lines
from interlude.bench.engine_sweep import run_engine_sweep, stats_delta
from interlude.slo import judge_round, round_slo, sweep_ratios


def row(
    arm: str, rate: float, median: float, p99: float = 0.0, unfinished: float = 0.0
) -> dict[str, Any]:
    return {
        "arm": arm,
        "rate": rate,
        "run": 0,
        "median_norm_latency_s": median,
        "p99_norm_latency_s": p99 or median,
        "unfinished_fraction": unfinished,
    }


def test_the_slo_is_three_times_the_reference_at_its_lowest_rate() -> None:
    assert round_slo([row("vllm-noprefix", 4, 0.5), row("vllm-noprefix", 2, 0.1)]) == pytest.approx(
        0.3
    )


def test_a_round_judges_each_arm_by_both_rules() -> None:
    rows = [
        row("vllm-noprefix", 2, 0.1),
        row("vllm-noprefix", 4, 0.25),
        row("vllm-noprefix", 6, 0.9),
        row("interlude", 2, 0.05),
        # The median passes at 6 but the p99 is past 10 x SLO: the tail rate stays at 4.
        row("interlude", 4, 0.1),
        row("interlude", 6, 0.2, p99=4.0),
        # Too many unfinished: fails both? No: the median rule reads the median only.
        row("interlude", 8, 0.2, unfinished=0.05),
    ]
    judged = judge_round(rows, 0.3)
    assert judged["slo_s_per_token"] == 0.3
    assert judged["sustainable"]["vllm-noprefix"] == {"median": 4, "tail": 4}
    assert judged["sustainable"]["interlude"] == {"median": 8, "tail": 4}


def test_ratios_are_taken_round_by_round() -> None:
    rounds = [
        {
            "sustainable": {
                "vllm-noprefix": {"median": 4, "tail": 2},
                "interlude": {"median": 8, "tail": 6},
            }
        },
        {
            "sustainable": {
                "vllm-noprefix": {"median": 2, "tail": None},
                "interlude": {"median": 6, "tail": 6},
            }
        },
    ]
    got = sweep_ratios(rounds)["vllm-noprefix"]
    assert got["median"]["rounds"] == [2.0, 3.0]
    assert got["median"]["mean"] == pytest.approx(2.5) and got["median"]["range"] == (2.0, 3.0)
    # The second round's stock arm sustained none of the rates: no ratio from it.
    assert got["tail"]["rounds"] == [3.0]
    # The headline is the median of rounds, which one odd round moves less than the mean.
    third = {"vllm-noprefix": {"median": 1, "tail": 1}, "interlude": {"median": 7, "tail": 1}}
    three = sweep_ratios([*rounds, {"sustainable": third}])["vllm-noprefix"]["median"]
    assert three["median"] == 3.0 and three["mean"] == pytest.approx(4.0)


def test_stats_delta_subtracts_counters_nested_too() -> None:
    before = {"hits": 10, "waste_gb_s": 1.5, "recompute_tokens": {"discard": 100}, "name": "a"}
    after = {
        "hits": 25,
        "waste_gb_s": 2.0,
        "recompute_tokens": {"discard": 160, "preempt": 7},
        "name": "b",
    }
    assert stats_delta(before, after) == {
        "hits": 15,
        "waste_gb_s": 0.5,
        "recompute_tokens": {"discard": 60, "preempt": 7},
        "name": "b",
    }


@pytest.mark.engine
def test_small_sweep_finds_sustainable_rates_and_draws(tiny_model: str, tmp_path: Path) -> None:
    spec = EngineBenchSpec(
        model=tiny_model, workload="generated:mixed", duration_s=3.0, horizon_s=60.0
    )
    lines: list[str] = []
    result = run_engine_sweep(spec, ["interlude", "vllm-noprefix"], [1.0, 2.0], lines.append)
    # The reference arm runs first (it sets the SLO), each arm over both rates on one engine.
    assert [(r["arm"], r["rate"]) for r in result["rows"]] == [
        ("vllm-noprefix", 1.0),
        ("vllm-noprefix", 2.0),
        ("interlude", 1.0),
        ("interlude", 2.0),
    ]
    # Light load, a long horizon: everything finishes, and the lowest rate meets its own SLO.
    assert all(r["unfinished_fraction"] == 0 for r in result["rows"])
    (judged,) = result["rounds"]
    assert judged["sustainable"]["vllm-noprefix"]["median"] is not None
    # Each rate's sessions are new prompts: stock without prefix caching hits nothing, and
    # the counters are per run (the second run does not include the first one's).
    stock = [r for r in result["rows"] if r["arm"] == "vllm-noprefix"]
    assert all(r["prefix_cache_hit_rate"] == 0 for r in stock)
    ours = [r for r in result["rows"] if r["arm"] == "interlude"]
    assert ours[1]["sessions"] > ours[0]["sessions"] > 0
    assert any("interlude /" in line for line in sweep_lines(result))
    out = tmp_path / "sweep.png"
    plot_engine_sweep(result, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
