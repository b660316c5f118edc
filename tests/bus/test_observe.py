"""A tool worker's `/health` and `/metrics`, and the bus numbers tool pods scale on."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis as AsyncRedis

from interlude.api.bus import CALL_STREAM, TOOL_GROUP, ToolCall
from interlude.bus.streams import ensure_group
from interlude.stack.valkey import free_port
from interlude_tools import observe


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sample(metrics: str, name: str, **labels: str) -> float:
    """One sample's value from the text format (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and ",".join(sorted((m.group(1) or "").split(","))) == want:
            return float(m.group(2))
    return 0.0


def test_lag_counts_unread_calls_and_pending_the_unacknowledged(
    redis_url: str, make_call: Callable[..., ToolCall], open_engine: Any
) -> None:
    async def scenario() -> list[tuple[int, int]]:
        async with open_engine() as bus, AsyncRedis.from_url(redis_url) as r:
            await ensure_group(r, CALL_STREAM, TOOL_GROUP)
            seen = [await observe.read_bus(r)]
            for i in range(3):
                await bus.submit(make_call(f"c{i}", "echo", {"text": "x"}))
            seen.append(await observe.read_bus(r))
            await r.xreadgroup(TOOL_GROUP, "someone", {CALL_STREAM: ">"}, count=1)
            seen.append(await observe.read_bus(r))
            return seen

    assert asyncio.run(scenario()) == [(0, 0), (0, 3), (1, 2)]


def test_metrics_count_calls_by_outcome_and_health_follows_the_worker(
    make_call: Callable[..., ToolCall],
    open_engine: Any,
    open_worker: Any,
    collect: Any,
    redis_url: str,
) -> None:
    health = observe.Health()
    port = free_port()
    server = observe.serve_http(port, health, host="127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    try:
        status, body = get(f"{base}/health")
        assert status == 503 and json.loads(body)["reason"] == "starting"
        before = get(f"{base}/metrics")[1]

        async def scenario() -> tuple[int, int]:
            async with open_engine() as bus, AsyncRedis.from_url(redis_url) as r:
                watcher = asyncio.create_task(observe.watch_bus(r, health, every_s=0.05))
                async with open_worker():
                    with observe.running(health):
                        await bus.submit(make_call("ok", "calculator", {"expression": "1+1"}))
                        await bus.submit(make_call("bad", "calculator", {"expression": 7}))
                        await collect(bus, 2)
                        await asyncio.sleep(0.1)  # a look at the bus after the calls
                        during = (await asyncio.to_thread(get, f"{base}/health"))[0]
                watcher.cancel()
                after = (await asyncio.to_thread(get, f"{base}/health"))[0]
                return during, after

        during, after = asyncio.run(scenario())
        assert (during, after) == (200, 503)
        metrics = get(f"{base}/metrics")[1]
        calls = "interlude_tool_calls_total"
        for outcome in ("ok", "bad_arguments"):
            delta = sample(metrics, calls, tool="calculator", outcome=outcome) - sample(
                before, calls, tool="calculator", outcome=outcome
            )
            assert delta == 1, outcome
        assert sample(metrics, "interlude_tool_calls_running") == 0
        assert sample(metrics, "interlude_tool_stream_lag") == 0
        assert get(f"{base}/nope")[0] == 404
    finally:
        server.shutdown()
