"""A tenant's caps on this engine (`api.engine.Caps`, which the gateway sends per API key).

* **Live sessions.** `SessionManager` counts each tenant's sessions from submit to their end
  (generating, waiting for a server-side tool, or parked for the client's tool results until
  it resumes them, moves on, or its client deadline passes). `ChatService.open` refuses a
  request that would start more than the cap with `TooManySessions`: HTTP 429 in OpenAI's
  envelope, code `too_many_sessions`. A continuation that resumes its session starts none.
* **Server-side tool calls in flight.** A call beyond the cap waits for one of the tenant's
  calls to finish, first come first served (`TenantSlots`), within its own deadline (the wait
  counts against it). One that gets no slot by then becomes a `tool_error` result the model
  sees ("too many concurrent tool calls for this key"), like any failed tool: never a crash or
  a session stuck. Waiting rather than failing at once, because one turn of a model may make
  several calls, and a key capped at one should get them run one after the other.

Each engine counts its own: the gateway routes without per-request state shared between
engines or replicas, so with N engines a tenant may hold up to N times each cap in all.
"""

from __future__ import annotations

import asyncio
from collections import deque


class TooManySessions(RuntimeError):
    """A new session would take its tenant past its live-session cap here (HTTP 429)."""

    code = "too_many_sessions"

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"too many live sessions for this key: at most {cap} on this engine, counting "
            "sessions parked for their client's tool results until they are resumed to their "
            "end or expire; retry once one has ended"
        )
        self.cap = cap


def too_many_tool_calls(cap: int) -> str:
    """The message of a call that got no slot within its deadline (a `tool_error` result)."""
    return (
        f"too many concurrent tool calls for this key (at most {cap} at once on this engine); "
        "no slot came free within the call's deadline"
    )


class TenantSlots:
    """Server-side tool-call slots per tenant, handed out first come, first served.

    Side effects: none beyond its own memory; a tenant's entries go once it holds no slot and
    nobody waits. Invariants: a tenant holds at most the cap its waiters and holders named (a
    cap that changed, with the keys file, applies from the next call on); a waiter is served
    before any later waiter of the same tenant; every `acquire` that returned True is matched
    by exactly one `release`.
    """

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._waiting: dict[str, deque[tuple[asyncio.Future[None], int]]] = {}

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def waiting(self, tenant: str) -> int:
        return len(self._waiting.get(tenant, ()))

    async def acquire(self, tenant: str, cap: int, timeout_s: float) -> bool:
        """Take one of `tenant`'s `cap` slots, waiting at most `timeout_s` behind the calls
        that asked before; False if none came free in time."""
        held = self._held.get(tenant, 0)
        if held < cap and not self._waiting.get(tenant):
            self._held[tenant] = held + 1
            return True
        entry = (asyncio.get_running_loop().create_future(), cap)
        self._waiting.setdefault(tenant, deque()).append(entry)
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await entry[0]
        except TimeoutError:
            return not self._withdraw(tenant, entry)  # granted just as the time ran out
        except BaseException:  # cancelled: the session ended while its call waited
            if not self._withdraw(tenant, entry):
                self.release(tenant)
            raise
        return True

    def release(self, tenant: str) -> None:
        """Give a slot back; the longest waiter that fits its cap gets it."""
        self._held[tenant] = self._held.get(tenant, 0) - 1
        self._grant(tenant)

    def _withdraw(self, tenant: str, entry: tuple[asyncio.Future[None], int]) -> bool:
        """Take a waiter out of the line; False if it had been granted its slot already."""
        future = entry[0]
        if future.done() and not future.cancelled():
            return False
        future.cancel()
        line = self._waiting.get(tenant)
        if line is not None and entry in line:
            line.remove(entry)
        self._grant(tenant)  # the next in line may fit now
        return True

    def _grant(self, tenant: str) -> None:
        held = self._held.get(tenant, 0)
        line = self._waiting.get(tenant)
        while line and held < line[0][1]:
            future, _ = line.popleft()
            if not future.done():
                future.set_result(None)
                held += 1
        if not line:
            self._waiting.pop(tenant, None)
        if held > 0:
            self._held[tenant] = held
        else:
            self._held.pop(tenant, None)
