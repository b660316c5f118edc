"""Who may call, and how often: API keys, failed attempts per address and per-key rate limits,
as one FastAPI dependency."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from fastapi import Request

from interlude.api.engine import NO_CAPS, Caps
from interlude.gateway.auth import ALL_TOOLS, KeyStore, StoredKey
from interlude.gateway.metrics import STORE_ERRORS
from interlude.gateway.ratelimit import RateLimiter, StoreAway

log = logging.getLogger(__name__)


class Denied(Exception):
    """The caller may not pass: 401 (no or bad key) or 429 (over the limit)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass(frozen=True)
class Caller:
    """An admitted caller: its key's name (or address), the rate-limit headers to return, the
    server-side tools it may run (None: every published one) and its caps on each engine."""

    name: str
    headers: dict[str, str] = field(default_factory=dict)
    tools: frozenset[str] | None = None
    caps: Caps = NO_CAPS


class FailedAttempts:
    """Failed key checks per client address, in a sliding window.

    Side effects: none beyond its own memory, which holds at most `max_addresses` addresses
    (the least recently failing go first). Invariant: an address with `limit` failures in the
    last `window_s` seconds is `blocked` until the oldest of them ages out.
    """

    def __init__(self, limit: int = 20, window_s: float = 60.0, max_addresses: int = 10_000):
        if limit < 1 or window_s <= 0 or max_addresses < 1:
            raise ValueError("FailedAttempts needs limit >= 1, window_s > 0, max_addresses >= 1")
        self.limit, self.window_s, self.max_addresses = limit, window_s, max_addresses
        self._by_address: OrderedDict[str, deque[float]] = OrderedDict()

    def blocked(self, address: str, now: float | None = None) -> float:
        """Seconds until `address` may try again (0.0: it may now)."""
        times = self._by_address.get(address)
        if not times:
            return 0.0
        now = time.monotonic() if now is None else now
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times[0] + self.window_s - now if len(times) >= self.limit else 0.0

    def failed(self, address: str, now: float | None = None) -> None:
        times = self._by_address.pop(address, None) or deque(maxlen=self.limit)
        times.append(time.monotonic() if now is None else now)
        self._by_address[address] = times
        while len(self._by_address) > self.max_addresses:
            self._by_address.popitem(last=False)


class Guard:
    """Checks a request's API key (when `keys` is set) and its rate limit (when `limiter`).

    Side effects: one rate-limit count per admitted call. Invariant: a request without a valid
    key is refused before it is counted or routed.
    """

    def __init__(
        self,
        keys: KeyStore | None,
        limiter: RateLimiter | None,
        failures: FailedAttempts | None = None,
        default_tools: frozenset[str] = frozenset({ALL_TOOLS}),
        default_caps: Caps = NO_CAPS,
    ) -> None:
        """`default_tools`: what a key without its own list (or any caller, without keys) may
        run server-side; {"*"}: every published tool. `default_caps`: the caps of a key
        without its own (each cap on its own: a key may set one and take the other's)."""
        self.keys = keys
        self.limiter = limiter
        self.failures = failures or FailedAttempts()
        self.default_tools = default_tools
        self.default_caps = default_caps

    async def __call__(self, request: Request) -> Caller:
        return await self.admit(request.headers, request.client.host if request.client else "")

    async def admit(self, headers: Mapping[str, str], address: str) -> Caller:
        """The caller of a request with these `headers` from `address` ("" unknown); Denied
        when it may not pass. The FastAPI dependency and the endpoint picker both call it."""
        who = address or "unknown"
        tools, caps = self.default_tools, self.default_caps
        if self.keys is not None:
            key = await self._authenticate(headers, who)
            who, tools = key.name, self.default_tools if key.tools is None else key.tools
            caps = Caps(
                caps.sessions if key.sessions is None else key.sessions,
                caps.tool_calls if key.tool_calls is None else key.tool_calls,
            )
        allowed = None if ALL_TOOLS in tools else tools
        if self.limiter is None:
            return Caller(who, tools=allowed, caps=caps)
        try:
            verdict = await self.limiter.check(who)
        except StoreAway as exc:  # the limits storage is away: fail open, counted
            if exc.__cause__ is not None:  # the failure itself, not a skip after it
                log.warning("rate-limit storage unreachable, not limiting: %s", exc)
            STORE_ERRORS.inc()
            return Caller(who, tools=allowed, caps=caps)
        if not verdict.allowed:
            raise Denied(429, f"rate limit reached for {who!r}", verdict.headers())
        return Caller(who, verdict.headers(), allowed, caps)

    async def _authenticate(self, headers: Mapping[str, str], address: str) -> StoredKey:
        """The caller's key; Denied 401 for no or a bad key, 429 for a bad key from an
        address that failed too often lately. A valid key always passes: many clients may
        share one address (a NAT, a node's SNAT), and checking a key costs a microsecond."""
        assert self.keys is not None
        presented = _presented_key(headers)
        if not presented:
            raise Denied(401, "missing API key: send 'Authorization: Bearer <key>'")
        wait = self.failures.blocked(address)
        slow = self.keys.slow(presented)
        if slow and wait:  # an old scrypt entry: no scrypt for an address that keeps failing
            raise _too_many(wait)
        if slow:  # and not on the loop that relays tokens
            key = await self._verify_slowly(presented, address)
        else:
            key = self.keys.verify_key(presented)
            if key is None:
                self.failures.failed(address)
        if key is None:
            raise _too_many(wait) if wait else Denied(401, "invalid API key")
        return key

    async def _verify_slowly(self, presented: str, address: str) -> StoredKey | None:
        """An old scrypt entry's check, in a thread. Its failure counts against the address
        when the check ends, even if the caller left meanwhile (the chat route cancels a
        request whose client went away): a client hanging up after each guess must still
        run into the per-address block."""
        assert self.keys is not None
        verifying = asyncio.ensure_future(asyncio.to_thread(self.keys.verify_key, presented))

        def count(task: asyncio.Future[StoredKey | None]) -> None:
            if not task.cancelled() and task.exception() is None and task.result() is None:
                self.failures.failed(address)

        verifying.add_done_callback(count)
        return await asyncio.shield(verifying)


def _too_many(wait: float) -> Denied:
    retry = {"retry-after": str(max(1, round(wait)))}
    return Denied(429, "too many failed API-key attempts from this address", retry)


def _presented_key(headers: Mapping[str, str]) -> str:
    """The API key a request carries: `Authorization: Bearer <key>`, else `api-key`."""
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("api-key", "").strip()  # Azure-style clients
