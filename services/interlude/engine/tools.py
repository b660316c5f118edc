"""Server-side tool calls: the engine's bridge to the tool bus (Redis Streams).

`ServerTools.call` submits a `ToolCall` and waits for its `ToolResult`. One reader task per
engine takes results off the engine's result stream and wakes the waiting session; the same
task answers calls past their deadline with a "timeout" result, so a tool that never answers
becomes a result the model sees, not a session parked forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis.exceptions import RedisError

from interlude.bus.client import EngineBus
from interlude.bus.protocol import ToolCall, ToolResult
from interlude.bus.registry import PublishedTools

log = logging.getLogger(__name__)


class ServerTools:
    """Runs tool calls through the bus for this engine's sessions.

    Side effects: `start` creates the result stream/group and a reader task; `call` appends to
    the call stream. Invariants: each call is answered exactly once (a late worker result after
    the expiry is dropped by `EngineBus`); a result for a call no session waits for (one from
    before a restart) is acknowledged and dropped, because its session's KV is gone with the
    old process. `close` stops the reader and fails the calls still waiting.
    """

    def __init__(self, bus: EngineBus, grace_s: float = 1.0, poll_ms: int = 200) -> None:
        self.bus = bus
        self.engine_id = bus.engine_id
        # What runs server-side: the tools the deployment's workers publish, never the caller's
        # choice (a declared tool no worker publishes is the client's to run).
        self.published = PublishedTools(bus.redis)
        self._grace_s = grace_s
        self._poll_ms = poll_ms
        self._waiting: dict[str, asyncio.Future[ToolResult]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.connected = False

    async def start(self) -> None:
        await self.bus.start()
        self.connected = True
        self._reader = asyncio.create_task(self._read(), name="interlude-tool-results")

    async def call(self, call: ToolCall) -> ToolResult:
        """Submit `call` and wait for its result (a timeout result once its deadline passes)."""
        if self._reader is None or self._reader.done():
            raise RuntimeError("the tool bus reader is not running (start() not called or died)")
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self._waiting[call.call_id] = future
        try:
            await self.bus.submit(call)
            return await future
        finally:
            self._waiting.pop(call.call_id, None)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(RuntimeError("engine shutting down"))
        await self.bus.close()

    async def _read(self) -> None:
        while True:
            try:
                deliveries = await self.bus.fetch(block_ms=self._poll_ms)
                self.connected = True
            except (RedisError, OSError) as exc:
                # Redis away: keep waiting (calls still expire below) and retry.
                self.connected = False
                log.warning("tool bus read failed: %s", exc)
                await asyncio.sleep(self._poll_ms / 1000)
                deliveries = []
            for d in deliveries:
                self._deliver(d.result)
                await self.bus.ack(d)
            for expired in self.bus.expire_overdue(time.time(), self._grace_s):
                self._deliver(expired)

    def _deliver(self, result: ToolResult) -> None:
        future = self._waiting.get(result.call_id)
        if future is None:
            log.info("no session waits for call %s (from before a restart?)", result.call_id)
        elif not future.done():
            future.set_result(result)
