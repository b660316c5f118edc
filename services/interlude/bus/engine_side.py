"""The engine's side of the tool bus: submit calls, receive each call's result exactly once.

Delivery is at-least-once on the wire (a worker that crashes after posting may have its call
run again) and exactly-once at this API: results are de-duplicated by `call_id`. A result is
acknowledged (XACK, then XDEL: the stream is a queue, not a log) only after the engine has
taken it, so an engine that restarts under the same `engine_id` first re-reads the results it
had read but not acknowledged, then the ones that arrived while it was down.

Its Redis helpers (`ensure_group`, `stream_entries`, `ack_and_delete`, ...) are `streams.py`,
shared with the worker's side (`worker_side.py`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from interlude.api.bus import (
    CALL_STREAM,
    ENGINE_GROUP,
    ProtocolError,
    ToolCall,
    ToolResult,
    result_stream,
    submitted_key,
)
from interlude.bus.streams import (
    StreamEntry,
    ack_and_delete,
    as_text,
    connect,
    ensure_group,
    group_vanished,
    raise_if_cancelled,
    stream_entries,
)

log = logging.getLogger(__name__)


# Streams are queues here: an entry is deleted once acknowledged, so they stay short while
# workers keep up. This caps the call stream when they do not (none running, a long outage):
# about 100 s of calls at 1,000/s. The oldest are trimmed first; their sessions get a
# "timeout" result at their deadline like any unanswered call (a worker that had read one
# and claims it later finds it deleted and drops it).
CALL_STREAM_MAXLEN = 100_000

# KEYS: submitted key, call stream. ARGV: ttl, v, body, maxlen. The XADD runs only if the SET
# won, so a retried submit (the first one's reply lost) queues the call once.
_SUBMIT = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'v', ARGV[2], 'body', ARGV[3])
end
return false
"""


@dataclass(frozen=True)
class Delivery:
    """A result read but not yet acknowledged; `EngineBus.ack` it once the engine has it."""

    entry_id: str
    result: ToolResult


