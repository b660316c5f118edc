"""Per-key request rate limits shared by every gateway replica, with no Redis round trip on most
requests: leased quota (as Envoy's rate-limit quota service hands out quota to its proxies).

Each replica takes a lease of several requests at once from the shared count (`quota.py`: a
sliding-window counter in Redis) and admits from it locally until it runs out. Per key it keeps
the current window's index and the requests left from its leases; a check is

1. admitted, with no I/O, while a request is left from a lease taken in this window;
2. refused, with no I/O, until the estimate the store last refused on decays to leave room
   for one (other replicas' grants only raise it: the store would refuse too);
3. otherwise one lease round trip (concurrent checks of one key share it): it asks for
   max(1, limit // 100) requests, and the store grants at most an eighth of the room left (at
   least 1 while there is room for one), counted in this window; a grant of 0 is a refusal,
   whose retry-after is when the sliding estimate will leave room for one request.

So small limits are counted one request at a time (exactly), and large ones cost one round trip
per lease: at 600/minute, one per 6 requests; at 100,000/minute, one per 1,000. Invariant,
across any number of replicas: a request is admitted only from a grant already counted in the
window it is admitted in, so the sliding estimate of the admitted requests never exceeds the
limit; what a replica leased and had not used when its window turned is lost (at most one
lease per replica and window). Without Redis the counts live in this process.

The limit applies per API key (per client address when auth is off). The windows follow the
replicas' clocks, which must agree to well within a period (NTP does).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from interlude.gateway.quota import Grant, MemoryQuota, QuotaStore, RedisQuota, Window

_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
_RATE = re.compile(r"(\d+)\s*(?:/|\s+per\s+)\s*(\d*)\s*(second|minute|hour|day)s?", re.IGNORECASE)
# A lease is at most this share of the limit (and the store grants at most 1/8 of the room).
LEASE_SHARE = 0.01
MAX_KEYS = 100_000  # keys whose lease a replica remembers (the least recently used go first)


@dataclass(frozen=True)
class Rate:
    """`amount` requests per `period_s` seconds."""

    amount: int
    period_s: float

    def __post_init__(self) -> None:
        if self.amount < 1 or self.period_s <= 0:
            raise ValueError(f"a rate needs amount >= 1 and period > 0, got {self}")

    @classmethod
    def parse(cls, text: str) -> Rate:
        """'600/minute', '10 per second', '5/2 minutes' (5 every 2 minutes); ValueError else."""
        m = _RATE.fullmatch(text.strip())
        if m is None:
            raise ValueError(
                f"rate limit {text!r}: want N/unit, N per unit or N/M units "
                "(unit: second, minute, hour or day), e.g. 600/minute"
            )
        amount, count, unit = m.groups()
        return cls(int(amount), (int(count) if count else 1) * _UNITS[unit.lower()])

    @property
    def lease(self) -> int:
        return max(1, int(self.amount * LEASE_SHARE))


@dataclass(frozen=True)
class Verdict:
    """Whether a request may pass, and what the client is told about its window."""

    allowed: bool
    limit: int
    remaining: int  # -1 when not known: a replica admitting from its lease does not ask
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


@dataclass
class _Lease:
    window: int
    left: int = 0
    refused_until: float = float("-inf")  # clock time before which the key is refused


class RateLimiter:
    """`check(who)` counts one request for `who` and says whether it is within the limit.

    Side effects: a lease round trip to the store when `who` has none left (concurrent checks
    of one key share it). A round trip that fails or takes longer than `timeout_s` (a server
    that hangs: stopped, or cut off without a reset) raises `StoreAway`, and so does every
    check that would need the store for the next `pause_s`, without trying: the caller fails
    open, and requests do not each wait out a hung server. Checks this replica can answer
    alone (a lease left, a refusal still standing) are answered as ever.
    """

    def __init__(
        self,
        rate: str,
        redis_url: str = "",
        timeout_s: float = 0.5,
        pause_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout_s = timeout_s
        self.pause_s = pause_s
        self.clock = clock
        self._away_until = float("-inf")
        self.rate = Rate.parse(rate)  # ValueError for a malformed rate, at start-up
        self.store: QuotaStore = _store(redis_url)
        self.round_trips = 0  # leases asked of the store
        self._leases: OrderedDict[str, _Lease] = OrderedDict()
        self._asking: dict[str, asyncio.Future[None]] = {}
        self._admitted = Verdict(True, self.rate.amount, -1, 0.0)

    async def check(self, who: str) -> Verdict:
        # Most checks end in `_local`, with no task, timer or I/O, whatever the store's state:
        # a key known to be over its limit stays refused while the store is away.
        verdict = self._local(who, self.clock())
        return verdict if verdict is not None else await self._check(who)

    def _local(self, who: str, now: float) -> Verdict | None:
        """The verdict this replica gives without the store: admitted from its lease, or
        refused until the estimate it was last told of has room; None: ask the store."""
        lease = self._lease_of(who, math.floor(now / self.rate.period_s))
        if lease.left > 0:
            lease.left -= 1
            return self._admitted
        if now < lease.refused_until:
            return self._refused(lease.refused_until - now)
        return None

    async def _check(self, who: str) -> Verdict:
        while True:
            now = self.clock()
            verdict = self._local(who, now)
            if verdict is not None:
                return verdict
            if time.monotonic() < self._away_until:
                raise StoreAway("the rate-limit storage failed lately: not asked again yet")
            asking = self._asking.get(who)
            if asking is not None:  # another check of this key is leasing: share its answer
                await asyncio.shield(asking)  # bounded by that check's timeout
                continue
            window = Window.at(now, self.rate.period_s)
            lease = self._lease_of(who, window.index)
            grant = await self._ask(who, window)
            if not grant.granted:
                wait = grant.retry_after_s(self.rate.amount, window, self.rate.period_s)
                lease.refused_until = now + wait
                return self._refused(wait)
            # Into this window's lease; if the window turned meanwhile, it is lost (counted in
            # the window it was leased in, so the limit holds).
            lease.left += grant.granted

    def _lease_of(self, who: str, window: int) -> _Lease:
        lease = self._leases.get(who)
        if lease is not None and lease.window == window:
            self._leases.move_to_end(who)
            return lease
        self._leases.pop(who, None)  # a new window: what was left is lost
        lease = self._leases[who] = _Lease(window)
        while len(self._leases) > MAX_KEYS:
            self._leases.popitem(last=False)
        return lease

    async def _ask(self, who: str, window: Window) -> Grant:
        """One lease round trip, within `timeout_s`; StoreAway (and the pause) when it fails.
        Only the store's own failure counts: a check that waited for another's lease did not
        ask. `asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` drops a cancellation
        that lands as its call completes (a client leaving, `chat_route`)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asking[who] = done
        self.round_trips += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.store.lease(
                    who, window, self.rate.lease, self.rate.amount, self.rate.period_s
                )
        except Exception as exc:  # any failure of the storage: the caller fails open
            self._away_until = time.monotonic() + self.pause_s
            raise StoreAway(f"rate-limit storage: {exc!r}") from exc
        finally:
            del self._asking[who]
            done.set_result(None)  # the sharers look again (and fail at once, on a failure)

    def _refused(self, wait_s: float) -> Verdict:
        return Verdict(False, self.rate.amount, 0, max(0.0, wait_s))

    async def close(self) -> None:
        await self.store.close()


def _store(redis_url: str) -> QuotaStore:
    if not redis_url:
        return MemoryQuota()
    from interlude.bus.streams import connect  # redis-py, with Sentinel URLs followed

    return RedisQuota(connect(redis_url, max_connections=16))
