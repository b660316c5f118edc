"""Which tools the deployment runs server-side: reading and writing the published-tools hash
(its format is `interlude.api.tools`). The caller of an API never decides this: a tool it
declares runs server-side only if a worker publishes that name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from interlude.api.tools import CACHE_S, KEY, TTL_S, ToolSpec, decode_entry, encode_entry

log = logging.getLogger(__name__)


async def publish(redis: Redis, specs: Iterable[ToolSpec], worker: str) -> None:
    """Publish (or refresh) `specs` as run by `worker`."""
    now = time.time()
    entries: dict[str | bytes, str | bytes] = {s.name: encode_entry(s, worker, now) for s in specs}
    if entries:
        await redis.hset(KEY, mapping=entries)  # type: ignore[arg-type]


async def published(redis: Redis, ttl_s: float = TTL_S) -> dict[str, ToolSpec]:
    """The tools some worker refreshed within `ttl_s`."""
    raw = await redis.hgetall(KEY)
    now = time.time()
    out: dict[str, ToolSpec] = {}
    for name, text in raw.items():
        name = name.decode() if isinstance(name, bytes) else name
        spec = decode_entry(name, text, now, ttl_s)
        if spec is not None:
            out[name] = spec
    return out


class PublishedTools:
    """A cached view of `published` for a hot path (one Redis read per `max_age_s`).

    Side effects: a Redis read when the cache is older than `max_age_s`; a failed read keeps
    the last known set (the bus being away must not turn server tools into client ones). A
    read waits at most `read_timeout_s`: a server that hangs (stopped, or cut off without a
    reset) must not hang the turns and readiness probes that ask, as a refused one does not.
    """

    def __init__(
        self, redis: Redis, max_age_s: float = CACHE_S, read_timeout_s: float = 1.0
    ) -> None:
        self.redis = redis
        self.max_age_s = max_age_s
        self.read_timeout_s = read_timeout_s
        self._names: frozenset[str] = frozenset()
        self._at = float("-inf")

    async def names(self) -> frozenset[str]:
        if time.monotonic() - self._at >= self.max_age_s:
            try:
                read = published(self.redis)
                self._names = frozenset(await asyncio.wait_for(read, self.read_timeout_s))
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("could not read the published tools (keeping the last known): %r", exc)
            # Failed or not, the next read waits `max_age_s`: a bus that is away must not cost
            # every turn a connection attempt.
            self._at = time.monotonic()
        return self._names
