"""The tool registry: workers publish their tools; readers see fresh entries only."""

from __future__ import annotations

import asyncio
import json
import time

from redis.asyncio import Redis

from interlude.bus.registry import KEY, PublishedTools, ToolSpec, publish, published


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
    from interlude_tools.registry import default_registry

    specs = {s.name: s for s in default_registry().specs()}
    assert {"calculator", "echo", "scripted", "sleep", "fail"} <= set(specs)
    assert specs["calculator"].parameters["required"] == ["expression"]
