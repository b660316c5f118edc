"""The fault drill (`interlude bench toolbus-faults`), smaller: workers SIGKILLed at random, the
server restarted once (AOF on), a poison call; exactly one right result per call."""

from __future__ import annotations

import logging
from pathlib import Path

from interlude.bench.toolbus_faults import DrillSpec, report_lines, run_drill


def test_every_call_gets_exactly_one_result_through_kills_a_restart_and_a_poison_call(
    tmp_path: Path,
) -> None:
    logging.getLogger("interlude").setLevel(logging.ERROR)  # the reconnect warnings are expected
    spec = DrillSpec(calls=1200, rate=300, workers=3, kills=3)
    report = run_drill(spec, tmp_path, lambda line: None)
    print("\n".join(report_lines(report)))  # shown with -s, and on failure
    assert report.problems() == []
    assert report.results_per_call == {1: 1200} and report.correct == 1200
    # The faults happened and hit work in flight: calls were pending on the killed workers,
    # and the poison call killed workers until it was dead-lettered.
    assert report.killed == 3 and report.server_restarts == 1
    assert report.stranded > 0
    assert report.restarts > report.killed
    assert report.dead_letters == 1 and "dead-letter" in report.poison_result
    # The done key kept every call to one post: the engine had nothing to drop.
    assert report.duplicates_dropped == 0
    assert report.results_left_at_end == 0
