"""Redis Streams helpers both halves of the tool bus use: the engine's (`engine_side.py`) and
the worker's (`worker_side.py`). A client made by `connect`, the backoff every retry loop
shares, group creation, reading replies in either protocol version, acknowledging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ResponseError

from interlude.api.redis_url import SCHEME as SENTINEL_SCHEME
from interlude.bus.sentinel import sentinel_client

StreamEntry = tuple[str, Mapping[Any, Any] | None]


class Backoff:
    """Waits between tries against Redis: `first`, doubling, at most `cap`; `reset` after a
    try that worked. The engine's and the workers' retry loops all use one, so a restart of
    the server costs every client the same schedule."""

    def __init__(self, first: float = 0.05, cap: float = 5.0) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"Backoff needs 0 < first <= cap, got {first}, {cap}")
        self.first, self.cap = first, cap
        self.current = 0.0  # the last wait handed out (0: none since the last reset)

    def next(self) -> float:
        """The wait before the next try."""
        self.current = min(2 * self.current or self.first, self.cap)
        return self.current

    def reset(self) -> None:
        self.current = 0.0


def connect(url: str, max_connections: int = 64, **options: Any) -> Redis:
    """A client whose pool makes a command wait for a free connection instead of failing.

    redis-py's default pool raises "Too many connections" past its cap (100), so a burst of
    sessions pausing at once (or a worker's full concurrency) would turn into retried submits
    and posts; a blocking pool queues them in the client instead. A `redis+sentinel://` URL
    reaches the primary its sentinels name, and follows a failover (`bus/sentinel.py`).
    """
    options = {"decode_responses": True, **options}
    if url.startswith(SENTINEL_SCHEME + "://"):
        return sentinel_client(url, max_connections, **options)
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=None, **options
    )
    return Redis.from_pool(pool)


def redacted(url: str) -> str:
    """`url` fit for a log line: its password (an ACL user's, `bus/acl.py`) replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def as_text(value: object) -> str:
    """A reply value as str, whether or not the client was made with decode_responses=True."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def ensure_group(redis: Redis, stream: str, group: str) -> None:
    """Create `group` on `stream` (and the stream) unless it exists.

    The group starts at id "0", not "$": entries added before any reader existed (calls
    submitted before the first worker started) are still delivered. Acknowledged entries are
    deleted, so "0" never replays finished work.
    """
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def group_vanished(exc: ResponseError) -> bool:
    """The stream or group vanished (Redis restarted without persistence, or was flushed).

    NOGROUP answers a read on a missing group; UNBLOCKED ends a blocked read whose stream was
    deleted under it. Both mean: create the group again and read on.
    """
    return str(exc).startswith(("NOGROUP", "UNBLOCKED"))


def stream_entries(response: Any) -> list[StreamEntry]:
    """(entry id, fields) pairs from an XREADGROUP reply, RESP2 (list) or RESP3 (dict).

    Fields are None for a pending entry that was deleted since it was read.
    """
    if not response:
        return []
    streams = response.items() if isinstance(response, dict) else response
    out: list[StreamEntry] = []
    for _name, entries in streams:
        batches = entries if entries and isinstance(entries[0], list) else [entries]
        for batch in batches:
            out.extend((as_text(entry[0]), entry[1] or None) for entry in batch)
    return out


def raise_if_cancelled() -> None:
    """Re-raise a cancellation of the current task that a Redis command swallowed.

    redis-py (8.1) can absorb a cancellation that lands inside a command and return normally
    (seen in this project's tests); loops that must end when cancelled call this after each
    command, so that cancelling them always works.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def ack_and_delete(redis: Redis, stream: str, group: str, entry_id: str) -> None:
    """XACK then XDEL. A crash between the two leaves an acked entry no reader will see again."""
    await redis.xack(stream, group, entry_id)
    await redis.xdel(stream, entry_id)
