"""Delivery under faults, on a Valkey of the test's own that it stops and restarts (AOF on):
the engine's reader outlives the server, a call never waits past its deadline, a failed post
is retried without running the tool again, a submit is queued once, and a tool that blocks
the event loop keeps its call."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis as AsyncRedis

from interlude.api.bus import CALL_STREAM, DEAD_LETTER_STREAM, TOOL_GROUP, ToolCall
from interlude.bus import EngineBus
from interlude.bus.streams import stream_entries
from interlude.engine.tools import ServerTools
from interlude.stack.valkey import Valkey
from interlude_tools import Registry, Worker, default_registry
from interlude_tools.context import current_call
from interlude_tools.registry import Tool
from interlude_tools.worker import _plan_claims


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[Valkey]:
    server = Valkey(tmp_path / "valkey")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def started_tools(url: str, **options: Any) -> tuple[ServerTools, AsyncRedis]:
    redis = AsyncRedis.from_url(url, decode_responses=True, socket_timeout=1)
    tools = ServerTools(EngineBus(redis, "eng"), poll_ms=50, max_backoff_s=0.2, **options)
    await tools.start()
    return tools, redis


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


def test_the_reader_outlives_a_server_restart_and_calls_keep_their_deadline(
    own_valkey: Valkey, make_call: Callable[..., ToolCall]
) -> None:
    async def scenario() -> None:
        tools, redis = await started_tools(own_valkey.url, grace_s=0.2)
        worker_redis = AsyncRedis.from_url(own_valkey.url, decode_responses=True)
        worker = Worker(worker_redis, "w1", default_registry(test_tools=True), block_ms=50)
        running = asyncio.create_task(worker.run())
        try:
            first = await tools.call(make_call("c1", "calculator", {"expression": "6*7"}))
            assert first.ok and first.content == "42"
            await asyncio.to_thread(own_valkey.stop)
            await until(lambda: not tools.connected)
            # The server is down: the call cannot even be queued. It still ends, as a timeout
            # result, by its deadline (plus the grace), not whenever Redis comes back.
            t0 = time.monotonic()
            lost = await tools.call(make_call("c2", "calculator", {"expression": "1+1"}, ttl=0.6))
            assert not lost.ok and lost.error.startswith("timeout")
            assert time.monotonic() - t0 < 0.6 + 0.2 + 1.0
            await asyncio.to_thread(own_valkey.start)
            await until(lambda: tools.connected)
            # Both sides' pooled connections died with the server: each retries, and the call
            # is answered, not left for a reclaim.
            again = await tools.call(make_call("c3", "calculator", {"expression": "2**10"}))
            assert again.ok and again.content == "1024"
        finally:
            worker.stop()
            await asyncio.wait_for(running, 5)
            await worker_redis.aclose()
            await tools.close()
            await redis.aclose()

    asyncio.run(scenario())


def test_a_call_ends_by_its_deadline_when_the_server_hangs(
    own_valkey: Valkey, make_call: Callable[..., ToolCall]
) -> None:
    """SIGSTOP: the socket stays open and nothing answers (a partition without a reset). With
    no socket timeout, as the bus's own client has none, the submit would wait for the server
    forever; the call still ends, as a timeout result, by its deadline."""
    import os
    import signal

    async def scenario() -> None:
        redis = AsyncRedis.from_url(own_valkey.url, decode_responses=True)
        tools = ServerTools(EngineBus(redis, "eng"), poll_ms=50, max_backoff_s=0.2, grace_s=0.2)
        await tools.start()
        assert own_valkey.proc is not None
        os.kill(own_valkey.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            lost = await tools.call(make_call("h1", "calculator", {"expression": "1+1"}, ttl=0.6))
            assert not lost.ok and lost.error.startswith("timeout")
            assert time.monotonic() - t0 < 0.6 + 0.2 + 1.0
        finally:
            os.kill(own_valkey.proc.pid, signal.SIGCONT)
            await tools.close()
            await redis.aclose()

    asyncio.run(scenario())


def test_an_engine_starts_without_its_bus_and_connects_when_it_comes(
    own_valkey: Valkey, make_call: Callable[..., ToolCall]
) -> None:
    async def scenario() -> None:
        await asyncio.to_thread(own_valkey.stop)
        # Redis is away at start: the engine's tools start anyway (it serves meanwhile).
        tools, redis = await started_tools(own_valkey.url, grace_s=0.2)
        worker_redis = AsyncRedis.from_url(own_valkey.url, decode_responses=True)
        worker = Worker(worker_redis, "w1", default_registry(test_tools=True), block_ms=50)
        running: asyncio.Task[None] | None = None
        try:
            assert not tools.connected
            await asyncio.to_thread(own_valkey.start)
            await until(lambda: tools.connected)  # the reader made the result stream itself
            running = asyncio.create_task(worker.run())
            result = await tools.call(make_call("c1", "calculator", {"expression": "6*7"}))
            assert result.ok and result.content == "42"
        finally:
            worker.stop()
            if running is not None:
                await asyncio.wait_for(running, 5)
            await worker_redis.aclose()
            await tools.close()
            await redis.aclose()

    asyncio.run(scenario())


class Outage(Tool):
    """Stops the server while it runs and starts it again a moment later: the worker's post
    of its result meets a dead server."""

    name = "outage"
    description = "takes Redis down for a moment"
    server: ClassVar[Valkey | None] = None
    runs: ClassVar[int] = 0

    async def run(self, arguments: dict[str, Any]) -> str:
        Outage.runs += 1
        assert Outage.server is not None
        await asyncio.to_thread(Outage.server.stop)
        asyncio.get_running_loop().call_later(0.5, lambda: asyncio.ensure_future(restart()))
        return "ran once"


async def restart() -> None:
    assert Outage.server is not None
    await asyncio.to_thread(Outage.server.start)


def test_a_failed_post_is_retried_without_running_the_tool_again(
    own_valkey: Valkey, make_call: Callable[..., ToolCall]
) -> None:
    Outage.server, Outage.runs = own_valkey, 0

    async def scenario() -> tuple[str, int]:
        tools, redis = await started_tools(own_valkey.url)
        worker_redis = AsyncRedis.from_url(own_valkey.url, decode_responses=True)
        worker = Worker(worker_redis, "w1", Registry([Outage()]), block_ms=50)
        running = asyncio.create_task(worker.run())
        try:
            result = await tools.call(make_call("c1", "outage", {}, ttl=15))
            worker.stop()
            await asyncio.wait_for(running, 5)
            return result.content, worker.redis_retries
        finally:
            await tools.close()
            await redis.aclose()
            await worker_redis.aclose()

    content, retries = asyncio.run(scenario())
    assert content == "ran once" and Outage.runs == 1
    assert retries >= 1  # the post did meet the outage


def test_a_retried_submit_queues_the_call_once(
    redis_url: str, make_call: Callable[..., ToolCall], open_engine: Any
) -> None:
    async def scenario() -> tuple[str, str, int]:
        async with open_engine() as bus:
            call = make_call("c1", "calculator", {"expression": "1"})
            first = await bus.submit(call)
            second = await bus.submit(call)  # as after a reply lost on the wire
            async with AsyncRedis.from_url(redis_url) as r:
                return first, second, await r.xlen(CALL_STREAM)

    first, second, length = asyncio.run(scenario())
    assert first and second == "" and length == 1


class Blocking(Tool):
    """Blocks the worker's event loop (a synchronous library call in an async tool)."""

    name = "blocking"
    description = "sleeps without yielding"
    runs: ClassVar[int] = 0

    async def run(self, arguments: dict[str, Any]) -> str:
        Blocking.runs += 1
        time.sleep(0.6)
        return "done"


