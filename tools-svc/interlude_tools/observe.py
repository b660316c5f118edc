"""A worker's `/health` and `/metrics`: what Kubernetes probes, and what scales tool pods.

Metrics (Prometheus, `interlude_tool_` prefix): calls by tool and outcome (`ok` or the error
kind), call latency by tool, calls running, and two numbers about the bus itself, read from
Redis every few seconds: `pending` (calls read by some worker and not yet acknowledged) and
`lag` (calls on the stream no worker has read yet: the number to scale tool pods on, e.g. with
KEDA's Redis Streams scaler, which reads the same XINFO GROUPS field). `/health` answers 200
while the worker runs and its last look at Redis worked, else 503, with the reason.

The server is `http.server` on a daemon thread: a tool that blocks the event loop cannot make
the pod look dead to its probes, only to its own `health` checks below.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from redis.asyncio import Redis

from interlude import telemetry
from interlude.api.bus import CALL_STREAM, TOOL_GROUP, ToolResult
from interlude.bus.streams import as_text

log = logging.getLogger(__name__)

CALLS = Counter("interlude_tool_calls", "tool calls finished", ["tool", "outcome"])
LATENCY = Histogram(
    "interlude_tool_call_seconds",
    "time a tool call ran, from its start to its result",
    ["tool"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RUNNING = Gauge("interlude_tool_calls_running", "calls this worker is running")
PENDING = Gauge("interlude_tool_calls_pending", "calls read by a worker, not yet acknowledged")
LAG = Gauge("interlude_tool_stream_lag", "calls on the stream that no worker has read yet")
DEAD = Counter("interlude_tool_calls_dead_lettered", "poison calls moved to the dead letters")


def record(result: ToolResult, tool: str, seconds: float) -> None:
    """Count one finished call."""
    outcome = "ok" if result.ok else result.error.split(":", 1)[0]
    CALLS.labels(tool, outcome).inc()
    LATENCY.labels(tool).observe(seconds, exemplar=telemetry.exemplar(result.trace))


async def read_bus(redis: Redis) -> tuple[int, int]:
    """(pending, lag) of the tool group, from XPENDING and XINFO GROUPS."""
    summary = await redis.xpending(CALL_STREAM, TOOL_GROUP)
    pending = int(summary["pending"]) if summary else 0
    lag = 0
    for group in await redis.xinfo_groups(CALL_STREAM):
        if as_text(group.get("name")) == TOOL_GROUP:  # bytes unless decode_responses
            lag = int(group.get("lag") or 0)
    return pending, lag


class Health:
    """What `/health` reports: set by the worker's loops, read by the HTTP thread."""

    def __init__(self) -> None:
        self.running = False
        self.redis_ok = False
        self.reason = "starting"
        self.checked_at = 0.0

    def state(self) -> tuple[bool, dict[str, Any]]:
        ok = self.running and self.redis_ok
        body = {"status": "ok" if ok else "unhealthy", "reason": "" if ok else self.reason}
        return ok, body | {"checked_at": self.checked_at}


async def watch_bus(redis: Redis, health: Health, every_s: float = 5.0) -> None:
    """Until cancelled: refresh the bus gauges and `health.redis_ok`."""
    while True:
        try:
            pending, lag = await read_bus(redis)
            PENDING.set(pending)
            LAG.set(lag)
            health.redis_ok, health.reason = True, ""
        except Exception as exc:
            health.redis_ok, health.reason = False, f"redis: {exc}"
        health.checked_at = time.time()
        await asyncio.sleep(every_s)


def serve_http(port: int, health: Health, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Start `/health` and `/metrics` on a daemon thread; `shutdown()` the result to stop."""

    class Handler(telemetry.ProbeHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self.send_metrics()
            elif path == "/health":
                ok, body = health.state()
                self.send_body(200 if ok else 503, "application/json", json.dumps(body).encode())
            else:
                self.not_found()

    return telemetry.serve_side_port(Handler, port, host, "worker-http")


@contextlib.contextmanager
def running(health: Health) -> Any:
    """Mark the worker as running for the block."""
    health.running = True
    try:
        yield
    finally:
        health.running, health.reason = False, "stopped"
