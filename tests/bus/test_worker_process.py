"""The worker as a pod runs it (`python -m interlude_tools --config FILE`): the standard tools
and the file's tools are published and answer calls through the bus; a bad file stops it."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from redis.asyncio import Redis as AsyncRedis

from interlude.api.bus import CALL_STREAM, TOOL_GROUP, ToolCall, ToolResult
from interlude.bench.toolbus_rig import WorkerProcs
from interlude.bus import EngineBus
from interlude.bus.published import published
from interlude.engine.tools import ServerTools
from interlude_tools.registry import TEST_TOOLS


@contextlib.asynccontextmanager
async def engine_side(redis_url: str) -> AsyncIterator[tuple[AsyncRedis, ServerTools]]:
    """An engine's end of the bus (its Redis client and `ServerTools`), closed on the way out;
    `ServerTools.start` is the caller's, once its workers read."""
    redis = AsyncRedis.from_url(redis_url, decode_responses=True)
    tools = ServerTools(EngineBus(redis, "eng"), poll_ms=50)
    try:
        yield redis, tools
    finally:
        await tools.close()
        await redis.aclose()


CONFIG = """
[models]
simulated = true
time_scale = 0.001

[retrieval]
corpus_dir = "docs"
"""


def test_a_worker_process_runs_the_standard_and_declared_tools(
    redis_url: str, tmp_path: Path, make_call: Callable[..., ToolCall]
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "otters.md").write_text(
        "# Sea otters\n\nSea otters hold hands while they sleep so they do not drift apart.\n"
    )
    (tmp_path / "docs" / "basalt.md").write_text(
        "# Basalt\n\nBasalt is a dark volcanic rock formed from cooling lava.\n"
    )
    config = tmp_path / "tools.toml"
    config.write_text(CONFIG)
    procs = WorkerProcs(redis_url, tmp_path / "logs", config=config, log_level="INFO")

    async def scenario() -> tuple[set[str], list[str]]:
        async with engine_side(redis_url) as (redis, tools):
            try:
                procs.start("w1")
                await procs.wait_reading(redis, ["w1"], timeout_s=60)
                await tools.start()
                names = set(await published(redis))
                calls = [
                    make_call("r1", "retrieval", {"query": "why do otters hold hands", "k": 1}),
                    make_call("t1", "textworld", {"command": "look"}),
                    make_call("i1", "image", {"prompt": "a sea otter asleep"}),
                ]
                results = await asyncio.gather(*(tools.call(c) for c in calls))
                assert all(r.ok for r in results), [r.error for r in results]
                return names, [r.content for r in results]
            finally:
                procs.stop_all()

    names, (found, room, image) = asyncio.run(scenario())
    assert {"calculator", "retrieval", "textworld", "image", "tts"} <= names
    assert "otters.md" in found and "basalt" not in found.lower()
    assert room.strip() and "unknown" not in room.lower()
    assert image.startswith("image generated")


def test_the_test_tools_are_published_only_by_a_worker_started_for_tests(
    redis_url: str, tmp_path: Path, make_call: Callable[..., ToolCall]
) -> None:
    """`sleep` takes any delay and returns up to a million words: a production worker (no
    `--test-tools`, as the chart runs it) neither publishes nor runs it."""
    plain = WorkerProcs(redis_url, tmp_path / "plain")
    testing = WorkerProcs(redis_url, tmp_path / "testing", test_tools=True)

    async def names_once(redis: AsyncRedis, wanted: str) -> set[str]:
        async with asyncio.timeout(30):
            while wanted not in (names := set(await published(redis))):
                await asyncio.sleep(0.1)
        return names

    async def scenario() -> tuple[set[str], str, set[str]]:
        async with engine_side(redis_url) as (redis, tools):
            try:
                plain.start("plain")
                await plain.wait_reading(redis, ["plain"], timeout_s=60)
                await tools.start()
                production = await names_once(redis, "calculator")
                # Posted straight to the bus (an engine would not: it is not published).
                result = await tools.call(make_call("s1", "sleep", {"delay_s": 0, "tokens": 1}))
                plain.stop_all()
                testing.start("testing")
                return production, result.error, await names_once(redis, "sleep")
            finally:
                plain.stop_all()
                testing.stop_all()

    production, error, with_flag = asyncio.run(scenario())
    assert production.isdisjoint(TEST_TOOLS), production
    assert error.startswith("unknown_tool")
    assert set(TEST_TOOLS) <= with_flag


def test_a_bad_tools_file_stops_the_worker_with_the_key(tmp_path: Path, redis_url: str) -> None:
    config = tmp_path / "tools.toml"
    config.write_text('[retrieval]\ncorpus_dir = "docs"\nk = 3\n')
    done = subprocess.run(
        [sys.executable, "-m", "interlude_tools", "--redis-url", redis_url, "--config",
         str(config), "--metrics-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"{config}: retrieval.k: unknown key" in done.stderr


def test_sigterm_drains_what_fits_and_leaves_the_rest_pending_for_another_worker(
    redis_url: str,
    tmp_path: Path,
    make_call: Callable[..., ToolCall],
    collect: Callable[..., Awaitable[list[ToolResult]]],
) -> None:
    procs = WorkerProcs(
        redis_url, tmp_path / "logs", drain_timeout_s=1.0, log_level="INFO", test_tools=True
    )

    async def scenario() -> tuple[int, float, list[str], int, list[str]]:
        redis = AsyncRedis.from_url(redis_url, decode_responses=True)
        bus = EngineBus(redis, "eng")
        await bus.start()
        try:
            procs.start("w1")
            await procs.wait_reading(redis, ["w1"], timeout_s=60)
            short = make_call("short", "sleep", {"delay_s": 0.3, "tokens": 1}, ttl=30)
            long = make_call("long", "sleep", {"delay_s": 4.0, "tokens": 2}, ttl=30)
            await bus.submit(short)
            await bus.submit(long)
            await asyncio.sleep(0.2)  # both running when the pod is stopped
            t0 = time.monotonic()
            status = await asyncio.to_thread(procs.terminate, "w1")
            stopped_in = time.monotonic() - t0
            during = [d.result.call_id for d in await bus.fetch(block_ms=200)]
            summary = await redis.xpending(CALL_STREAM, TOOL_GROUP)
            # Another worker takes the abandoned call over once it has been idle long enough.
            procs.claim_idle_ms = 500
            procs.start("w2")
            later = [r.call_id for r in await collect(bus, 1, timeout=15)]
            return status, stopped_in, during, int(summary["pending"]), later
        finally:
            await bus.close()
            await redis.aclose()
            procs.stop_all()

    status, stopped_in, during, left_pending, later = asyncio.run(scenario())
    assert status == 0 and stopped_in < 4.0  # the drain timeout, not the long call, bounds it
    assert during == ["short"]  # finished within the drain, posted before the exit
    assert left_pending == 1  # the long call was not acknowledged: nothing was lost
    assert later == ["long"]
