"""Where the gateway remembers sessions paused for their client, until the client comes back.

A record is written when a leg ends paused for client-side tools, under the conversation's key
(`conversation.conversation_key`) and, when the client named one, under its session id as well.
A resume *takes* the record (read and delete in one step), so two racing requests cannot both
resume one engine session. Records expire with the engine's own client deadline: after it the
engine has failed the session and freed its KV, so the record would only send a resume to 404.

Two stores behind one Protocol: Redis (any gateway replica can resume any session) and an
in-process dict (one gateway, nothing else to run).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Protocol

from redis.asyncio import Redis

KEY_PREFIX = "interlude:gw:paused:"
ALIAS_PREFIX = "interlude:gw:alias:"


@dataclass(frozen=True)
class PausedSession:
    """An engine session waiting for its client's tool results."""

    engine: str  # base URL of the engine that holds the session
    session_id: str  # the engine's id for it
    key: str  # conversation key up to and including the assistant's calls
    call_ids: tuple[str, ...]  # the calls the client must answer
    model: str
    # Session counters at the pause, so the next leg reports its own usage.
    prompt_tokens: int
    completion_tokens: int
    tool_tokens: int
    expires_at: float  # wall clock; the engine fails the session then

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> PausedSession:
        d = json.loads(text)
        d["call_ids"] = tuple(d["call_ids"])
        return cls(**d)


class SessionStore(Protocol):
    """Paused sessions by conversation key and by client session id.

    Invariants: `take_*` returns a record at most once (it is deleted as it is read); a
    record past `expires_at` is never returned.
    """

    async def put(self, session: PausedSession, alias: str | None = None) -> None: ...

    async def take(self, key: str) -> PausedSession | None: ...

    async def take_alias(self, alias: str) -> PausedSession | None: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Paused sessions in this process (one gateway replica)."""

    def __init__(self) -> None:
        self._by_key: dict[str, PausedSession] = {}
        self._alias: dict[str, str] = {}

    async def put(self, session: PausedSession, alias: str | None = None) -> None:
        self._sweep()
        self._by_key[session.key] = session
        if alias:
            self._alias[alias] = session.key

    async def take(self, key: str) -> PausedSession | None:
        s = self._by_key.pop(key, None)
        return s if s is not None and s.expires_at > time.time() else None

    async def take_alias(self, alias: str) -> PausedSession | None:
        key = self._alias.pop(alias, None)
        return None if key is None else await self.take(key)

    async def close(self) -> None:
        self._by_key.clear()

    def _sweep(self) -> None:
        now = time.time()
        for k in [k for k, s in self._by_key.items() if s.expires_at <= now]:
            del self._by_key[k]
        self._alias = {a: k for a, k in self._alias.items() if k in self._by_key}


class RedisStore:
    """Paused sessions in Redis, shared by every gateway replica; Redis expires them."""

    def __init__(self, url: str) -> None:
        self.redis = Redis.from_url(url)

    async def put(self, session: PausedSession, alias: str | None = None) -> None:
        ttl_ms = max(1, int((session.expires_at - time.time()) * 1000))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(KEY_PREFIX + session.key, session.to_json(), px=ttl_ms)
            if alias:
                pipe.set(ALIAS_PREFIX + alias, session.key, px=ttl_ms)
            await pipe.execute()

    async def take(self, key: str) -> PausedSession | None:
        raw = await self.redis.getdel(KEY_PREFIX + key)
        return None if raw is None else PausedSession.from_json(raw)

    async def take_alias(self, alias: str) -> PausedSession | None:
        key = await self.redis.getdel(ALIAS_PREFIX + alias)
        return (
            None
            if key is None
            else await self.take(key.decode() if isinstance(key, bytes) else key)
        )

    async def close(self) -> None:
        await self.redis.aclose()


def make_store(redis_url: str) -> SessionStore:
    return RedisStore(redis_url) if redis_url else MemoryStore()