def test_a_tool_that_blocks_the_loop_keeps_its_call(
    make_call: Callable[..., ToolCall], open_engine: Any, open_worker: Any, collect: Any
) -> None:
    Blocking.runs = 0

    async def scenario() -> list[str]:
        # Blocked 0.6 s, four times the 150 ms claim threshold: without the heartbeat's own
        # thread the other worker would take the call over and run it again.
        async with (
            open_engine() as bus,
            open_worker("a", Registry([Blocking()]), claim_idle_ms=150),
            open_worker("b", Registry([Blocking()]), claim_idle_ms=150),
        ):
            await bus.submit(make_call("c1", "blocking", {}))
            results = await collect(bus, 1, timeout=5)
            await asyncio.sleep(0.5)
            results += [d.result for d in await bus.fetch(block_ms=100)]
            return [r.call_id for r in results]

    assert asyncio.run(scenario()) == ["c1"]
    assert Blocking.runs == 1


def test_a_poison_call_ends_in_the_dead_letter_stream_with_an_error_result(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: Any,
    open_worker: Any,
    collect: Any,
    pending: Any,
) -> None:
    Blocking.runs = 0

    async def scenario() -> tuple[list[Any], list[Any], int, int]:
        async with open_engine() as bus:
            await bus.submit(make_call("c1", "blocking", {}))
            async with AsyncRedis.from_url(redis_url, decode_responses=True) as r:
                await r.xgroup_create(CALL_STREAM, TOOL_GROUP, id="0")
                # Six workers took the call and died running it: one read, five takeovers
                # (XCLAIM without JUSTID counts a delivery, as XAUTOCLAIM does).
                got = await r.xreadgroup(TOOL_GROUP, "dead0", {CALL_STREAM: ">"}, count=1)
                entry_id = stream_entries(got)[0][0]
                for k in range(1, 6):
                    await r.xclaim(CALL_STREAM, TOOL_GROUP, f"dead{k}", 0, [entry_id])
                async with open_worker("rescuer", Registry([Blocking()]), max_deliveries=5) as w:
                    results = await collect(bus, 1, timeout=5)
                    dead = await r.xrange(DEAD_LETTER_STREAM)
                    left = await pending(CALL_STREAM, TOOL_GROUP)
                    return results, dead, left, w.dead_lettered

    results, dead, left, dead_lettered = asyncio.run(scenario())
    (result,) = results
    assert result.call_id == "c1" and not result.ok
    assert result.error.startswith("tool_error") and "dead-letter" in result.error
    (entry,) = dead
    assert entry[1]["deliveries"] == "7" and entry[1]["worker"] == "rescuer"
    assert json.loads(entry[1]["fields"])["v"]  # the call as it was queued, for a person
    assert left == 0 and dead_lettered == 1
    assert Blocking.runs == 0  # the poison was never run again


