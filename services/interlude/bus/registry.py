"""Which tools the deployment runs server-side: the tools its tools-svc workers publish.

The Redis hash `interlude:tools` maps a tool's name to a JSON entry
``{"description", "parameters" (JSON schema), "worker", "updated_at"}``. Workers publish their
tools when they start and refresh them every `REFRESH_S`; readers ignore entries older than
`TTL_S`, so the tools of a deployment whose workers are all gone stop being server-side within
a minute. The caller of an API never decides this: a tool it declares runs server-side only if
a worker publishes that name.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

KEY = "interlude:tools"
REFRESH_S = 10.0
TTL_S = 60.0
CACHE_S = 2.0  # how stale a reader's cached view may be (`PublishedTools`)


@dataclass(frozen=True)
class ToolSpec:
    """A published tool: what the model is told about it."""

    name: str
    description: str
    parameters: Mapping[str, Any]


async def publish(redis: Redis, specs: Iterable[ToolSpec], worker: str) -> None:
    """Publish (or refresh) `specs` as run by `worker`."""
    now = time.time()
    entries: dict[str | bytes, str | bytes] = {
        s.name: json.dumps(
            {
                "description": s.description,
                "parameters": dict(s.parameters),
                "worker": worker,
                "updated_at": now,
            }
        )
        for s in specs
    }
    if entries:
        await redis.hset(KEY, mapping=entries)  # type: ignore[arg-type]


async def published(redis: Redis, ttl_s: float = TTL_S) -> dict[str, ToolSpec]:
    """The tools some worker refreshed within `ttl_s`."""
    raw = await redis.hgetall(KEY)
    now = time.time()
    out: dict[str, ToolSpec] = {}
    for name, text in raw.items():
        name = name.decode() if isinstance(name, bytes) else name
        try:
            entry = json.loads(text)
            fresh = now - float(entry["updated_at"]) <= ttl_s
        except (ValueError, KeyError, TypeError):
            continue  # a malformed entry publishes nothing
        if fresh:
            out[name] = ToolSpec(
                name, str(entry.get("description", "")), entry.get("parameters") or {}
            )
    return out


class PublishedTools:
    """A cached view of `published` for a hot path (one Redis read per `max_age_s`).

    Side effects: a Redis read when the cache is older than `max_age_s`; a failed read keeps
    the last known set (the bus being away must not turn server tools into client ones).
    """

    def __init__(self, redis: Redis, max_age_s: float = CACHE_S) -> None:
        self.redis = redis
        self.max_age_s = max_age_s
        self._names: frozenset[str] = frozenset()
        self._at = float("-inf")

    async def names(self) -> frozenset[str]:
        if time.monotonic() - self._at >= self.max_age_s:
            try:
                self._names = frozenset(await published(self.redis))
            except (RedisError, OSError) as exc:
                log.warning("could not read the published tools (keeping the last known): %s", exc)
            # Failed or not, the next read waits `max_age_s`: a bus that is away must not cost
            # every turn a connection attempt.
            self._at = time.monotonic()
        return self._names