class EngineBus:
    """One engine's connection to the tool bus.

    Side effects: `start` creates the engine's result stream and group; `submit` appends to
    the shared call stream; reading acknowledges and deletes entries of this engine's result
    stream only. Invariants: each `call_id` is handed out at most once per `EngineBus` (a
    bounded memory of the last `dedup_capacity` ids, including the ones `expire` answered),
    and never lost before it is acknowledged. One consumer per engine (named `engine_id`), so
    a restarted engine owns the pending entries of its previous life.

    Every `rescan_s` the bus also re-reads its own pending entries. A read whose reply was lost
    leaves its entries pending on this consumer and never handed out: the server counted them
    delivered, the client never saw them, and redis-py (8.x) retries a command on a dropped
    connection without telling the caller, so the loss is invisible here. Seen in the fault
    drill across a server restart: one call stranded until its deadline.
    """

    def __init__(
        self,
        redis: str | Redis,
        engine_id: str,
        *,
        dedup_capacity: int = 65536,
        batch: int = 64,
        call_stream_maxlen: int = CALL_STREAM_MAXLEN,
        rescan_s: float = 5.0,
    ) -> None:
        self._owns_client = isinstance(redis, str)
        self._redis: Redis = connect(redis) if isinstance(redis, str) else redis
        self.engine_id = engine_id
        self.stream = result_stream(engine_id)
        if dedup_capacity < 1 or batch < 1 or call_stream_maxlen < 1:
            raise ValueError("dedup_capacity, batch and call_stream_maxlen must be >= 1")
        if rescan_s < 0:
            raise ValueError(f"rescan_s must be >= 0, got {rescan_s}")
        self._rescan_s = rescan_s
        self._scanned_at = time.monotonic()
        self._maxlen = call_stream_maxlen
        self._capacity = dedup_capacity
        self._batch = batch
        self._delivered: OrderedDict[str, None] = OrderedDict()
        self._outstanding: dict[str, ToolCall] = {}
        self._buffer: deque[Delivery] = deque()
        self._unacked: set[str] = set()  # entry ids handed to `_buffer`, not yet acknowledged
        # Entry ids whose `ack` failed (Redis away): their caller has moved on, so the pending
        # rescan acknowledges and deletes them when it meets them again.
        self._ack_failed: set[str] = set()
        # Pending entries of a previous life are read from id "0" on; None once drained.
        self._pending_cursor: str | None = "0"
        self._closed = False
        self.duplicates = 0  # results dropped because their call had been answered already

    @property
    def redis(self) -> Redis:
        """The client this bus uses (shared with the tool registry's reader)."""
        return self._redis

    async def start(self) -> None:
        """Create this engine's result stream and group (idempotent)."""
        await ensure_group(self._redis, self.stream, ENGINE_GROUP)

    async def submit(self, call: ToolCall) -> str:
        """Queue `call` for the tool workers, once per call id; returns its entry id on the call
        stream ("" if an earlier submit of the same call had queued it already)."""
        if call.engine_id != self.engine_id:
            raise ValueError(
                f"call {call.call_id} names engine {call.engine_id!r}, this bus is "
                f"{self.engine_id!r}: its result would go to another engine"
            )
        fields = call.encode()
        # Kept past the deadline (a day at least): a retry can come no later than that.
        ttl = max(86_400, int(call.deadline - call.issued_at) + 3600)
        entry_id = await self._redis.eval(
            _SUBMIT,
            2,
            submitted_key(call.call_id),
            CALL_STREAM,
            ttl,
            fields["v"],
            fields["body"],
            self._maxlen,
        )
        self._outstanding[call.call_id] = call
        return "" if entry_id is None else as_text(entry_id)

    @property
    def outstanding(self) -> list[ToolCall]:
        """Calls submitted through this bus that have neither a result nor an expiry yet."""
        return list(self._outstanding.values())

    async def fetch(self, block_ms: int | None = None, count: int | None = None) -> list[Delivery]:
        """Up to `count` new results, not yet acknowledged; waits up to `block_ms` (None or 0:
        does not wait).

        Duplicates (a `call_id` already handed out) and undecodable entries are acknowledged
        and dropped here. Call `ack` for each delivery once it is safe to forget.
        """
        limit = self._batch if count is None else count
        if not self._buffer:
            await self._fill(block_ms)
        out: list[Delivery] = []
        while self._buffer and len(out) < limit:
            out.append(self._buffer.popleft())
        return out

    async def ack(self, *deliveries: Delivery) -> None:
        """Acknowledge and delete `deliveries`: one round trip (XACK, then XDEL, pipelined)."""
        if not deliveries:
            return
        ids = [d.entry_id for d in deliveries]
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xack(self.stream, ENGINE_GROUP, *ids)
                pipe.xdel(self.stream, *ids)
                await pipe.execute()
        except BaseException:
            self._ack_failed.update(ids)
            raise
        finally:
            self._unacked.difference_update(ids)

    async def results(self, block_ms: int = 1000) -> AsyncGenerator[ToolResult, None]:
        """Every result, once each, until `close`; each is acknowledged when the next is asked.

        So a result the engine was still handling when it crashed is delivered again after
        its restart (so is the last one if the loop is left with `break`: to the next
        `EngineBus` of this engine, not this one). `block_ms` bounds each wait, and so how
        late `close` is noticed.
        """
        while not self._closed:
            deliveries = await self.fetch(block_ms=block_ms, count=1)
            raise_if_cancelled()
            for delivery in deliveries:
                yield delivery.result
                await self.ack(delivery)

    def expire(self, call: ToolCall, now: float) -> ToolResult | None:
        """A "timeout" result for `call`, whose deadline has passed with no result; or None.

        None means a result for this call was already handed out. Once expired, a late result
        from a worker is dropped like a duplicate, so the model sees exactly one answer.
        """
        if now < call.deadline:
            raise ValueError(f"call {call.call_id} is not past its deadline ({call.deadline})")
        if call.call_id in self._delivered:
            return None
        self._remember(call.call_id)
        return ToolResult.failure(
            call, "timeout", f"no result from tool {call.tool!r} by its deadline", now
        )

    def expire_overdue(self, now: float, grace_s: float = 1.0) -> list[ToolResult]:
        """`expire` every outstanding call more than `grace_s` past its deadline.

        The grace lets a worker's own timeout (or a result posted at the last moment) arrive
        first; this is the backstop for calls no worker answers at all.
        """
        overdue = [c for c in self._outstanding.values() if c.deadline + grace_s <= now]
        return [r for c in overdue if (r := self.expire(c, now)) is not None]

    async def close(self) -> None:
        """Stop `results` (within one `block_ms`) and close the client if this bus made it."""
        self._closed = True
        if self._owns_client:
            await self._redis.aclose()

    def _remember(self, call_id: str) -> None:
        self._outstanding.pop(call_id, None)
        self._delivered[call_id] = None
        while len(self._delivered) > self._capacity:
            self._delivered.popitem(last=False)

    async def _fill(self, block_ms: int | None) -> None:
        if self._pending_cursor is None and time.monotonic() - self._scanned_at >= self._rescan_s:
            self._pending_cursor = "0"
        for entry_id, fields in await self._read(block_ms):
            if fields is None:
                await ack_and_delete(self._redis, self.stream, ENGINE_GROUP, entry_id)
                continue
            try:
                result = ToolResult.decode(fields)
            except ProtocolError as exc:
                log.warning("dropping undecodable result %s on %s: %s", entry_id, self.stream, exc)
                await ack_and_delete(self._redis, self.stream, ENGINE_GROUP, entry_id)
                continue
            if entry_id in self._ack_failed:
                # Handed out once already; its ack failed, and the caller will not retry it.
                await ack_and_delete(self._redis, self.stream, ENGINE_GROUP, entry_id)
                self._ack_failed.discard(entry_id)
                continue
            if entry_id in self._unacked:
                # A re-read of an entry handed out and not yet acknowledged: the caller still
                # owns it, so it stays pending; not a second post.
                continue
            if result.call_id in self._delivered:
                log.info("dropping duplicate result for call %s (%s)", result.call_id, entry_id)
                self.duplicates += 1
                await ack_and_delete(self._redis, self.stream, ENGINE_GROUP, entry_id)
                continue
            self._remember(result.call_id)
            self._unacked.add(entry_id)
            self._buffer.append(Delivery(entry_id, result))

    async def _read(self, block_ms: int | None) -> list[StreamEntry]:
        while True:
            cursor = self._pending_cursor or ">"
            try:
                response = await self._redis.xreadgroup(
                    ENGINE_GROUP,
                    self.engine_id,
                    {self.stream: cursor},
                    count=self._batch,
                    # Redis ignores BLOCK for pending reads; 0 would mean "forever".
                    block=block_ms if cursor == ">" and block_ms else None,
                )
            except ResponseError as exc:
                if not group_vanished(exc):
                    raise
                await self.start()
                continue
            entries = stream_entries(response)
            if self._pending_cursor is None:
                return entries
            if not entries:
                self._pending_cursor = None
                self._scanned_at = time.monotonic()
                continue
            self._pending_cursor = entries[-1][0]
            return entries
