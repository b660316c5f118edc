"""A key's cap on server-side tool calls in flight (`engine.caps.TenantSlots`, used by
`ServerTools.call`): calls past the cap wait in line within their deadline, else become a
`tool_error` result; other tenants are not held up. On the session's Valkey with a worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis as AsyncRedis

from interlude.api.bus import ToolCall, ToolResult
from interlude.bus import EngineBus
from interlude.engine.caps import TenantSlots
from interlude.engine.tools import ServerTools


def test_calls_past_a_tenants_cap_wait_in_line_or_fail_visibly(
    redis_url: str, open_worker: Callable[..., Any], make_call: Callable[..., ToolCall]
) -> None:
    async def scenario() -> dict[str, tuple[ToolResult, float]]:
        redis = AsyncRedis.from_url(redis_url, decode_responses=True)
        tools = ServerTools(EngineBus(redis, "eng"), poll_ms=50)
        await tools.start()
        t0 = time.monotonic()

        async def timed(call: ToolCall, tenant: str) -> tuple[ToolResult, float]:
            result = await tools.call(call, tenant, cap=1)
            return result, time.monotonic() - t0

        try:
            async with open_worker():
                sleep = {"delay_s": 0.6, "tokens": 1}
                runs = {
                    "a1": timed(make_call("a1", "sleep", sleep), "a"),
                    "a2": timed(make_call("a2", "sleep", sleep), "a"),
                    # Due before a1 ends: it never gets the slot.
                    "a3": timed(make_call("a3", "sleep", sleep, ttl=0.3), "a"),
                    "b1": timed(make_call("b1", "sleep", sleep), "b"),
                }
                done = await asyncio.gather(*runs.values())
                assert tools.slots.held("a") == tools.slots.waiting("a") == 0
                return dict(zip(runs, done, strict=True))
        finally:
            await tools.close()
            await redis.aclose()

    out = asyncio.run(scenario())
    assert [out[c][0].ok for c in ("a1", "a2", "b1")] == [True] * 3
    assert out["a2"][1] - out["a1"][1] >= 0.5  # a2 ran once a1 had ended
    assert abs(out["b1"][1] - out["a1"][1]) < 0.4  # another key's call did not wait
    refused = out["a3"][0]
    assert not refused.ok and refused.error.startswith("tool_error: too many concurrent tool")
    assert out["a3"][1] < out["a1"][1]  # it failed at its own deadline, not after a1


def test_slots_go_first_come_first_served_and_a_cancelled_waiter_leaves_the_line() -> None:
    async def scenario() -> list[str]:
        slots = TenantSlots()
        order: list[str] = []
        assert await slots.acquire("t", 1, 1.0)

        async def wait(name: str) -> None:
            if await slots.acquire("t", 1, 5.0):
                order.append(name)
                slots.release("t")

        waiters = {n: asyncio.create_task(wait(n)) for n in ("w1", "w2", "w3")}
        await asyncio.sleep(0.01)
        assert slots.waiting("t") == 3
        waiters["w2"].cancel()  # its session ended while its call waited
        await asyncio.sleep(0.01)
        assert slots.waiting("t") == 2
        slots.release("t")
        await asyncio.gather(waiters["w1"], waiters["w3"])
        assert slots.held("t") == slots.waiting("t") == 0
        return order

    assert asyncio.run(scenario()) == ["w1", "w3"]


def test_a_waiter_that_times_out_leaves_nothing_behind() -> None:
    async def scenario() -> tuple[bool, int, int]:
        slots = TenantSlots()
        assert await slots.acquire("t", 1, 0.05)
        late = await slots.acquire("t", 1, 0.05)  # the holder does not release in time
        slots.release("t")
        return late, slots.held("t"), slots.waiting("t")

    assert asyncio.run(scenario()) == (False, 0, 0)
