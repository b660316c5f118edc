"""Reaching the tool bus's primary through Valkey Sentinel (`interlude.api.redis_url`), so a
failover is followed, not an outage.

Each new connection asks a sentinel where the primary is now, and a connection to a node that
is no longer primary is dropped (redis-py's `SentinelConnectionPool`), so after a failover the
next command reaches the new primary. As with `connect`'s plain URLs, the pool makes a command
wait for a free connection instead of failing past its cap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from interlude.api.redis_url import parse


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Sentinel's pool (where the primary is, drop connections to a former one) with the
    blocking pool's wait for a free connection (`connect`)."""


def sentinel_client(url: str, max_connections: int, **options: Any) -> Redis:
    """A client of the primary that `url`'s sentinels name, following failovers."""
    spec = parse(url)
    # Through a typed name: redis-py before 8.2 leaves `Sentinel.__init__` unannotated, later
    # ones annotate it, and a `type: ignore` would be an error under one or the other.
    make_sentinel: Callable[..., Sentinel] = Sentinel
    sentinel = make_sentinel(list(spec.sentinels), sentinel_kwargs={"socket_timeout": 2.0})
    client: Redis = sentinel.master_for(
        spec.service,
        connection_pool_class=_BlockingSentinelPool,
        max_connections=max_connections,
        timeout=None,
        db=spec.db,
        username=spec.username,
        password=spec.password,
        **options,
    )
    return client
