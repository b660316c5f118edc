"""The engine's bus client over a real Redis: each result once, across duplicates and restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest
from redis.asyncio import Redis

from interlude.api.bus import CALL_STREAM, ENGINE_GROUP, ToolCall, ToolResult, result_stream
from interlude.bus import EngineBus
from interlude_tools import Worker

EngineFactory = Callable[..., AbstractAsyncContextManager[EngineBus]]
WorkerFactory = Callable[..., AbstractAsyncContextManager[Worker]]
Collect = Callable[..., Awaitable[list[ToolResult]]]
PostResult = Callable[[ToolResult], Awaitable[None]]
Pending = Callable[[str, str], Awaitable[int]]


def test_duplicate_results_are_delivered_once(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    collect: Collect,
    post_result: PostResult,
    pending: Pending,
) -> None:
    async def scenario() -> tuple[list[ToolResult], int, int]:
        async with open_engine() as bus:
            one, two = make_call("c1", "echo", {}), make_call("c2", "echo", {})
            for call, text in ((one, "first"), (one, "again"), (two, "other"), (one, "3rd")):
                await post_result(ToolResult.success(call, text, time.time()))
            results = await collect(bus, 2)
            results += [d.result for d in await bus.fetch(block_ms=100)]
            async with Redis.from_url(redis_url) as r:
                left = await r.xlen(result_stream("eng"))
            return results, left, await pending(result_stream("eng"), ENGINE_GROUP)

    results, left, still_pending = asyncio.run(scenario())
    assert [(r.call_id, r.content) for r in results] == [("c1", "first"), ("c2", "other")]
    assert left == 0 and still_pending == 0


def test_engine_restart_gets_results_that_arrived_while_down(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    async def scenario() -> list[ToolResult]:
        async with open_engine() as bus:
            await bus.submit(make_call("c1", "echo", {"text": "while you were out"}))
        async with open_worker():
            async with asyncio.timeout(1.5):
                async with Redis.from_url(redis_url) as r:
                    while not await r.xlen(result_stream("eng")):
                        await asyncio.sleep(0.02)
        async with open_engine() as restarted:
            return await collect(restarted, 1)

    [result] = asyncio.run(scenario())
    assert (result.call_id, result.content) == ("c1", "while you were out")


def test_engine_restart_rereads_what_it_had_not_acknowledged(
    make_call: Callable[..., ToolCall], open_engine: EngineFactory, post_result: PostResult
) -> None:
    async def scenario() -> tuple[list[str], list[str], list[str]]:
        call = make_call("c1", "echo", {})
        async with open_engine() as first:
            await post_result(ToolResult.success(call, "hello", time.time()))
            seen_first = [d.result.call_id for d in await first.fetch(block_ms=100)]
            # ...and the engine dies before acknowledging.
        async with open_engine() as second:
            deliveries = await second.fetch(block_ms=100)
            await second.ack(*deliveries)
        async with open_engine() as third:
            seen_third = [d.result.call_id for d in await third.fetch(block_ms=100)]
        return seen_first, [d.result.call_id for d in deliveries], seen_third

    first, second, third = asyncio.run(scenario())
    assert (first, second, third) == (["c1"], ["c1"], [])


def test_results_iterator_acknowledges_when_the_next_is_asked(
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    post_result: PostResult,
    pending: Pending,
) -> None:
    async def scenario() -> tuple[str, int, str, int]:
        async with open_engine() as bus:
            for cid in ("c1", "c2"):
                await post_result(ToolResult.success(make_call(cid, "echo", {}), cid, 1))
            stream = bus.results(block_ms=50)
            first = await anext(stream)
            held = await pending(result_stream("eng"), ENGINE_GROUP)
            second = await anext(stream)
            after = await pending(result_stream("eng"), ENGINE_GROUP)
            await stream.aclose()
            return first.call_id, held, second.call_id, after

    # Both were read in one batch; c1 is acknowledged only once c2 is asked for.
    assert asyncio.run(scenario()) == ("c1", 2, "c2", 1)


def test_expire_answers_a_silent_call_and_drops_the_late_result(
    make_call: Callable[..., ToolCall], open_engine: EngineFactory, post_result: PostResult
) -> None:
    call = make_call("c1", "sleep", {"delay_s": 0}, ttl=0.05)

    async def scenario() -> tuple[ToolResult | None, ToolResult | None, list[ToolResult]]:
        async with open_engine() as bus:
            await bus.submit(call)
            with pytest.raises(ValueError, match="not past its deadline"):
                bus.expire(call, call.deadline - 1)
            assert bus.expire_overdue(call.deadline + 0.5, grace_s=1.0) == []
            [timeout] = bus.expire_overdue(call.deadline + 2, grace_s=1.0)
            again = bus.expire(call, call.deadline + 3)
            await post_result(ToolResult.success(call, "too late", time.time()))
            return timeout, again, [d.result for d in await bus.fetch(block_ms=100)]

    timeout, again, delivered = asyncio.run(scenario())
    assert timeout is not None and timeout.error_kind == "timeout" and timeout.trace == call.trace
    assert again is None and delivered == []


def test_submit_refuses_another_engines_call(
    make_call: Callable[..., ToolCall], open_engine: EngineFactory
) -> None:
    async def scenario() -> None:
        async with open_engine("other") as bus:
            await bus.submit(make_call("c1", "echo", {}))

    with pytest.raises(ValueError, match="another engine"):
        asyncio.run(scenario())


def test_the_call_stream_is_capped_when_no_worker_reads_it(
    redis_url: str, make_call: Callable[..., ToolCall]
) -> None:
    async def scenario() -> int:
        redis = Redis.from_url(redis_url, decode_responses=True)
        bus = EngineBus(redis, "eng", call_stream_maxlen=100)
        try:
            for i in range(1000):
                await bus.submit(make_call(f"c{i}", "calculator", {"expression": "1"}))
            return int(await redis.xlen(CALL_STREAM))
        finally:
            await redis.aclose()

    length = asyncio.run(scenario())
    # Approximate trimming (MAXLEN ~) drops whole nodes of entries: about the cap, never all.
    assert 100 <= length < 300


def test_a_read_whose_reply_was_lost_is_recovered_by_the_pending_rescan(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    post_result: PostResult,
    pending: Pending,
) -> None:
    """A read the server served but the client never saw (its reply lost with a dropped
    connection, the command retried by redis-py) leaves the entry pending on the engine's
    consumer: only a re-read of the pending list hands it out. What is handed out and not
    yet acknowledged stays pending through a rescan, and is not counted as a duplicate."""

    async def scenario(rescan_s: float) -> tuple[list[str], list[str], int, int]:
        async with Redis.from_url(redis_url, decode_responses=True) as redis:
            await redis.flushall()
            bus = EngineBus(redis, "eng", rescan_s=rescan_s)
            await bus.start()
            assert await bus.fetch(block_ms=10) == []  # the first life's pending list: empty
            held = make_call("held", "echo", {})
            await post_result(ToolResult.success(held, "held", time.time()))
            [kept] = await bus.fetch(block_ms=100)  # handed out, not acknowledged yet
            lost = make_call("lost", "echo", {})
            await post_result(ToolResult.success(lost, "lost", time.time()))
            # The read whose reply never reached the bus.
            await redis.xreadgroup(ENGINE_GROUP, "eng", {result_stream("eng"): ">"}, count=10)
            await asyncio.sleep(0.02)
            got = [d.result.call_id for d in await bus.fetch(block_ms=50)]
            await bus.ack(kept)
            left = await pending(result_stream("eng"), ENGINE_GROUP)
            return [kept.result.call_id], got, bus.duplicates, left

    assert asyncio.run(scenario(rescan_s=0.01)) == (["held"], ["lost"], 0, 1)
    # Without the rescan the lost entry is stranded: never handed out, pending for good.
    assert asyncio.run(scenario(rescan_s=3600)) == (["held"], [], 0, 1)


def test_a_result_whose_ack_failed_is_acknowledged_by_the_pending_rescan(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    post_result: PostResult,
    pending: Pending,
) -> None:
    """The engine's reader hands a result to its session, then acknowledges it; if Redis is
    away for that ack the reader moves on, so the bus itself must clear the entry when its
    pending rescan meets it again (without handing it out twice), or it stays for good."""

    async def scenario() -> tuple[list[str], int, int, int]:
        async with Redis.from_url(redis_url, decode_responses=True) as redis:
            await redis.flushall()
            bus = EngineBus(redis, "eng", rescan_s=0.01)
            await bus.start()
            call = make_call("c1", "echo", {})
            await post_result(ToolResult.success(call, "once", time.time()))
            [delivery] = await bus.fetch(block_ms=100)
            real = redis.pipeline

            def failing(*args: object, **kwargs: object) -> object:
                pipe = real(*args, **kwargs)

                async def lost() -> None:
                    raise ConnectionError("Redis went away")

                pipe.execute = lost  # type: ignore[method-assign]
                return pipe

            redis.pipeline = failing  # type: ignore[method-assign]
            with pytest.raises(ConnectionError):
                await bus.ack(delivery)
            redis.pipeline = real  # type: ignore[method-assign]
            left_after_failure = await redis.xlen(result_stream("eng"))
            await asyncio.sleep(0.02)
            again = [d.result.call_id for d in await bus.fetch(block_ms=50)]
            left = await redis.xlen(result_stream("eng"))
            still = await pending(result_stream("eng"), ENGINE_GROUP)
            return again, left_after_failure, left, still

    again, left_after_failure, left, still_pending = asyncio.run(scenario())
    assert left_after_failure == 1  # the failed ack left it on the stream
    assert again == [] and left == 0 and still_pending == 0
