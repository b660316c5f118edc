"""Each peer at its best configuration: a sweep's table names the configuration of each peer
that sustained the highest rate (tail rule first), and says which (`bench/report.py`)."""

from __future__ import annotations

from typing import Any

from interlude.bench.report import family_of, markdown_table, peers_at_best
from interlude.policy import POLICIES


def entry(median: float | None, tail: float | None) -> dict[str, Any]:
    point = {
        "rate": 1.0,
        "normalized_latency_median": 0.01,
        "normalized_latency_p99": 0.02,
        "unfinished_fraction": 0.0,
        "throughput_rps": 1.0,
        "ttft_mean": 0.1,
        "ttft_p99": 0.2,
        "e2e_mean": 1.0,
        "e2e_p99": 2.0,
        "waste_fraction": 0.1,
        "recompute_fraction": 0.0,
    }
    return {"sustainable_rate_median": median, "sustainable_rate_tail": tail, "points": [point]}


def result(**policies: dict[str, Any]) -> dict[str, Any]:
    return {
        "profile": "p",
        "workload": "w",
        "duration_s": 10.0,
        "rates": [1.0],
        "slo_normalized_latency": 0.03,
        "tail_slo_normalized_latency": 0.3,
        "max_unfinished_fraction": 0.01,
        "policies": {k.replace("_", "-"): v for k, v in policies.items()},
    }


def test_configurations_know_their_peer() -> None:
    assert family_of("thunderagent-decay") == family_of("thunderagent") == "thunderagent"
    assert family_of("continuum-fixed-ttl") == "continuum"
    assert family_of("interlude") == "interlude"
    assert family_of("no.such:Policy") == "no.such:Policy"
    assert {c.family for c in POLICIES.values()} == {"", "thunderagent", "continuum"}


def test_the_best_configuration_by_the_tail_rule_then_the_median() -> None:
    r = result(
        thunderagent=entry(2.75, 1.5),
        thunderagent_decay=entry(2.0, 1.5),
        continuum=entry(1.25, None),
        continuum_fixed_ttl=entry(1.75, 1.75),
        interlude=entry(2.5, 2.0),
    )
    best = peers_at_best(r)
    assert best == {
        "thunderagent": ("thunderagent", "1.5 req/s, median rule 2.75"),
        "continuum": ("continuum-fixed-ttl", "1.75 req/s, median rule 1.75"),
    }
    assert "continuum: continuum-fixed-ttl (1.75 req/s" in markdown_table(r, 1.0)
    # A peer swept in one configuration has nothing to choose between: no line.
    alone = result(thunderagent=entry(2.0, 1.5), interlude=entry(2.5, 2.0))
    assert peers_at_best(alone) == {}
    assert "best configuration" not in markdown_table(alone, 1.0)
