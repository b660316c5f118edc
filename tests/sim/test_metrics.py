"""Per-run metrics over hand-built requests: every statistic counts unfinished requests."""

from __future__ import annotations

import math

import pytest

from interlude.sim.metrics import Accounting, mean, quantile, summarize
from interlude.sim.request import SimRequest
from interlude_workloads import Segment, TraceRequest

TRACE = TraceRequest("t", "k", 10, (Segment(10, None),))
HORIZON = 200.0


def request(
    i: int, arrival: float, first: float | None, end: float | None, out: int = 10
) -> SimRequest:
    r = SimRequest(f"r{i}", TRACE, arrival)
    r.first_token_at = first
    r.finished_at = end
    r.output_tokens = out
    return r


def served(n: int) -> list[SimRequest]:
    """`n` requests arriving 1 s apart, first token after 0.1 s, done after 2 s."""
    return [request(i, float(i), i + 0.1, i + 2.0) for i in range(n)]


def run(requests: list[SimRequest]) -> dict[str, float | int | str]:
    return summarize("p", 1.0, requests, HORIZON, Accounting(), gpu_kv_bytes=1).to_dict()


def test_all_finished_matches_the_plain_statistics() -> None:
    m = run(served(100))
    assert m["arrived"] == m["finished"] == 100
    assert m["unfinished"] == 0 and m["unfinished_fraction"] == 0.0
    assert m["e2e_mean"] == pytest.approx(2.0) and m["e2e_p99"] == pytest.approx(2.0)
    assert m["ttft_mean"] == pytest.approx(0.1) and m["ttft_p99"] == pytest.approx(0.1)
    assert m["throughput_rps"] == pytest.approx(100 / HORIZON)


def test_a_starved_request_moves_the_tail() -> None:
    # One request arrives at 0 and never gets a token: dropping it would leave the tail at 2 s.
    reqs = [*served(99), request(99, 0.0, None, None)]
    m = run(reqs)
    assert m["finished"] == 99 and m["unfinished"] == 1
    assert m["unfinished_fraction"] == pytest.approx(0.01)
    # Censored at the horizon: e2e = TTFT = 200 - 0. With 100 values the p99 sits 0.01 of the
    # way from the 99th to the 100th, so it moves from 2.0 to 2.0 + 0.01 * 198.
    assert m["e2e_p99"] == pytest.approx(quantile([2.0] * 99 + [HORIZON], 0.99))
    assert m["e2e_p99"] == pytest.approx(2.0 + 0.01 * (HORIZON - 2.0))
    assert m["ttft_p99"] == pytest.approx(0.1 + 0.01 * (HORIZON - 0.1))
    assert m["e2e_mean"] == pytest.approx((99 * 2.0 + HORIZON) / 100)
    assert m["ttft_mean"] == pytest.approx((99 * 0.1 + HORIZON) / 100)
    # Normalized latency was censored already: (200 - 0 - 0) / 10 output tokens.
    assert m["normalized_latency_p99"] > 0.2
    assert m["throughput_rps"] == pytest.approx(99 / HORIZON)  # only finished ones count here


def test_started_but_unfinished_keeps_its_first_token() -> None:
    # First token at 5 s, still decoding at the horizon: TTFT 5, e2e censored at 200 - 0.
    m = run([request(0, 0.0, 5.0, None)])
    assert m["ttft_mean"] == pytest.approx(5.0)
    assert m["e2e_mean"] == pytest.approx(HORIZON)
    assert m["unfinished"] == 1 and m["unfinished_fraction"] == 1.0
    assert m["finished"] == 0 and m["throughput_rps"] == 0.0


def test_no_requests() -> None:
    m = run([])
    assert m["arrived"] == m["finished"] == m["unfinished"] == 0
    assert m["unfinished_fraction"] == 0.0
    assert math.isnan(float(m["e2e_p99"])) and math.isnan(float(m["ttft_mean"]))


def test_quantile_and_mean() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0  # unsorted input
    assert quantile([0.0, 10.0], 0.99) == pytest.approx(9.9)  # interpolated
    assert math.isnan(quantile([], 0.5)) and math.isnan(mean([]))
    assert mean([1.0, 2.0]) == 1.5
