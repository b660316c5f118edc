"""The SLO and sustainable-rate rules every rate sweep judges by: the simulator's (`bench sim`),
the real engine's (`bench engine --rates`) and the HTTP load generator's (`bench http`,
`loadgen run`).

A sweep runs each policy or arm at a list of arrival rates. The SLO is SLO_FACTOR x the
reference's median normalized latency at the lowest rate (the reference is the sweep's to name:
`vllm` in the simulator, `vllm-noprefix` on the engine). Two sustainable rates per policy or
arm, both "the highest rate up to which every swept rate passes":
* median: the median normalized latency <= SLO (InferCept's rule, comparable with the paper);
* tail: that, and the p99 normalized latency <= TAIL_FACTOR x SLO, and at most
  MAX_UNFINISHED_FRACTION of the requests unfinished at the horizon.

A point is a mapping with `rate`, `normalized_latency_median`, `normalized_latency_p99`,
`unfinished_fraction` and optionally `skipped` (a rate not run: it fails both rules). Engine and
HTTP runs name their metrics differently; `judged` turns such a row into a point.

Pure rules: the standard library only, no I/O. Harnesses (bench, the HTTP load generator) sit
above this module, and it imports none of them (tests/test_layering.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SLO_FACTOR = 3.0
# The tail rule's p99 bound, as a multiple of the (median) SLO. InferCept reports medians only,
# which cannot see a policy that serves most requests quickly while starving a few (ranking
# policies can). 10 x SLO is 30 x vllm's unloaded median: with the GPT-J SLO of ~30 ms/token a
# 500-token answer at the p99 takes about 2.5 minutes plus its tool time, slow but still what a
# user would call served; past that, one request in a hundred is in effect lost.
TAIL_FACTOR = 10.0
# Unfinished requests count censored at the horizon (a lower bound on their latency). With more
# than 1 % unfinished the p99 itself would be such a lower bound, so the tail rule could not
# trust it; at most 1 % keeps the p99 a measured value (at worst the largest one censored).
MAX_UNFINISHED_FRACTION = 0.01
# Consecutive tail failures before a policy's higher rates are skipped: one failure may be noise
# (a rate can fail and the next pass), two in a row end the sweep for that policy, once the
# median rule has failed too (see `skip_above`).
SKIP_AFTER_FAILURES = 2
OURS = "interlude"  # the arm `sweep_ratios` divides by each stock arm


def meets_median(pt: Mapping[str, Any], slo: float) -> bool:
    """InferCept's rule: median normalized latency <= SLO. A skipped point fails (unknown)."""
    if pt.get("skipped"):
        return False
    return bool(pt["normalized_latency_median"] <= slo)


def meets_tail(pt: Mapping[str, Any], slo: float) -> bool:
    """The median rule, plus p99 <= TAIL_FACTOR x SLO and few requests left unfinished."""
    if not meets_median(pt, slo):
        return False
    return bool(
        pt["normalized_latency_p99"] <= TAIL_FACTOR * slo
        and pt["unfinished_fraction"] <= MAX_UNFINISHED_FRACTION
    )


def _highest_passing(
    points: Sequence[Mapping[str, Any]],
    slo: float,
    meets: Callable[[Mapping[str, Any], float], bool],
) -> float | None:
    best = None
    for pt in sorted(points, key=lambda p: p["rate"]):
        if not meets(pt, slo):
            break
        best = pt["rate"]
    return best


def sustainable_rate(points: Sequence[Mapping[str, Any]], slo: float) -> float | None:
    """Highest rate up to which every swept rate keeps the median normalized latency <= SLO."""
    return _highest_passing(points, slo, meets_median)


def sustainable_rate_tail(points: Sequence[Mapping[str, Any]], slo: float) -> float | None:
    """Highest rate up to which every swept rate passes the tail rule (`meets_tail`)."""
    return _highest_passing(points, slo, meets_tail)


def skip_above(
    rates: Sequence[float], results: Mapping[float, Mapping[str, Any]], slo: float
) -> float | None:
    """The rate above which a policy need not be simulated, or None (not yet, or never).

    Walks `rates` in ascending order while their `results` are known (a gap means "not yet").
    The answer is the first rate at which (a) the last SKIP_AFTER_FAILURES rates all failed the
    tail rule and (b) some rate so far failed the median rule. (a) keeps one noisy failure from
    ending the sweep; (b) keeps the median-only rate exact: the tail rule can fail while the
    median still passes, and skipping then would cut the median rate short. Both sustainable
    rates stop at their first failure, so neither ever reaches a skipped point.
    """
    failures = 0
    median_failed = False
    for rate in sorted(rates):
        pt = results.get(rate)
        if pt is None:
            return None
        failures = 0 if meets_tail(pt, slo) else failures + 1
        median_failed = median_failed or not meets_median(pt, slo)
        if failures >= SKIP_AFTER_FAILURES and median_failed:
            return rate
    return None


# --- engine and HTTP rows: one row per (arm, rate, round) ---------------------------------------


def judged(row: Mapping[str, Any]) -> dict[str, Any]:
    """An engine or HTTP run (`median_norm_latency_s`, `p99_norm_latency_s`, ...) as a point
    the rules above read."""
    return {
        "rate": row["rate"],
        "skipped": False,
        "normalized_latency_median": row["median_norm_latency_s"],
        "normalized_latency_p99": row["p99_norm_latency_s"],
        "unfinished_fraction": row["unfinished_fraction"],
    }


def round_slo(reference_rows: Sequence[Mapping[str, Any]]) -> float:
    """The SLO: SLO_FACTOR x the reference arm's median normalized latency at its lowest rate
    (as the simulator's sweep takes it from `vllm`)."""
    lowest = min(reference_rows, key=lambda r: r["rate"])
    return float(SLO_FACTOR * lowest["median_norm_latency_s"])


def judge_round(rows: Sequence[Mapping[str, Any]], slo: float) -> dict[str, Any]:
    """One round's SLO and each arm's two sustainable rates (None: not even the lowest)."""
    arms: dict[str, dict[str, float | None]] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        points = [judged(r) for r in rows if r["arm"] == arm]
        arms[arm] = {
            "median": sustainable_rate(points, slo),
            "tail": sustainable_rate_tail(points, slo),
        }
    return {"slo_s_per_token": slo, "sustainable": arms}


def sweep_ratios(rounds: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """`interlude`'s sustainable rate over each stock arm's, per round: the median of rounds
    (the headline: one odd round moves it least), the mean and the range, for the median and
    the tail rule. A round where either rate is None gives no ratio."""
    out: dict[str, dict[str, Any]] = {}
    stocks = {a for r in rounds for a in r["sustainable"] if a != OURS}
    for stock in sorted(stocks):
        entry: dict[str, Any] = {}
        for rule in ("median", "tail"):
            values = []
            for r in rounds:
                ours = r["sustainable"].get(OURS, {}).get(rule)
                theirs = r["sustainable"].get(stock, {}).get(rule)
                if ours is not None and theirs:
                    values.append(ours / theirs)
            entry[rule] = (
                {
                    "median": statistics.median(values),
                    "mean": sum(values) / len(values),
                    "range": (min(values), max(values)),
                    "rounds": values,
                }
                if values
                else None
            )
        out[stock] = entry
    return out
