"""Who may call, and how often: API keys and per-key rate limits, as one FastAPI dependency."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from fastapi import Request

from interlude.gateway.auth import KeyStore
from interlude.gateway.metrics import STORE_ERRORS
from interlude.gateway.ratelimit import RateLimiter

log = logging.getLogger(__name__)


class Denied(Exception):
    """The caller may not pass: 401 (no or bad key) or 429 (over the limit)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass(frozen=True)
class Caller:
    """An admitted caller: its key's name (or address) and the rate-limit headers to return."""

    name: str
    headers: dict[str, str] = field(default_factory=dict)


class Guard:
    """Checks a request's API key (when `keys` is set) and its rate limit (when `limiter`).

    Side effects: one rate-limit count per admitted call. Invariant: a request without a valid
    key is refused before it is counted or routed.
    """

    def __init__(self, keys: KeyStore | None, limiter: RateLimiter | None) -> None:
        self.keys = keys
        self.limiter = limiter

    async def __call__(self, request: Request) -> Caller:
        who = request.client.host if request.client else "unknown"
        if self.keys is not None:
            presented = _presented_key(request)
            if not presented:
                raise Denied(401, "missing API key: send 'Authorization: Bearer <key>'")
            name = self.keys.verify(presented)
            if name is None:
                raise Denied(401, "invalid API key")
            who = name
        if self.limiter is None:
            return Caller(who)
        try:
            verdict = await self.limiter.check(who)
        except Exception as exc:  # the limits storage is away: fail open, loudly
            log.warning("rate-limit storage unreachable, not limiting: %s", exc)
            STORE_ERRORS.inc()
            return Caller(who)
        if not verdict.allowed:
            raise Denied(429, f"rate limit reached for {who!r}", verdict.headers())
        return Caller(who, verdict.headers())


def _presented_key(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("api-key", "").strip()  # Azure-style clients
