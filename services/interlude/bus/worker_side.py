"""The worker's side of the tool bus: read calls, take over a dead worker's, post results.

Every Redis command a tool worker sends for its calls is here, beside the engine's side
(`engine_side.py`), so the two halves of the protocol read together; what a worker decides
(how many calls to read, which idle ones to claim, when to retry) stays in `interlude_tools`.

Posting is one Lua script, so atomic: SET the call's done key NX (with a TTL), XADD the result
only if that SET won, then XACK and XDEL the call. A crash before the script leaves the call
pending (another worker reclaims and runs it); after it, the call is finished. If two workers
ever run one call, the second post finds the done key and only acknowledges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from interlude.api.bus import CALL_STREAM, TOOL_GROUP, ToolCall, ToolResult, done_key, result_stream
from interlude.bus.dead_letter import dead_letter
from interlude.bus.streams import (
    StreamEntry,
    ack_and_delete,
    as_text,
    ensure_group,
    group_vanished,
    stream_entries,
)

# KEYS: done key, result stream, call stream.
# ARGV: group, call entry id, done ttl, worker, v, body, result stream ttl.
_POST = """
local fresh = redis.call('SET', KEYS[1], ARGV[4], 'NX', 'EX', ARGV[3])
if fresh then
  redis.call('XADD', KEYS[2], '*', 'v', ARGV[5], 'body', ARGV[6])
  redis.call('EXPIRE', KEYS[2], ARGV[7])
end
redis.call('XACK', KEYS[3], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[3], ARGV[2])
if fresh then return 1 end
return 0
"""


class WorkerBus:
    """One worker's connection to the call stream, as consumer `consumer` of `TOOL_GROUP`.

    Side effects: `setup` (and a read or a look at idle calls that finds the group gone)
    creates the call stream and group; `claim` counts a delivery of each entry it takes;
    `post`, `skip` and `dead_letter` acknowledge and delete call entries; `post` and
    `dead_letter` append to engines' result streams and set done keys (`done_ttl_s`), and push
    the result stream's expiry out to `result_ttl_s`. Connection errors reach the caller,
    which decides whether to retry; a vanished group is recreated here and reads as no calls.
    """

    def __init__(self, redis: Redis, consumer: str, done_ttl_s: int, result_ttl_s: int) -> None:
        if min(done_ttl_s, result_ttl_s) < 1:
            raise ValueError("the done and result-stream TTLs of a WorkerBus must be >= 1 s")
        self.redis = redis
        self.consumer = consumer
        self.done_ttl_s = done_ttl_s
        # Each post pushes the result stream's expiry out, so only the stream of an engine
        # that is gone for good (no reads, no new results) disappears. An engine that comes
        # back later recreates its group (NOGROUP) and loses nothing it was still waiting on.
        self.result_ttl_s = result_ttl_s

    async def setup(self) -> None:
        await ensure_group(self.redis, CALL_STREAM, TOOL_GROUP)

    async def read(self, count: int, block_ms: int) -> list[StreamEntry]:
        """Up to `count` calls not delivered to anyone yet, waiting up to `block_ms`."""
        try:
            reply = await self.redis.xreadgroup(
                TOOL_GROUP, self.consumer, {CALL_STREAM: ">"}, count=count, block=block_ms
            )
        except ResponseError as exc:
            if not group_vanished(exc):
                raise
            await self.setup()
            return []
        return stream_entries(reply)

    async def idle(self, count: int, idle_ms: int) -> list[dict[str, Any]]:
        """Up to `count` pending calls idle at least `idle_ms`, oldest first, each with its
        `message_id` and `times_delivered` (XPENDING: looking counts no delivery)."""
        try:
            return cast(
                list[dict[str, Any]],
                await self.redis.xpending_range(
                    CALL_STREAM, TOOL_GROUP, "-", "+", count, idle=idle_ms
                ),
            )
        except ResponseError as exc:
            if not group_vanished(exc):
                raise
            await self.setup()
            return []

    async def claim(self, entry_ids: Sequence[str], idle_ms: int) -> list[StreamEntry]:
        """Take over the entries still idle `idle_ms` (XCLAIM: one more delivery each); an entry
        deleted meanwhile is left out of the answer."""
        reply = await self.redis.xclaim(
            CALL_STREAM, TOOL_GROUP, self.consumer, idle_ms, list[Any](entry_ids)
        )
        rows = cast(list[tuple[Any, Any]], reply)
        return [(as_text(i), f or None) for i, f in rows]

    async def answered(self, call: ToolCall) -> bool:
        """Whether a result for `call` was posted already (its done key is set)."""
        return bool(await self.redis.exists(done_key(call.call_id)))

    async def post(self, call: ToolCall, entry_id: str, result: ToolResult) -> bool:
        """Post `result` to the call's engine and acknowledge the call (`_POST`); whether it
        was the first post."""
        fields = result.encode()
        fresh = await self.redis.eval(
            _POST,
            3,
            done_key(call.call_id),
            result_stream(call.engine_id),
            CALL_STREAM,
            TOOL_GROUP,
            entry_id,
            self.done_ttl_s,
            self.consumer,
            fields["v"],
            fields["body"],
            self.result_ttl_s,
        )
        return bool(fresh)

    async def skip(self, entry_id: str) -> None:
        """Acknowledge and delete a call without posting (undecodable, or answered before)."""
        await ack_and_delete(self.redis, CALL_STREAM, TOOL_GROUP, entry_id)

    async def dead_letter(
        self, entry_id: str, fields: Mapping[Any, Any] | None, deliveries: int
    ) -> bool:
        """Move a poison call to the dead-letter stream and answer its engine (`dead_letter.py`);
        whether an error result was posted."""
        return await dead_letter(
            self.redis,
            self.consumer,
            entry_id,
            fields,
            deliveries,
            self.done_ttl_s,
            self.result_ttl_s,
        )
