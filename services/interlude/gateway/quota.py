"""Where every gateway replica's rate-limit counts meet: a sliding-window counter per key, handed
out in leases (`ratelimit.RateLimiter` admits from a lease locally).

The count is Cloudflare's sliding-window approximation: fixed windows of the rate's period, and
an estimate of the last period's requests of

    estimate = previous window's count x (1 - elapsed share of this window) + this window's count

A lease asks for `want` requests; the store grants g = min(want, max(1, floor(room / 8))) while
room = limit - estimate is at least 1, adds g to this window's count, and grants 0 otherwise.
Leases shrink as the room does (an eighth of it at most), so the last requests of a window go
one by one and replicas holding leases at a window's turn leave little of the limit unused; no
grant ever takes the estimate past the limit.

`RedisQuota` keeps the counts in Redis (one Lua script per lease: atomic across replicas);
`MemoryQuota` in this process (one replica, or tests).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

KEY_PREFIX = "interlude:rl:"  # then {who}:<window index>

# One script call per lease: read both windows, grant, count, expire; returns the grant and the
# two counts before it (for the refused caller's retry-after).
_LEASE = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local room = tonumber(ARGV[1]) - (prev * tonumber(ARGV[3]) + cur)
local grant = 0
if room >= 1 then
  grant = math.min(tonumber(ARGV[2]), math.max(1, math.floor(room / 8)))
  redis.call('INCRBY', KEYS[1], grant)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return {grant, prev, cur}
"""


@dataclass(frozen=True)
class Window:
    """Where `now` falls for a rate of `period_s`: the window's index and the previous
    window's weight in the estimate (1 at the window's start, 0 at its end)."""

    index: int
    weight: float

    @classmethod
    def at(cls, now: float, period_s: float) -> Window:
        index = math.floor(now / period_s)
        return cls(index, 1.0 - (now / period_s - index))


@dataclass(frozen=True)
class Grant:
    """A lease's answer: `granted` requests (0: refused), and the counts it was judged on."""

    granted: int
    previous: int
    current: int

    def retry_after_s(self, limit: int, window: Window, period_s: float) -> float:
        """Seconds until the estimate leaves room for one request, if nobody else asks: the
        previous window's weight decays through this window, and in the next one this
        window's count becomes the decaying one."""
        share = 1.0 - window.weight  # elapsed share of this window
        room_needed = limit - 1
        if self.current <= room_needed:
            if self.previous <= 0:
                return 0.0
            need = 1.0 - (room_needed - self.current) / self.previous
            return max(0.0, (need - share) * period_s)
        need_next = 1.0 - room_needed / self.current
        return (1.0 - share + need_next) * period_s


def grant_for(limit: int, want: int, weight: float, previous: int, current: int) -> int:
    """What a lease of `want` gets (the rule the Lua script applies too)."""
    room = limit - (previous * weight + current)
    return min(want, max(1, math.floor(room / 8))) if room >= 1 else 0


class QuotaStore(Protocol):
    """Shared counts of admitted requests per key and window.

    Side effects: `lease` adds its grant to the key's current window. Invariant: the estimate
    after a grant never exceeds `limit`; a window's count is kept for two periods.
    """

    async def lease(
        self, who: str, window: Window, want: int, limit: int, period_s: float
    ) -> Grant: ...

    async def close(self) -> None: ...


class RedisQuota:
    """The counts in Redis, shared by every replica: keys `interlude:rl:{who}:<window>` (both
    of a key's windows in one hash slot, for Redis Cluster)."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.script = redis.register_script(_LEASE)

    async def lease(
        self, who: str, window: Window, want: int, limit: int, period_s: float
    ) -> Grant:
        keys = [f"{KEY_PREFIX}{{{who}}}:{i}" for i in (window.index, window.index - 1)]
        ttl_ms = math.ceil(2 * period_s * 1000)
        granted, previous, current = await self.script(
            keys=keys, args=[limit, want, repr(window.weight), ttl_ms]
        )
        return Grant(int(granted), int(previous), int(current))

    async def close(self) -> None:
        await self.redis.aclose()


class MemoryQuota:
    """The counts in this process: exact for one replica. Holds at most `max_keys` keys (the
    least recently asked go first)."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._counts: OrderedDict[str, dict[int, int]] = OrderedDict()

    async def lease(
        self, who: str, window: Window, want: int, limit: int, period_s: float
    ) -> Grant:
        counts = self._counts.pop(who, {})
        counts = {i: n for i, n in counts.items() if i >= window.index - 1}
        previous, current = counts.get(window.index - 1, 0), counts.get(window.index, 0)
        granted = grant_for(limit, want, window.weight, previous, current)
        counts[window.index] = current + granted
        self._counts[who] = counts
        while len(self._counts) > self.max_keys:
            self._counts.popitem(last=False)
        return Grant(granted, previous, current)

    async def close(self) -> None:
        self._counts.clear()