def test_a_worker_refuses_max_deliveries_below_one(redis_url: str) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        registry = default_registry(test_tools=True)
        Worker(AsyncRedis.from_url(redis_url), "w", registry, max_deliveries=0)


class Probe(Tool):
    """Sleeps a little and records when each call ran (its id is the call's session)."""

    name = "probe"
    description = "records its runs"
    spans: ClassVar[dict[str, tuple[float, float]]] = {}

    async def run(self, arguments: dict[str, Any]) -> str:
        started = time.monotonic()
        await asyncio.sleep(0.15)
        Probe.spans[current_call().call_id] = (started, time.monotonic())
        return "ok"


def test_calls_that_were_in_flight_in_two_dead_workers_run_alone(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: Any,
    open_worker: Any,
    collect: Any,
) -> None:
    """Three calls each delivered three times (read, then taken over twice by workers that
    died), and three fresh ones: the suspects run one at a time with nothing beside them."""
    Probe.spans = {}

    async def scenario() -> list[Any]:
        async with open_engine() as bus:
            for i in range(3):
                await bus.submit(make_call(f"suspect{i}", "probe", {}))
            async with AsyncRedis.from_url(redis_url, decode_responses=True) as r:
                await r.xgroup_create(CALL_STREAM, TOOL_GROUP, id="0")
                got = await r.xreadgroup(TOOL_GROUP, "dead0", {CALL_STREAM: ">"}, count=3)
                ids = [entry_id for entry_id, _ in stream_entries(got)]
                for k in (1, 2):
                    await r.xclaim(CALL_STREAM, TOOL_GROUP, f"dead{k}", 0, ids)
            for i in range(3):
                await bus.submit(make_call(f"fresh{i}", "probe", {}))
            async with open_worker("w", Registry([Probe()]), claim_idle_ms=50):
                return await collect(bus, 6, timeout=10)

    results = asyncio.run(scenario())
    assert sorted(r.call_id for r in results if r.ok) == sorted(Probe.spans) and len(results) == 6
    for sid in ("suspect0", "suspect1", "suspect2"):
        start, end = Probe.spans[sid]
        others = [span for cid, span in Probe.spans.items() if cid != sid]
        assert all(e <= start or s >= end for s, e in others), (sid, Probe.spans)


def test_a_reclaim_plans_one_suspect_at_most_and_ordinary_calls_up_to_the_free_slots() -> None:
    def row(entry_id: str, delivered: int) -> dict[str, Any]:
        return {"message_id": entry_id, "times_delivered": delivered}

    idle = [row("1-0", 1), row("2-0", 2), row("3-0", 4), row("4-0", 5), row("5-0", 1)]
    idle += [row("6-0", 3), row("7-0", 1)]
    # Counts once claimed: 2, 3 (suspect), 5 (suspect), 6 (dead letter), 2, 4 (suspect), 2.
    plan = _plan_claims(idle, free=2, max_deliveries=5, inflight={"5-0": None})
    assert plan == {"1-0": 2, "2-0": 3, "4-0": 6, "7-0": 2}
