"""The rate sweep: rate parsing, the SLO rule, the spec, and one tiny end-to-end sweep."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from interlude.bench.sweep import (
    SweepSpec,
    parse_rates,
    resolve_pool,
    run_point,
    run_sweep,
    sustainable_rate,
)

PROFILE = "gptj-6b-a100-40g"
POINT_KEYS = {
    "rate",
    "normalized_latency_median",
    "throughput_rps",
    "ttft_mean",
    "ttft_p99",
    "e2e_mean",
    "e2e_p99",
    "waste_fraction",
    "recompute_fraction",
}


# --- parse_rates ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "rates"),
    [
        ("0.5:2:0.5", (0.5, 1.0, 1.5, 2.0)),  # stop included
        ("0.1:0.3:0.1", (0.1, 0.2, 0.3)),  # 0.3 survives float error (2.9999... steps)
        ("1:1:1", (1.0,)),
        ("1:2.5:1", (1.0, 2.0)),  # the step does not land on the stop
        ("1,2,3", (1.0, 2.0, 3.0)),
        ("0.25", (0.25,)),
        (" 1 , 4 ", (1.0, 4.0)),
    ],
)
def test_parse_rates(text: str, rates: tuple[float, ...]) -> None:
    assert parse_rates(text) == rates


@pytest.mark.parametrize(
    "text", ["", "fast", "1,,2", "1:2", "1:2:3:4", "2:1:0.5", "1:2:0", "1:2:-1"]
)
def test_parse_rates_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match=r"bad rates .*START:STOP:STEP or a comma list"):
        parse_rates(text)


# --- sustainable_rate ------------------------------------------------------------------------
def points(*pairs: tuple[float, float]) -> list[dict[str, Any]]:
    return [{"rate": r, "normalized_latency_median": lat} for r, lat in pairs]


def test_sustainable_rate_stops_at_the_first_rate_over_the_slo() -> None:
    # 3.0 is over the SLO; 4.0 is back under it (noise) but does not count.
    pts = points((4.0, 0.15), (1.0, 0.1), (3.0, 0.5), (2.0, 0.3))
    assert sustainable_rate(pts, slo=0.3) == 2.0  # <= SLO counts, unsorted input is sorted


def test_sustainable_rate_none_and_all() -> None:
    assert sustainable_rate(points((1.0, 0.5), (2.0, 0.1)), slo=0.3) is None
    assert sustainable_rate(points((1.0, 0.1), (2.0, 0.2)), slo=0.3) == 2.0
    assert sustainable_rate(points((1.0, 0.1), (2.0, math.nan)), slo=0.3) == 1.0  # NaN fails
    assert sustainable_rate([], slo=0.3) is None


# --- SweepSpec ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policies": ()}, r"no policies"),
        ({"policies": ("vllm", "fifo")}, r"unknown policy 'fifo'; choose from vllm"),
        ({"rates": ()}, r"rates must be positive"),
        ({"rates": (1.0, 0.0)}, r"rates must be positive"),
        ({"rates": (-1.0,)}, r"rates must be positive"),
        ({"duration_s": 0.0}, r"duration must be positive"),
        ({"workers": -1}, r"workers must be >= 0"),
    ],
)
def test_sweep_spec_validation(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {
        "workload": "generated:mixed",
        "profile": PROFILE,
        "policies": ("vllm",),
        "rates": (1.0,),
    }
    with pytest.raises(ValueError, match=message):
        SweepSpec(**{**base, **kwargs})


def test_run_point_is_deterministic() -> None:
    pool = resolve_pool("generated:mixed", 0)
    a = run_point(pool, PROFILE, "infercept", 1.0, 20.0, 0)
    b = run_point(pool, PROFILE, "infercept", 1.0, 20.0, 0)
    assert a.pop("wall_s") >= 0 and b.pop("wall_s") >= 0
    assert a == b
    assert a["policy"] == "infercept" and a["rate"] == 1.0 and a["arrived"] > 0


# --- run_sweep ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_sweep_end_to_end() -> None:
    spec = SweepSpec(
        "generated:mixed", PROFILE, ("vllm", "interlude"), (1.0, 0.5), duration_s=60.0, workers=1
    )
    seen: list[tuple[str, float]] = []
    result = run_sweep(spec, lambda pt: seen.append((pt["policy"], pt["rate"])))
    assert sorted(seen) == [("interlude", 0.5), ("interlude", 1.0), ("vllm", 0.5), ("vllm", 1.0)]
    json.dumps(result)  # serializable as is
    assert result["rates"] == [1.0, 0.5] and result["duration_s"] == 60.0
    assert list(result["policies"]) == ["vllm", "interlude"]
    vllm_low = result["policies"]["vllm"]["points"][0]
    assert vllm_low["rate"] == 0.5  # points sorted by rate
    # The SLO: 3 x vllm's median normalized latency at the lowest rate.
    assert result["slo_normalized_latency"] == pytest.approx(
        3 * vllm_low["normalized_latency_median"]
    )
    for entry in result["policies"].values():
        pts = entry["points"]
        assert [p["rate"] for p in pts] == [0.5, 1.0]
        for p in pts:
            assert set(p) >= POINT_KEYS
            assert all(isinstance(p[k], float | int) for k in POINT_KEYS)
            assert p["arrived"] > 0
        assert entry["sustainable_rate"] == sustainable_rate(pts, result["slo_normalized_latency"])
    # vllm meets 3x its own latency at its lowest rate, by construction.
    assert result["policies"]["vllm"]["sustainable_rate"] is not None


@pytest.mark.slow
def test_sweep_without_vllm_still_measures_the_slo() -> None:
    spec = SweepSpec("generated:mixed", PROFILE, ("preserve",), (0.5,), duration_s=20.0, workers=1)
    calls: list[str] = []
    result = run_sweep(spec, lambda pt: calls.append(pt["policy"]))
    assert sorted(calls) == ["preserve", "vllm"]  # the reference runs, but is not reported
    assert list(result["policies"]) == ["preserve"]
    ref = run_point(resolve_pool("generated:mixed", 0), PROFILE, "vllm", 0.5, 20.0, 0)
    assert result["slo_normalized_latency"] == pytest.approx(3 * ref["normalized_latency_median"])
