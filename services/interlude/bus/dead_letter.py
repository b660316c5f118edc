"""Poison calls: a call whose every delivery ended with its worker gone.

A call that crashes its worker (a segfaulting library, an out-of-memory kill) stays pending,
is reclaimed by another worker, crashes that one, and so on forever. Redis counts deliveries
per pending entry (XCLAIM adds one each time it hands the entry over), so a worker that
reclaims an entry delivered more than `max_deliveries` times does not run it: it moves the
call to `DEAD_LETTER_STREAM` and answers its engine with an error result the model sees, in
one Lua script (atomic, like the worker's post).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis

from interlude.api.bus import (
    CALL_STREAM,
    DEAD_LETTER_STREAM,
    TOOL_GROUP,
    ProtocolError,
    ToolCall,
    ToolResult,
    done_key,
    result_stream,
)
from interlude.bus.streams import as_text

log = logging.getLogger(__name__)

# The dead-letter stream keeps about this many calls (XADD MAXLEN ~): it is for a person to
# look at, and must not grow without bound if a tool starts crashing on every call.
DEAD_LETTER_MAXLEN = 10_000

# KEYS: done key, result stream, call stream, dead-letter stream.
# ARGV: group, call entry id, done ttl, worker, result v, result body, result stream ttl,
#       the call's fields as JSON, deliveries, the dead-letter stream's length cap.
# The result is posted only if no worker posted one (the done key, as in the worker's post);
# the call is recorded, acknowledged and deleted either way. A call whose fields cannot be
# decoded has no engine to answer (KEYS[2] is then the empty string).
_DEAD = """
local fresh = false
if KEYS[2] ~= '' then
  fresh = redis.call('SET', KEYS[1], ARGV[4], 'NX', 'EX', ARGV[3])
  if fresh then
    redis.call('XADD', KEYS[2], '*', 'v', ARGV[5], 'body', ARGV[6])
    redis.call('EXPIRE', KEYS[2], ARGV[7])
  end
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[10], '*', 'entry', ARGV[2], 'fields', ARGV[8],
  'deliveries', ARGV[9], 'worker', ARGV[4])
redis.call('XACK', KEYS[3], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[3], ARGV[2])
if fresh then return 1 end
return 0
"""


async def dead_letter(
    redis: Redis,
    worker: str,
    entry_id: str,
    fields: Mapping[Any, Any] | None,
    count: int,
    done_ttl_s: int,
    result_ttl_s: int,
) -> bool:
    """Move a poison call to the dead-letter stream and answer its engine; whether an error
    result was posted (False: answered before, or undecodable)."""
    raw = {as_text(k): as_text(v) for k, v in (fields or {}).items()}
    try:
        call: ToolCall | None = ToolCall.decode(fields or {})
    except ProtocolError:
        call = None
    keys = ["", "", CALL_STREAM, DEAD_LETTER_STREAM]
    result_v, result_body = "", ""
    if call is not None:
        message = (
            f"tool {call.tool!r}: the call was delivered {count} times and no worker "
            "survived running it; it was moved to the dead-letter stream"
        )
        encoded = ToolResult.failure(call, "tool_error", message, time.time()).encode()
        keys[:2] = [done_key(call.call_id), result_stream(call.engine_id)]
        result_v, result_body = encoded["v"], encoded["body"]
    fresh = await redis.eval(
        _DEAD,
        4,
        *keys,
        TOOL_GROUP,
        entry_id,
        done_ttl_s,
        worker,
        result_v,
        result_body,
        result_ttl_s,
        json.dumps(raw),
        count,
        DEAD_LETTER_MAXLEN,
    )
    log.warning(
        "call entry %s (%s) dead-lettered after %d deliveries",
        entry_id,
        call.call_id if call else "undecodable",
        count,
    )
    return bool(fresh)
