"""The engine holds every worker's result to its own cap (`ServerTools(max_result_bytes=)`):
a result over it reaches the session as a `tool_error` the model sees, whichever worker posted
it (one run with a larger cap, or not one of ours). On the session's Valkey with a real worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis as AsyncRedis

from interlude.api.bus import ToolCall, ToolResult
from interlude.bus import EngineBus
from interlude.engine.tools import ServerTools
from interlude_tools import Registry, Scripted


def test_a_workers_result_over_the_engines_cap_is_a_tool_error(
    redis_url: str, open_worker: Callable[..., Any], make_call: Callable[..., ToolCall]
) -> None:
    async def scenario() -> list[ToolResult]:
        redis = AsyncRedis.from_url(redis_url, decode_responses=True)
        tools = ServerTools(EngineBus(redis, "eng"), poll_ms=50, max_result_bytes=1000)
        await tools.start()
        lax = Registry([Scripted()], max_result_bytes=100_000)  # a worker with a larger cap
        try:
            async with open_worker(registry=lax):
                calls = [
                    make_call(c, "scripted", {"tokens": n}) for c, n in (("big", 600), ("ok", 500))
                ]
                return list(await asyncio.gather(*(tools.call(c, "t") for c in calls)))
        finally:
            await tools.close()
            await redis.aclose()

    big, small = asyncio.run(scenario())
    assert not big.ok and big.content == ""
    assert big.error == "tool_error: result too large: the worker returned 1200 bytes (cap 1000)"
    assert small.ok and len(small.content.encode()) == 1000  # at the cap: delivered whole


def test_the_cap_counts_utf8_bytes_not_characters() -> None:
    now = time.time()
    call = ToolCall("c", "s", "e", "t", {}, now + 5, {}, now)
    fits = ToolResult.success(call, "é" * 500, now)  # 1,000 bytes
    assert fits.within(1000) is fits
    over = ToolResult.success(call, "é" * 501, now).within(1000, "tool 't'")
    assert over.error == "tool_error: result too large: tool 't' returned 1002 bytes (cap 1000)"
    failed = ToolResult.failure(call, "timeout", "late", now)
    assert failed.within(1) is failed
