"""Per-key request rate limits, kept in Redis so every gateway replica shares one count.

A moving window from the `limits` library (its async Redis storage); without Redis the counts
live in this process. The limit applies per API key (per client address when auth is off).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from limits import parse
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string

from interlude.api.redis_url import SCHEME as SENTINEL
from interlude.api.redis_url import parse as parse_url


@dataclass(frozen=True)
class Verdict:
    """Whether a request may pass, and what the client is told about its window."""

    allowed: bool
    limit: int
    remaining: int  # -1 when not read (an admitted request costs one round trip, not two)
    reset_s: float  # seconds until the window has room again (when refused)

    def headers(self) -> dict[str, str]:
        out = {"x-ratelimit-limit-requests": str(self.limit)}
        if not self.allowed:
            out["x-ratelimit-remaining-requests"] = "0"
            out["x-ratelimit-reset-requests"] = f"{self.reset_s:.3f}s"
            out["retry-after"] = str(max(1, round(self.reset_s)))
        return out


class StoreAway(RuntimeError):
    """The limits storage failed, timed out, or is being skipped after it did."""


class RateLimiter:
    """`check(who)` counts one request for `who` and says whether it is within the limit.

    Side effects: one Redis round trip per admitted request; a refused one also reads the
    window (for `retry-after`). A round trip that fails or takes longer than `timeout_s` (a
    server that hangs: stopped, or cut off without a reset) raises `StoreAway`, and so does
    every check for the next `pause_s`, without trying: the caller fails open, and requests
    do not each wait out a hung server.
    """

    def __init__(
        self, rate: str, redis_url: str = "", timeout_s: float = 0.5, pause_s: float = 5.0
    ) -> None:
        self.timeout_s = timeout_s
        self.pause_s = pause_s
        self._away_until = float("-inf")
        self.item = parse(rate)  # ValueError for a malformed rate, at start-up
        if redis_url.startswith(SENTINEL + "://"):
            uri, options = _sentinel(redis_url)
            self.storage = storage_from_string(uri, **options)
        elif redis_url:
            unix = redis_url.startswith("unix://")
            uri = "async+redis+" + redis_url if unix else "async+" + redis_url
            self.storage = storage_from_string(uri)
        else:
            self.storage = MemoryStorage()
        self.limiter = MovingWindowRateLimiter(self.storage)

    async def check(self, who: str) -> Verdict:
        if time.monotonic() < self._away_until:
            raise StoreAway("the rate-limit storage failed lately: not asked again yet")
        try:
            return await asyncio.wait_for(self._check(who), self.timeout_s)
        except Exception as exc:  # any failure of the storage: the caller fails open
            self._away_until = time.monotonic() + self.pause_s
            raise StoreAway(f"rate-limit storage: {exc!r}") from exc

    async def _check(self, who: str) -> Verdict:
        if await self.limiter.hit(self.item, "gateway", who):
            return Verdict(True, self.item.amount, -1, 0.0)
        stats = await self.limiter.get_window_stats(self.item, "gateway", who)
        return Verdict(False, self.item.amount, 0, max(0.0, stats.reset_time - time.time()))


def _sentinel(url: str) -> tuple[str, dict[str, float | str | bool]]:
    """The `limits` storage for the primary that `url`'s sentinels name
    (`interlude.api.redis_url`): the credentials go to the data nodes only (none in the URI, so
    none to the sentinels), and every read goes to the primary (a replica's count may lag a hit
    just made)."""
    spec = parse_url(url)
    hosts = ",".join(f"{host}:{port}" for host, port in spec.sentinels)
    options: dict[str, float | str | bool] = {
        "service_name": spec.service,
        "use_replicas": False,
        "db": spec.db,
    }
    options |= {k: v for k, v in (("username", spec.username), ("password", spec.password)) if v}
    return f"async+redis+sentinel://{hosts}", options
