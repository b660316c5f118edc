"""The rate sweep: rate parsing, the SLO rules, skipping, the spec, and tiny end-to-end sweeps."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from interlude.bench.sweep import (
    POINT_FIELDS,
    SweepSpec,
    parse_rates,
    resolve_pool,
    run_point,
    run_sweep,
    skipped_point,
)
from interlude.slo import (
    MAX_UNFINISHED_FRACTION,
    TAIL_FACTOR,
    skip_above,
    sustainable_rate,
    sustainable_rate_tail,
)
from interlude_workloads import TraceRequest

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
    "unfinished",
    "unfinished_fraction",
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


# --- sustainable rates ---------------------------------------------------------------------
def points(*pairs: tuple[float, float]) -> list[dict[str, Any]]:
    return [{"rate": r, "normalized_latency_median": lat} for r, lat in pairs]


def tail_point(
    rate: float, median: float, p99: float | None = None, unfinished: float = 0.0
) -> dict[str, Any]:
    return {
        "rate": rate,
        "normalized_latency_median": median,
        "normalized_latency_p99": median if p99 is None else p99,
        "unfinished_fraction": unfinished,
        "skipped": False,
    }


def test_sustainable_rate_stops_at_the_first_rate_over_the_slo() -> None:
    # 3.0 is over the SLO; 4.0 is back under it (noise) but does not count.
    pts = points((4.0, 0.15), (1.0, 0.1), (3.0, 0.5), (2.0, 0.3))
    assert sustainable_rate(pts, slo=0.3) == 2.0  # <= SLO counts, unsorted input is sorted


def test_sustainable_rate_none_and_all() -> None:
    assert sustainable_rate(points((1.0, 0.5), (2.0, 0.1)), slo=0.3) is None
    assert sustainable_rate(points((1.0, 0.1), (2.0, 0.2)), slo=0.3) == 2.0
    assert sustainable_rate(points((1.0, 0.1), (2.0, math.nan)), slo=0.3) == 1.0  # NaN fails
    assert sustainable_rate([], slo=0.3) is None


def test_a_skipped_point_is_not_sustained() -> None:
    pts = [tail_point(1.0, 0.1), skipped_point(2.0)]
    assert sustainable_rate(pts, slo=0.3) == 1.0
    assert sustainable_rate_tail(pts, slo=0.3) == 1.0


def test_tail_rate_needs_the_median_the_p99_and_few_unfinished() -> None:
    slo = 0.1
    ok = [tail_point(1.0, 0.05, p99=TAIL_FACTOR * slo)]  # the p99 bound is inclusive
    assert sustainable_rate_tail(ok, slo) == 1.0
    # Median fine everywhere; the tail breaks at 2.0 three ways.
    for bad in (
        tail_point(2.0, 0.05, p99=TAIL_FACTOR * slo * 1.01),
        tail_point(2.0, 0.05, unfinished=MAX_UNFINISHED_FRACTION + 0.001),
        tail_point(2.0, 0.05, p99=math.nan),
    ):
        pts = [*ok, bad, tail_point(3.0, 0.05)]
        assert sustainable_rate(pts, slo) == 3.0
        assert sustainable_rate_tail(pts, slo) == 1.0
    at_limit = tail_point(2.0, 0.05, unfinished=MAX_UNFINISHED_FRACTION)  # inclusive too
    assert sustainable_rate_tail([*ok, at_limit], slo) == 2.0
    # A median failure is a tail failure.
    assert sustainable_rate_tail([tail_point(1.0, 0.2)], slo) is None


# --- skip_above --------------------------------------------------------------------------------
RATES = (1.0, 2.0, 3.0, 4.0, 5.0)


def known(*pts: dict[str, Any]) -> dict[float, dict[str, Any]]:
    return {p["rate"]: p for p in pts}


def test_skip_after_two_consecutive_failures() -> None:
    slo = 0.1
    good, bad = 0.05, 0.5  # median under and over the SLO
    res = known(tail_point(1.0, good), tail_point(2.0, bad), tail_point(3.0, bad))
    assert skip_above(RATES, res, slo) == 3.0
    # One failure is not enough: it may be noise.
    assert skip_above(RATES, known(tail_point(1.0, good), tail_point(2.0, bad)), slo) is None
    # A pass between two failures resets the count.
    res = known(
        *(tail_point(r, m) for r, m in zip(RATES, (bad, good, bad, good, bad), strict=True))
    )
    assert skip_above(RATES, res, slo) is None
    # A gap (a rate not finished yet) stops the walk: nothing past it is judged.
    res = known(tail_point(1.0, good), tail_point(3.0, bad), tail_point(4.0, bad))
    assert skip_above(RATES, res, slo) is None


def test_no_skip_while_the_median_rate_is_unsettled() -> None:
    slo = 0.1
    tail_only = [tail_point(r, 0.05, p99=2.0) for r in RATES[:4]]  # p99 > 10 x SLO, median fine
    assert skip_above(RATES, known(*tail_only), slo) is None
    # Once the median fails too (at 5.0) and the tail has failed twice in a row, skip.
    res = known(*tail_only, tail_point(5.0, 0.5))
    assert skip_above(RATES, res, slo) == 5.0
    # The median failed earlier: the second consecutive tail failure ends it.
    res = known(tail_point(1.0, 0.5), tail_point(2.0, 0.05, p99=2.0), tail_point(3.0, 0.05))
    assert skip_above(RATES, res, slo) == 2.0


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


# --- run_sweep with a stand-in for the simulator ---------------------------------------------
LOG_ENV = "INTERLUDE_TEST_SWEEP_LOG"
# Median normalized latency per policy and rate (1..6); vllm-v0's at 1.0 makes the SLO 0.03.
MEDIANS = {
    "vllm-v0": (0.01, 0.02, 0.05, 0.06, 0.07, 0.08),  # fails from 3: skip above 4
    "interlude": (0.01,) * 6,  # median always fine (tail breaks at 3): never skipped
    "preserve": (0.01, 0.05, 0.02, 0.05, 0.05, 0.05),  # fail, pass (noise), fail, fail: skip > 5
}
FAKE_RATES = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)


def fake_point(
    pool: Sequence[TraceRequest], profile: str, policy: str, rate: float, duration: float, seed: int
) -> dict[str, Any]:
    """Metrics made up from (policy, rate); logs each call to the file in LOG_ENV."""
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(f"{policy} {rate}\n")
    # Low rates take longest, so with several workers higher rates finish first (out of order).
    time.sleep(0.01 * (7 - rate))
    median = MEDIANS[policy][int(rate) - 1]
    p99 = 0.5 if policy == "interlude" and rate >= 3 else 2 * median
    out: dict[str, Any] = dict.fromkeys(POINT_FIELDS, 0.0)
    out.update(
        policy=policy, rate=rate, normalized_latency_median=median, normalized_latency_p99=p99
    )
    return out


def fake_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, *, full: bool = False
) -> tuple[dict[str, Any], list[dict[str, Any]], list[tuple[str, float]]]:
    log = tmp_path / f"calls-{workers}-{full}.log"
    log.touch()
    monkeypatch.setenv(LOG_ENV, str(log))
    spec = SweepSpec(
        "generated:mixed", PROFILE, tuple(MEDIANS), FAKE_RATES, workers=workers, full=full
    )
    seen: list[dict[str, Any]] = []
    result = run_sweep(spec, seen.append, point_fn=fake_point)
    calls = [(p, float(r)) for p, r in (line.split() for line in log.read_text().splitlines())]
    return result, seen, calls


def test_sweep_skips_a_policy_after_two_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, seen, calls = fake_sweep(tmp_path, monkeypatch, workers=1)
    json.dumps(result)  # serializable, skipped points included
    assert result["slo_normalized_latency"] == pytest.approx(0.03)
    assert result["tail_slo_normalized_latency"] == pytest.approx(TAIL_FACTOR * 0.03)
    assert result["full"] is False
    pols = result["policies"]
    rates = {
        name: (e["sustainable_rate_median"], e["sustainable_rate_tail"]) for name, e in pols.items()
    }
    assert rates == {"vllm-v0": (2.0, 2.0), "interlude": (6.0, 2.0), "preserve": (1.0, 1.0)}
    skipped = {n: [p["rate"] for p in e["points"] if p["skipped"]] for n, e in pols.items()}
    assert skipped == {"vllm-v0": [5.0, 6.0], "interlude": [], "preserve": [6.0]}
    for entry in pols.values():
        assert [p["rate"] for p in entry["points"]] == list(FAKE_RATES)
        for p in entry["points"]:
            assert set(p) == {*POINT_FIELDS, "skipped"}
            if p["skipped"]:
                assert all(p[k] is None for k in POINT_FIELDS if k != "rate")
    # One worker: a skipped rate never ran, and every point was reported exactly once.
    ran = {(n, p["rate"]) for n, e in pols.items() for p in e["points"] if not p["skipped"]}
    assert sorted(calls) == sorted(ran)
    assert sorted((p["policy"], p["rate"]) for p in seen) == sorted(
        (n, r) for n in MEDIANS for r in FAKE_RATES
    )
    assert {(p["policy"], p["rate"]) for p in seen if p.get("skipped")} == {
        ("vllm-v0", 5.0),
        ("vllm-v0", 6.0),
        ("preserve", 6.0),
    }


def test_sweep_result_does_not_depend_on_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, _, _ = fake_sweep(tmp_path, monkeypatch, workers=1)
    many, seen, calls = fake_sweep(tmp_path, monkeypatch, workers=6)
    assert one.pop("wall_s") >= 0 and many.pop("wall_s") >= 0
    assert one == many
    # Runs above a cutoff may have started before it was known; they are dropped, not reported.
    assert len(seen) == len(MEDIANS) * len(FAKE_RATES)
    assert len(calls) >= len(seen) - 3


def test_full_sweep_simulates_every_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen, calls = fake_sweep(tmp_path, monkeypatch, workers=2, full=True)
    assert result["full"] is True
    assert len(calls) == len(seen) == len(MEDIANS) * len(FAKE_RATES)
    assert not any(p["skipped"] for e in result["policies"].values() for p in e["points"])
    # The rates are the same as with skipping: skipping never cuts either rate short.
    assert result["policies"]["vllm-v0"]["sustainable_rate_median"] == 2.0
    assert result["policies"]["interlude"]["sustainable_rate_median"] == 6.0


# --- run_sweep with the simulator ------------------------------------------------------------
@pytest.mark.slow
def test_tiny_sweep_end_to_end() -> None:
    spec = SweepSpec(
        "generated:mixed", PROFILE, ("vllm-v0", "interlude"), (1.0, 0.5), duration_s=60.0, workers=1
    )
    seen: list[tuple[str, float]] = []
    result = run_sweep(spec, lambda pt: seen.append((pt["policy"], pt["rate"])))
    assert sorted(seen) == [
        ("interlude", 0.5),
        ("interlude", 1.0),
        ("vllm-v0", 0.5),
        ("vllm-v0", 1.0),
    ]
    json.dumps(result)  # serializable as is
    assert result["rates"] == [1.0, 0.5] and result["duration_s"] == 60.0
    assert list(result["policies"]) == ["vllm-v0", "interlude"]
    vllm_low = result["policies"]["vllm-v0"]["points"][0]
    assert vllm_low["rate"] == 0.5  # points sorted by rate
    # The SLO: 3 x vllm-v0's median normalized latency at the lowest rate.
    slo = result["slo_normalized_latency"]
    assert slo == pytest.approx(3 * vllm_low["normalized_latency_median"])
    for entry in result["policies"].values():
        pts = entry["points"]
        assert [p["rate"] for p in pts] == [0.5, 1.0]
        for p in pts:
            assert set(p) >= POINT_KEYS
            assert all(isinstance(p[k], float | int) for k in POINT_KEYS)
            assert p["arrived"] > 0 and p["skipped"] is False
            assert p["unfinished"] == p["arrived"] - p["finished"]
        assert entry["sustainable_rate_median"] == sustainable_rate(pts, slo)
        assert entry["sustainable_rate_tail"] == sustainable_rate_tail(pts, slo)
        assert "sustainable_rate" not in entry
    # vllm-v0 meets 3x its own latency at its lowest rate, by construction.
    assert result["policies"]["vllm-v0"]["sustainable_rate_median"] is not None


@pytest.mark.slow
def test_sweep_without_vllm_still_measures_the_slo() -> None:
    spec = SweepSpec("generated:mixed", PROFILE, ("preserve",), (0.5,), duration_s=20.0, workers=1)
    calls: list[str] = []
    result = run_sweep(spec, lambda pt: calls.append(pt["policy"]))
    assert sorted(calls) == ["preserve", "vllm-v0"]  # the reference runs, but is not reported
    assert list(result["policies"]) == ["preserve"]
    ref = run_point(resolve_pool("generated:mixed", 0), PROFILE, "vllm-v0", 0.5, 20.0, 0)
    assert result["slo_normalized_latency"] == pytest.approx(3 * ref["normalized_latency_median"])
