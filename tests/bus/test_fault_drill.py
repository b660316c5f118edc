"""The fault drill (`interlude bench toolbus-faults`), smaller: workers SIGKILLed at random, the
server restarted once (AOF on), a poison call; exactly one right result per call."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from interlude.api.bus import CALL_STREAM, TOOL_GROUP, result_stream
from interlude.bench.toolbus_faults import (
    ENGINE,
    DrillReport,
    DrillSpec,
    count_left_over,
    report_lines,
    run_drill,
)
from interlude.bus.streams import connect, ensure_group


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


def test_what_is_left_counts_only_once_the_bus_has_gone_quiet(redis_url: str) -> None:
    """The engine deletes a result one round trip after handing it out: an entry deleted
    within the settle time is not left over, one that stays is (and waiting ends at once
    when nothing is left)."""

    async def scenario() -> tuple[DrillReport, DrillReport, float]:
        redis = connect(redis_url)
        try:
            await ensure_group(redis, CALL_STREAM, TOOL_GROUP)
            stream = result_stream(ENGINE)
            acked_soon = await redis.xadd(stream, {"v": "1"})

            async def delete_later() -> None:
                await asyncio.sleep(0.3)
                await redis.xdel(stream, acked_soon)

            deleting = asyncio.create_task(delete_later())
            quiet = DrillReport()
            started = time.monotonic()
            await count_left_over(redis, quiet, settle_s=3.0)
            waited = time.monotonic() - started
            await deleting
            await redis.xadd(stream, {"v": "1"})
            stuck = DrillReport()
            await count_left_over(redis, stuck, settle_s=0.2)
            return quiet, stuck, waited
        finally:
            await redis.aclose()

    quiet, stuck, waited = asyncio.run(scenario())
    assert quiet.results_left_at_end == 0 and quiet.problems() == []
    assert 0.25 <= waited < 2.0  # it waited for the delete, and stopped once the stream was empty
    assert stuck.results_left_at_end == 1
    assert stuck.problems() == ["1 results left on the engine's stream"]
