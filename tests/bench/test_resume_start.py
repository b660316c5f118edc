"""`bench http`'s reading of the engines' resume-start histogram: turns between two scrapes,
their median interpolated within its bucket, the share within 5 ms, medians over rounds."""

from __future__ import annotations

from interlude.bench.resume_start import Buckets, by_arm, lines, summary

INF = float("inf")


def buckets(via: str, counts: dict[float, float]) -> Buckets:
    return {(via, le): n for le, n in counts.items()}


def test_only_the_turns_between_the_snapshots_count() -> None:
    before = buckets("preserve", {0.001: 100, 0.002: 100, 0.005: 100, 0.01: 100, INF: 100})
    after = buckets("preserve", {0.001: 102, 0.002: 105, 0.005: 108, 0.01: 110, INF: 110})
    after |= buckets("swap", {0.001: 0, 0.002: 0, 0.005: 0, 0.01: 0, INF: 0})
    got = summary(before, after)
    # 10 new turns: 2 under 1 ms, 3 more under 2 ms (the 5th, the median, at 2 ms), 8 under 5.
    assert got == {"preserve": {"turns": 10, "p50_ms": 2.0, "within_5ms": 0.8}}


def test_a_median_past_the_last_bound_is_unknown() -> None:
    after = buckets("recompute", {0.001: 0, 0.01: 1, INF: 4})
    assert summary({}, after)["recompute"] == {"turns": 4, "p50_ms": None, "within_5ms": 0.25}


def test_rounds_are_summarised_by_their_median() -> None:
    rows = [
        {"arm": "interlude", "rate": 3.0, "resume_start": {"preserve": s}}
        for s in (
            {"turns": 10, "p50_ms": 1.0, "within_5ms": 0.9},
            {"turns": 12, "p50_ms": 3.0, "within_5ms": 0.7},
            {"turns": 11, "p50_ms": 2.0, "within_5ms": 0.8},
        )
    ]
    rows.append({"arm": "vllm-prefix", "rate": 3.0})  # no engines of ours: nothing read
    got = by_arm(rows)
    assert got == {
        "interlude": {3.0: {"preserve": {"p50_ms": 2.0, "within_5ms": 0.8, "turns": 33}}}
    }
    assert lines(got) == ["  interlude          preserve     3/s: 2.0 ms, 80% <= 5 ms"]
