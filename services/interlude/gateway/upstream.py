"""The gateway's HTTP client for its engines: their load, and chat completions relayed as bytes.

`Upstream.open` sends a request's body, unread, to an engine's `/v1/chat/completions` and
returns the engine's `Answer` with its body not yet read (`HttpAnswer` here, `MuxAnswer` over
the multiplexed link, `gateway/mux.py`); `relay` yields that body's bytes as they arrive and
closes the answer however the reading ends. Closing early closes the HTTP
stream, and the engine cancels the session and frees its KV when its caller goes away: that is
how a client's disconnect reaches the engine. Nothing here parses what the engine answers.

The client is aiohttp's: its C HTTP parser and its connection pool cost a fraction of httpx's
per request and per relayed chunk (httpx's pool checks every pooled connection's socket on each
request), and the relay is the gateway's per-token work (docs/gateway.md, "Overhead").
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from interlude.api.wire import SERVER_KEEP_ALIVE_S, SSE_DONE, error_body, sse
from interlude.gateway import metrics

# Idle connections to an engine are given up after this, well before the engine closes them
# (`SERVER_KEEP_ALIVE_S`): a request sent on a connection the engine is closing would fail.
KEEPALIVE_S = SERVER_KEEP_ALIVE_S / 2

# What reading an answer can raise once its headers came: the engine died or stalled.
_BROKEN = (aiohttp.ClientError, TimeoutError)


class EngineError(RuntimeError):
    """The engine could not be reached or answered a load read with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unreachable(self) -> bool:
        return self.status == 0


class AnswerBroken(RuntimeError):
    """An answer's body stopped before its end: the engine died, stalled or dropped the link."""


class Answer(ABC):
    """An engine's response whose body is still to be read (`relay`): its status and headers
    (names lower-case)."""

    status_code: int
    headers: Mapping[str, str]

    @property
    def streamed(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    @abstractmethod
    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (what came since the last read, in one piece);
        AnswerBroken if it stops before its end."""

    @abstractmethod
    def close(self, whole: bool) -> None:
        """Done with the answer: read to its end (`whole`), or abandoned, which tells the
        engine its caller left (it frees the session's KV). Idempotent."""


class HttpAnswer(Answer):
    """An answer on an HTTP connection of its own: abandoning it closes the connection."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.status_code = response.status
        self.headers = response.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        except _BROKEN as exc:
            raise AnswerBroken(repr(exc)) from None

    def close(self, whole: bool) -> None:
        # A body read to its end frees the connection for the next request; any other end
        # closes it, which is what tells the engine its caller left.
        if whole:
            self.response.release()
        else:
            self.response.close()


class Upstream:
    """HTTP client for every engine (one connection pool, made on first use inside the
    event loop that uses it).

    Side effects: network calls only. Invariant: a relayed answer's connection is released
    (or closed, if its body was not read to the end) when its `relay` generator is closed,
    whether it ended, failed or was abandoned.
    """

    def __init__(self, connect_timeout_s: float, request_timeout_s: float) -> None:
        # Like httpx's timeouts: connecting, then each read (a stream may run for minutes).
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=request_timeout_s
        )
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(
                limit=1024, limit_per_host=0, keepalive_timeout=KEEPALIVE_S, use_dns_cache=True
            )
            # Engines do not compress; were one to, the client gets the decoded bytes (the
            # engine's `content-encoding` is not relayed).
            self._http = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._http

    async def open(self, engine: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST `body` to the engine's chat completions; its answer, body unread. Raises
        EngineError(0) when the engine cannot be reached (nothing was sent: safe to retry
        elsewhere)."""
        try:
            response = await self.http.post(
                engine + "/v1/chat/completions", data=body, headers=dict(headers)
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise EngineError(0, f"engine {engine} unreachable: {exc!r}") from None
        return HttpAnswer(response)

    async def load(self, engine: str, timeout_s: float) -> dict[str, Any]:
        """The engine's `GET /v1/load` (routing numbers); EngineError if it does not answer."""
        try:
            async with self.http.get(
                engine + "/v1/load", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                status, content = r.status, await r.read()
        except _BROKEN as exc:
            raise EngineError(0, f"{engine}: {exc!r}") from None
        try:
            body = json.loads(content)
        except ValueError:
            body = None
        if status != 200 or not isinstance(body, dict):
            raise EngineError(status, f"{engine}: /v1/load answered {status}")
        return body

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


async def relay(answer: Answer) -> AsyncIterator[bytes]:
    """The answer's body as it arrives, raw; the answer is closed when this ends. An SSE stream
    that breaks off before its `[DONE]` (the engine died, its connection dropped) gets an error
    frame and `[DONE]` from here, so the client knows the answer was cut; a JSON body cannot be
    mended once its headers went out, and simply ends."""
    tail = b""  # the body's last bytes, enough to see `[DONE]` across chunk boundaries
    ended = False
    try:
        async for chunk in answer.chunks():
            tail = (tail + chunk)[-len(SSE_DONE) :]
            yield chunk
        ended = True
    except AnswerBroken:
        pass
    finally:
        answer.close(ended)
    if answer.streamed and tail != SSE_DONE:
        metrics.BROKEN_STREAMS.inc()
        yield sse(error_body("the engine's stream broke off before its end", "server_error"))
        yield SSE_DONE
