"""The tool registry: workers publish their tools; readers see fresh entries only."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from redis.asyncio import Redis

from interlude.api.tools import KEY, ToolSpec
from interlude.bus.published import PublishedTools, publish, published


def test_published_tools_are_seen_and_stale_ones_expire(redis_server: str) -> None:
    async def scenario() -> None:
        redis = Redis.from_url(redis_server)
        await redis.delete(KEY)
        spec = ToolSpec("calculator", "math", {"type": "object"})
        await publish(redis, [spec], worker="w1")
        seen = await published(redis)
        assert seen == {"calculator": spec}
        # An entry nobody refreshed within the TTL no longer counts.
        old = json.dumps({"description": "", "parameters": {}, "worker": "w0", "updated_at": 1.0})
        await redis.hset(KEY, "ancient", old)
        await redis.hset(KEY, "garbage", "not json")
        assert set(await published(redis)) == {"calculator"}
        assert set(await published(redis, ttl_s=time.time())) == {"calculator", "ancient"}
        cached = PublishedTools(redis, max_age_s=60)
        assert await cached.names() == {"calculator"}
        await publish(redis, [ToolSpec("echo", "", {})], worker="w2")
        assert await cached.names() == {"calculator"}  # cached, no read per call
        assert await PublishedTools(redis).names() == {"calculator", "echo"}
        await redis.delete(KEY)
        await redis.aclose()

    asyncio.run(scenario())


def test_the_worker_publishes_every_tool_with_its_schema() -> None:
    from interlude_tools.registry import TEST_TOOLS, default_registry

    specs = {s.name: s for s in default_registry(test_tools=True).specs()}
    assert {"calculator", "echo", "scripted", "sleep", "fail"} <= set(specs)
    assert specs["calculator"].parameters["required"] == ["expression"]
    # Without the flag the test tools are not there to publish (`--test-tools` on a worker).
    assert [s.name for s in default_registry().specs()] == ["calculator"]
    assert set(TEST_TOOLS) == set(specs) - {"calculator"}


def test_the_cached_view_survives_the_bus_going_away(tmp_path: Path) -> None:
    """Redis away: the engine keeps the tools it last saw (server tools must not silently turn
    into client ones) and does not retry on every turn."""
    from interlude.stack.valkey import Valkey

    server = Valkey(tmp_path / "valkey")
    url = server.start()

    async def scenario() -> None:
        redis = Redis.from_url(url, socket_timeout=1)
        await publish(redis, [ToolSpec("calculator", "math", {})], worker="w1")
        cached = PublishedTools(redis, max_age_s=0.2)
        assert await cached.names() == {"calculator"}
        server.stop()
        await asyncio.sleep(0.3)
        assert await cached.names() == {"calculator"}  # the failed read kept the last set
        started = time.monotonic()
        assert await cached.names() == {"calculator"}  # within max_age: no new attempt
        assert time.monotonic() - started < 0.05
        await redis.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_a_hung_bus_costs_a_turn_at_most_the_read_timeout(tmp_path: Path) -> None:
    """Valkey stopped (SIGSTOP: the socket stays open, nothing answers, as in a partition):
    the engine's turns and its /ready, which ask for the published tools, must not hang."""
    import os
    import signal

    from interlude.stack.valkey import Valkey

    server = Valkey(tmp_path / "valkey")
    url = server.start()
    assert server.proc is not None

    async def scenario() -> None:
        redis = Redis.from_url(url)  # no socket timeout, as the bus's client
        await publish(redis, [ToolSpec("calculator", "math", {})], worker="w1")
        cached = PublishedTools(redis, max_age_s=0.2, read_timeout_s=0.5)
        assert await cached.names() == {"calculator"}
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(0.3)
            started = time.monotonic()
            assert await cached.names() == {"calculator"}  # the last known set
            assert time.monotonic() - started < 1.5
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        await asyncio.sleep(0.3)
        await publish(redis, [ToolSpec("echo", "", {})], worker="w1")
        assert await cached.names() == {"calculator", "echo"}  # back: read again
        await redis.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
