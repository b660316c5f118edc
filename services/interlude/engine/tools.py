"""Server-side tool calls: the engine's bridge to the tool bus (Redis Streams).

`ServerTools.call` submits a `ToolCall` and waits for its `ToolResult`. One reader task per
engine takes results off the engine's result stream and wakes the waiting session; the same task
answers calls past their deadline with a "timeout" result, so a tool that never answers becomes
a result the model sees, not a session parked forever.

Redis can fail under either half, and serving does not depend on it: an engine whose bus is away
stays ready (requests that call no server-side tool never touch Redis) and says so in `/ready`'s
`tool_bus`. `start` does not wait for Redis either: the reader creates the result stream once
Redis answers. The reader survives any error (it logs, marks the bus disconnected and retries
with exponential backoff), and a call does not rely on it: each waits at most until its deadline
plus the grace, then answers itself with the same timeout result (`EngineBus.expire`, so a
result arriving later is dropped as a duplicate). Submitting retries a failed XADD with backoff
until the call's deadline; the bus's submit is idempotent per call id, so a retry after a lost
reply never queues the call twice.

A tenant's calls in flight are capped when its key says so (`caps.TenantSlots`): a call past
the cap waits its turn within its deadline, else becomes a `tool_error` result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis.exceptions import RedisError

from interlude.api.bus import MAX_RESULT_BYTES, ToolCall, ToolResult
from interlude.bus.engine_side import EngineBus
from interlude.bus.published import PublishedTools
from interlude.bus.streams import Backoff, raise_if_cancelled
from interlude.engine.caps import TenantSlots, too_many_tool_calls

log = logging.getLogger(__name__)


class ServerTools:
    """Runs tool calls through the bus for this engine's sessions.

    Side effects: `start` creates the result stream/group and a reader task; `call` appends to
    the call stream. Invariants: each call is answered exactly once (a late worker result after
    the expiry is dropped by `EngineBus`); a result for a call no session waits for (one from
    before a restart) is acknowledged and dropped, because its session's KV is gone with the
    old process. `close` stops the reader and fails the calls still waiting.
    """

    def __init__(
        self,
        bus: EngineBus,
        grace_s: float = 1.0,
        poll_ms: int = 200,
        max_backoff_s: float = 5.0,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ) -> None:
        """`max_result_bytes`: the most a result may hold (UTF-8); a larger one, whichever
        worker posted it, reaches its session as a `tool_error` ("result too large")."""
        if max_result_bytes < 1:
            raise ValueError("max_result_bytes must be >= 1")
        self.bus = bus
        self.max_result_bytes = max_result_bytes
        self.engine_id = bus.engine_id
        # What runs server-side: the tools the deployment's workers publish, never the caller's
        # choice (a declared tool no worker publishes is the client's to run).
        self.published = PublishedTools(bus.redis)
        self._grace_s = grace_s
        self._poll_ms = poll_ms
        self._max_backoff_s = max_backoff_s
        self._waiting: dict[str, asyncio.Future[ToolResult]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.connected = False
        self.slots = TenantSlots()  # each tenant's calls in flight, when its key caps them

    async def start(self) -> None:
        """Start the reader; the result stream is made now if Redis answers, else by the
        reader once it does (an engine starts whether or not its bus is there)."""
        with contextlib.suppress(RedisError, OSError):
            await self.bus.start()
            self.connected = True
        if not self.connected:
            log.warning("tool bus unreachable at start; serving, and retrying in the background")
        self._reader = asyncio.create_task(self._read(), name="interlude-tool-results")

    async def call(self, call: ToolCall, tenant: str = "", cap: int = 0) -> ToolResult:
        """Submit `call` and wait for its result (a timeout result once its deadline passes);
        with a `cap`, once fewer than `cap` of `tenant`'s calls are in flight (a `tool_error`
        result if that does not happen before the deadline)."""
        if not cap:
            return await self._call(call)
        if not await self.slots.acquire(tenant, cap, call.deadline - time.time()):
            return ToolResult.failure(call, "tool_error", too_many_tool_calls(cap), time.time())
        try:
            return await self._call(call)
        finally:
            self.slots.release(tenant)

    async def _call(self, call: ToolCall) -> ToolResult:
        if self._reader is None or self._reader.done():
            raise RuntimeError("the tool bus reader is not running (start() not called or died)")
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self._waiting[call.call_id] = future
        try:
            if not await self._submit(call):
                return self._timed_out(call)
            # The reader answers first in the normal case (a result, or the expiry after the
            # grace); this bound is for a reader stuck on a dead connection.
            left = call.deadline + self._grace_s - time.time()
            try:
                return await asyncio.wait_for(asyncio.shield(future), max(0.0, left) + 0.5)
            except TimeoutError:
                return future.result() if future.done() else self._timed_out(call)
        finally:
            self._waiting.pop(call.call_id, None)

    async def _submit(self, call: ToolCall) -> bool:
        """XADD `call`, retrying with backoff until its deadline; False if it never went out."""
        backoff = Backoff(cap=self._max_backoff_s)
        while True:
            try:
                # Bounded by the deadline: a server that hangs (stopped, or cut off without a
                # reset) must not hold the call past it; the submit is idempotent per call id.
                left = max(0.0, call.deadline - time.time())
                await asyncio.wait_for(self.bus.submit(call), left)
                return True
            except (RedisError, OSError, TimeoutError) as exc:
                left = call.deadline - time.time()
                if left <= 0:
                    log.warning("call %s not submitted by its deadline: %s", call.call_id, exc)
                    return False
                log.warning("submitting call %s failed (%s); retrying", call.call_id, exc)
                await asyncio.sleep(min(backoff.next(), left))

    def _timed_out(self, call: ToolCall) -> ToolResult:
        """The call's timeout result, exactly once (None from `expire`: already answered)."""
        result = self.bus.expire(call, max(time.time(), call.deadline))
        if result is not None:
            return result
        return ToolResult.failure(
            call, "timeout", f"no result from tool {call.tool!r}", time.time()
        )

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
        """Until cancelled: deliver results and expire overdue calls; never dies of an error."""
        backoff = Backoff(first=self._poll_ms / 1000, cap=self._max_backoff_s)
        while True:
            try:
                if not self.connected:  # (again) make the stream and group a restart lost
                    await self.bus.start()
                deliveries = await self.bus.fetch(block_ms=self._poll_ms)
                # redis-py can swallow a cancel inside a command: `close` must still end this.
                raise_if_cancelled()
                for d in deliveries:
                    self._deliver(d.result)
                # Delivered before the ack: if the ack fails the entries stay pending, and the
                # bus acknowledges them when its pending rescan meets them again (after an
                # engine restart, a re-read is dropped as a duplicate by its call id).
                await self.bus.ack(*deliveries)
                self.connected = True
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Redis away or answering errors: calls still expire below.
                self.connected = False
                wait = backoff.next()
                log.warning("tool bus read failed (%s); retrying in %.2f s", exc, wait)
                await asyncio.sleep(wait)
            for expired in self.bus.expire_overdue(time.time(), self._grace_s):
                self._deliver(expired)

    def _deliver(self, result: ToolResult) -> None:
        future = self._waiting.get(result.call_id)
        if future is None:
            log.info("no session waits for call %s (from before a restart?)", result.call_id)
        elif not future.done():
            future.set_result(result.within(self.max_result_bytes, "the worker"))
