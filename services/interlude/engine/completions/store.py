"""Where an engine remembers its sessions paused for their client, until the client comes back.

A record is written when a leg ends paused for client-side tools, under the caller's tenant and
the conversation's key (`conversation.conversation_key`) and, when the client named one, under
its session id as well. A resume *takes* the record (read and delete in one step), so two
racing requests cannot both resume one session. Records expire with the session's own client
deadline: after it the session has failed and its KV is freed.

Records live in this engine's process, beside the KV they describe: a session lives and dies
with its engine, so there is nothing to share (the gateway routes a continuation here by the
engine tag in its tool-call ids). Every key is scoped by tenant: a caller never finds, takes or
cancels another tenant's session, whatever alias or conversation it sends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class PausedSession:
    """A session waiting for its client's tool results."""

    tenant: str  # who started it (the gateway's key name; "" straight to the engine)
    session_id: str
    key: str  # conversation key up to and including the assistant's calls
    call_ids: tuple[str, ...]  # the calls the client must answer
    model: str
    # Session counters at the pause, so the next leg reports its own usage.
    prompt_tokens: int
    completion_tokens: int
    tool_tokens: int
    expires_at: float  # wall clock; the session fails then
    logprobs: int | None = None  # alternatives per token the session samples (None: none)
    siblings: tuple[str, ...] = ()  # the sessions of the same request's other choices (`n`)


class SessionStore:
    """Paused sessions by (tenant, conversation key) and by (tenant, client alias).

    Invariants: `take*` returns a record at most once (it is deleted as it is read); a record
    past `expires_at` is never returned; a record is only found under its own tenant.
    """

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], PausedSession] = {}
        self._alias: dict[tuple[str, str], str] = {}

    def put(self, session: PausedSession, alias: str | None = None) -> None:
        self._sweep()
        self._by_key[(session.tenant, session.key)] = session
        if alias:
            self._alias[(session.tenant, alias)] = session.key

    def take(self, tenant: str, key: str) -> PausedSession | None:
        s = self._by_key.pop((tenant, key), None)
        return s if s is not None and s.expires_at > time.time() else None

    def take_alias(self, tenant: str, alias: str) -> PausedSession | None:
        key = self._alias.pop((tenant, alias), None)
        return None if key is None else self.take(tenant, key)

    def __len__(self) -> int:
        return len(self._by_key)

    def _sweep(self) -> None:
        now = time.time()
        for k in [k for k, s in self._by_key.items() if s.expires_at <= now]:
            del self._by_key[k]
        self._alias = {a: key for a, key in self._alias.items() if (a[0], key) in self._by_key}
