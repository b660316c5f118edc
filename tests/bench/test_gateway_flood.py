"""`bench gateway --flood`: wrong-secret requests for a real key id reach a real gateway (in
front of the echo engine) from many loopback addresses while both arms are measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interlude.bench.flood import ADDRESSES
from interlude.bench.gateway_run import echo_rows


def test_a_flood_is_answered_401_per_address_while_the_callers_are_served(tmp_path: Path) -> None:
    ticks: list[dict[str, Any]] = []
    rows = echo_rows(tmp_path, [20.0], 2.0, lambda _rate, row: ticks.append(row), flood=100.0)
    plain, flooded = rows
    assert ticks == rows
    assert plain["flood_rate"] == 0 and plain["flood_answers"] == {}
    assert flooded["flood_rate"] == 100
    answers = flooded["flood_answers"]
    # Under 20 tries per address: each one is checked against the key and refused, not
    # turned away unread by the per-address limit (that would measure only the cheap 429).
    assert set(answers) == {"401"} and answers["401"] > ADDRESSES / 2
    for row in rows:
        assert row["errors"] == 0 and row["requests"] > 10
        assert row["in_gateway_p50_ms"] > 0
        # The gateway's own CPU, read from /proc, per request it answered.
        assert row["gateway_cpu_s"] > 0 and row["gateway_cpu_ms_per_request"] > 0
    # Five times the requests (the flood's included) cost the gateway more CPU.
    assert flooded["gateway_cpu_s"] > plain["gateway_cpu_s"]


def test_streamed_echo_answers_are_relayed_whole_and_metered(tmp_path: Path) -> None:
    (row,) = echo_rows(tmp_path, [20.0], 2.0, lambda _rate, _row: None, tokens=20)
    # Every answer, direct or relayed, ended with its [DONE] (else it counts as an error).
    assert row["errors"] == 0 and row["requests"] > 10 and row["tokens"] == 20
    assert row["gateway_cpu_ms_per_request"] > 0
