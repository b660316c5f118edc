"""Tool workers end to end over a real Redis: results, failures, crashes and reclaims.

Tests are sync and drive their coroutines with `asyncio.run` (no pytest-asyncio). Workers poll
with short blocks and claim thresholds (see `open_worker`) so each test takes well under 2 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from interlude.api.bus import CALL_STREAM, TOOL_GROUP, ToolCall, ToolResult, done_key, result_stream
from interlude.bus import EngineBus
from interlude_tools import Registry, Tool, Worker
from interlude_tools.registry import default_registry

EngineFactory = Callable[..., AbstractAsyncContextManager[EngineBus]]
WorkerFactory = Callable[..., AbstractAsyncContextManager[Worker]]
Collect = Callable[..., Awaitable[list[ToolResult]]]
PostResult = Callable[[ToolResult], Awaitable[None]]
Pending = Callable[[str, str], Awaitable[int]]


class Counting(Tool):
    """Sleeps `delay` s and records how many runs overlap, and how many ran in all."""

    name = "counting"
    description = "test tool"
    runs: ClassVar[int] = 0
    active: ClassVar[int] = 0
    peak: ClassVar[int] = 0

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay

    async def run(self, arguments: dict[str, Any]) -> str:
        cls = type(self)
        cls.runs += 1
        cls.active += 1
        cls.peak = max(cls.peak, cls.active)
        try:
            await asyncio.sleep(self.delay)
        finally:
            cls.active -= 1
        return "counted"


@pytest.fixture(autouse=True)
def _reset_counting() -> None:
    Counting.runs = Counting.active = Counting.peak = 0


@pytest.mark.parametrize("redis_options", [{}, {"protocol": 3}, {"decode_responses": False}])
def test_calculator_round_trip(
    redis_url: str,
    redis_options: dict[str, Any],
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
    pending: Pending,
) -> None:
    async def scenario() -> tuple[ToolResult, int, int, int, int]:
        async with open_engine(**redis_options) as bus, open_worker(result_ttl_s=600):
            call = make_call("c1", "calculator", {"expression": "2*(3+4)"})
            await bus.submit(call)
            [result] = await collect(bus, 1)
            async with Redis.from_url(redis_url) as r:
                lengths = await r.xlen(CALL_STREAM), await r.xlen(result_stream("eng"))
                ttl = await r.ttl(result_stream("eng"))
            return result, *lengths, await pending(CALL_STREAM, TOOL_GROUP), ttl

    result, calls_left, results_left, calls_pending, ttl = asyncio.run(scenario())
    assert result.ok and result.content == "14" and result.error == ""
    assert (result.call_id, result.session_id, result.engine_id) == ("c1", "s-c1", "eng")
    # Both streams are queues: acknowledged entries are deleted.
    assert (calls_left, results_left, calls_pending) == (0, 0, 0)
    # An engine that never comes back does not leave its result stream behind for good.
    assert 0 < ttl <= 600


def test_trace_context_travels_unchanged(
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    traces = {
        "ok": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        "bad": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
        },
    }

    async def scenario() -> list[ToolResult]:
        async with open_engine() as bus, open_worker():
            await bus.submit(make_call("ok", "echo", {"text": "hi"}, trace=traces["ok"]))
            await bus.submit(make_call("bad", "fail", {}, trace=traces["bad"]))
            return await collect(bus, 2)

    results = asyncio.run(scenario())
    assert sorted(r.call_id for r in results) == ["bad", "ok"]
    # Failures carry the context too: the trace of a failed tool call must not break off. A
    # result names the tool's span (or, untraced, the call's own): the same trace either way.
    for r in results:
        trace_id = traces[r.call_id]["traceparent"].split("-")[1]
        assert r.trace["traceparent"].split("-")[1] == trace_id


def test_tool_past_its_deadline_times_out(
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    async def scenario() -> tuple[ToolResult, float]:
        async with open_engine() as bus, open_worker():
            started = time.monotonic()
            await bus.submit(make_call("slow", "sleep", {"delay_s": 5, "tokens": 3}, ttl=0.2))
            [result] = await collect(bus, 1)
            return result, time.monotonic() - started

    result, elapsed = asyncio.run(scenario())
    assert not result.ok and result.error_kind == "timeout", result.error
    assert "deadline" in result.error
    assert elapsed < 1.0


def test_call_past_its_deadline_on_arrival_is_not_run(
    open_engine: EngineFactory, open_worker: WorkerFactory, collect: Collect
) -> None:
    async def scenario() -> ToolResult:
        async with open_engine() as bus:
            now = time.time()
            late = ToolCall("late", "s", "eng", "counting", {}, now - 1, {}, now - 2)
            await bus.submit(late)
            registry = Registry([Counting()])
            async with open_worker(registry=registry):
                [result] = await collect(bus, 1)
                return result

    result = asyncio.run(scenario())
    assert result.error_kind == "timeout" and "before the call started" in result.error
    assert Counting.runs == 0


@pytest.mark.parametrize(
    ("tool", "arguments", "kind", "says"),
    [
        ("fail", {"message": "boom"}, "tool_error", "RuntimeError: boom"),
        ("calculator", {"expression": "1/0"}, "tool_error", "ZeroDivisionError"),
        ("nope", {}, "unknown_tool", "'nope'"),
        ("calculator", {"expression": "__import__('os')"}, "bad_arguments", "not allowed"),
        ("calculator", {"expr": "1"}, "bad_arguments", "'expression'"),
        ("scripted", {"delay_s": 0, "tokens": -1}, "bad_arguments", "'tokens'"),
    ],
)
def test_failures_become_results(
    tool: str,
    arguments: dict[str, Any],
    kind: str,
    says: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    async def scenario() -> ToolResult:
        async with open_engine() as bus, open_worker():
            await bus.submit(make_call("f", tool, arguments))
            [result] = await collect(bus, 1)
            return result

    result = asyncio.run(scenario())
    assert not result.ok and result.content == ""
    assert result.error_kind == kind and says in result.error, result.error


def test_concurrency_is_bounded(
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    async def scenario() -> list[ToolResult]:
        async with open_engine() as bus:
            for i in range(6):
                await bus.submit(make_call(f"c{i}", "counting", {}))
            registry = Registry([Counting()])
            async with open_worker(registry=registry, concurrency=2):
                return await collect(bus, 6)

    results = asyncio.run(scenario())
    assert sorted(r.call_id for r in results) == [f"c{i}" for i in range(6)]
    assert Counting.runs == 6 and Counting.peak == 2


def test_dead_workers_call_is_reclaimed_and_answered_once(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
    pending: Pending,
) -> None:
    async def scenario() -> tuple[list[ToolResult], int, int]:
        async with open_engine() as bus:
            await bus.submit(make_call("c1", "calculator", {"expression": "6*7"}))
            async with Redis.from_url(redis_url) as r:
                await r.xgroup_create(CALL_STREAM, TOOL_GROUP, id="0")
                # The "dead" worker reads the call and never acknowledges it.
                got = await r.xreadgroup(TOOL_GROUP, "dead", {CALL_STREAM: ">"}, count=1)
                assert got, "the dead worker should have read the call"
            async with open_worker("rescuer", claim_idle_ms=100) as worker:
                results = await collect(bus, 1)
                await asyncio.sleep(0.3)  # room for a wrong second answer
                results += [d.result for d in await bus.fetch()]
                return results, worker.posted, await pending(CALL_STREAM, TOOL_GROUP)

    results, posted, still_pending = asyncio.run(scenario())
    assert [(r.call_id, r.content) for r in results] == [("c1", "42")]
    assert posted == 1 and still_pending == 0


def test_reclaimed_call_already_answered_is_not_answered_again(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
    post_result: PostResult,
    pending: Pending,
) -> None:
    async def scenario() -> tuple[list[ToolResult], Worker]:
        async with open_engine() as bus:
            call = make_call("c1", "counting", {})
            await bus.submit(call)
            async with Redis.from_url(redis_url) as r:
                await r.xgroup_create(CALL_STREAM, TOOL_GROUP, id="0")
                await r.xreadgroup(TOOL_GROUP, "dead", {CALL_STREAM: ">"}, count=1)
                # The dead worker posted its result and marked the call done, then died
                # before acknowledging the call.
                answer = ToolResult.success(call, "from the dead worker", time.time())
                await post_result(answer)
                await r.set(done_key(call.call_id), "dead", ex=60)
            async with open_worker("rescuer", Registry([Counting()]), claim_idle_ms=100) as worker:
                async with asyncio.timeout(1.5):
                    while await pending(CALL_STREAM, TOOL_GROUP):
                        await asyncio.sleep(0.02)
                results = await collect(bus, 1)
                results += [d.result for d in await bus.fetch(block_ms=100)]
                return results, worker

    results, worker = asyncio.run(scenario())
    assert [r.content for r in results] == ["from the dead worker"]
    assert Counting.runs == 0 and worker.posted == 0 and worker.skipped == 1


def test_live_workers_long_call_is_not_stolen(
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    async def scenario() -> list[ToolResult]:
        async with open_engine() as bus:
            # The threshold leaves a loaded 2-core machine room for the heartbeat's own delays.
            slow = Registry([Counting(delay=1.25)])
            async with (
                open_worker("a", slow, claim_idle_ms=250),
                open_worker("b", Registry([Counting(delay=1.25)]), claim_idle_ms=250),
            ):
                await bus.submit(make_call("c1", "counting", {}))
                results = await collect(bus, 1)
                results += [d.result for d in await bus.fetch(block_ms=200)]
                return results

    results = asyncio.run(scenario())
    assert [r.call_id for r in results] == ["c1"]
    # Running 1.25 s, five times the claim threshold: the heartbeat kept it from a second run.
    assert Counting.runs == 1


def test_undecodable_calls_are_acknowledged_and_skipped(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
    pending: Pending,
) -> None:
    async def scenario() -> tuple[list[ToolResult], Worker, int]:
        async with open_engine() as bus:
            async with Redis.from_url(redis_url) as r:
                await r.xadd(CALL_STREAM, {"v": "1", "body": "{nope"})
                await r.xadd(CALL_STREAM, {"v": "9", "body": "{}"})
                await r.xadd(CALL_STREAM, {"unrelated": "x"})
            await bus.submit(make_call("good", "echo", {"text": "fine"}))
            async with open_worker() as worker:
                results = await collect(bus, 1)
            return results, worker, await pending(CALL_STREAM, TOOL_GROUP)

    results, worker, still_pending = asyncio.run(scenario())
    assert [r.content for r in results] == ["fine"]
    assert worker.skipped == 3 and worker.posted == 1 and still_pending == 0


def test_stop_drains_and_cancel_leaves_the_call_pending(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    pending: Pending,
) -> None:
    async def scenario() -> tuple[list[ToolResult], int]:
        async with open_engine() as bus:
            await bus.submit(make_call("drained", "sleep", {"delay_s": 0.2, "tokens": 2}))
            async with open_worker("w1"):
                await asyncio.sleep(0.1)  # the call is running when stop() comes
            drained = [d.result for d in await bus.fetch(block_ms=100)]
            await bus.submit(make_call("abandoned", "sleep", {"delay_s": 5}))
            redis = Redis.from_url(redis_url, decode_responses=True)
            worker = Worker(redis, "w2", default_registry(test_tools=True), block_ms=50)
            task = asyncio.create_task(worker.run())
            await asyncio.sleep(0.15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await redis.aclose()
            return drained, await pending(CALL_STREAM, TOOL_GROUP)

    drained, still_pending = asyncio.run(scenario())
    assert [(r.call_id, r.content) for r in drained] == [("drained", " x x")]
    assert still_pending == 1


def test_both_sides_recover_when_redis_forgets_their_groups(
    redis_url: str,
    make_call: Callable[..., ToolCall],
    open_engine: EngineFactory,
    open_worker: WorkerFactory,
    collect: Collect,
) -> None:
    async def scenario() -> list[ToolResult]:
        async with open_engine() as bus, open_worker():
            await asyncio.sleep(0.1)
            async with Redis.from_url(redis_url) as r:
                await r.flushall()
            await bus.submit(make_call("c1", "calculator", {"expression": "2**10"}))
            return await collect(bus, 1)

    assert [r.content for r in asyncio.run(scenario())] == ["1024"]
