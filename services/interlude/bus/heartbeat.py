"""The worker's claim heartbeat, on a thread of its own.

A live worker keeps its running calls from being taken over by re-claiming them (XCLAIM with
JUSTID resets an entry's idle time and leaves its delivery count alone) more often than
`claim_idle_ms`. Done on the worker's event loop, a tool that blocks the loop (CPU work, a
blocking library call) would starve the re-claim; the call would look dead, another worker
would take it over and run it a second time. Here a daemon thread with its own synchronous
connection does it, so only a stopped process stops it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from interlude.api.bus import CALL_STREAM, TOOL_GROUP

log = logging.getLogger(__name__)

# Connection settings that mean the same to the synchronous client as to the asyncio one.
_PORTABLE = (
    "host", "port", "db", "username", "password", "path", "socket_timeout",
    "socket_connect_timeout", "ssl", "client_name", "decode_responses",
)  # fmt: skip


def sync_client(async_kwargs: dict[str, Any]) -> Redis:
    """A synchronous client to the server an asyncio client's `connection_kwargs` point at."""
    kw = {k: v for k, v in async_kwargs.items() if k in _PORTABLE}
    if "path" in kw:
        return Redis(unix_socket_path=kw.pop("path"), **kw)
    return Redis(**kw)


class Heartbeat:
    """Re-claims the entry ids it is given every `interval_s`, from a daemon thread.

    Side effects: one thread and one connection, both gone after `stop()`. Invariants: an id
    added is re-claimed within `interval_s` until it is discarded; a Redis error is logged and
    the next beat tries again (the calls' idle time keeps growing meanwhile).
    """

    def __init__(self, client: Redis, consumer: str, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self._client = client
        self._consumer = consumer
        self._interval_s = interval_s
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="claim-heartbeat", daemon=True)
        self.beats = 0  # re-claims sent (a test reads it)

    def add(self, entry_id: str) -> None:
        with self._lock:
            self._ids.add(entry_id)

    def discard(self, entry_id: str) -> None:
        with self._lock:
            self._ids.discard(entry_id)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self._interval_s + 1)
        self._client.close()

    def beat(self) -> None:
        """Re-claim the current ids once (the thread's loop; callable directly)."""
        with self._lock:
            ids = list(self._ids)
        if ids:
            self._client.xclaim(
                CALL_STREAM, TOOL_GROUP, self._consumer, 0, list[Any](ids), justid=True
            )
            self.beats += 1

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.beat()
            except RedisError as exc:
                log.warning(
                    "claim heartbeat failed (%s); next beat in %.2f s", exc, self._interval_s
                )
