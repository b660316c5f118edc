"""The gateway's HTTP client for its engines: their load, and chat completions relayed as bytes.

`Upstream.open` sends a request's body, unread, to an engine's `/v1/chat/completions` and
returns the engine's response with its body not yet read; `relay` yields that body's bytes as
they arrive and closes the stream however the reading ends. Closing early closes the HTTP
stream, and the engine cancels the session and frees its KV when its caller goes away: that is
how a client's disconnect reaches the engine. Nothing here parses what the engine answers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from interlude.api.wire import SERVER_KEEP_ALIVE_S, SSE_DONE, error_body, sse
from interlude.gateway import metrics

# Idle connections to an engine are given up after this, well before the engine closes them
# (`SERVER_KEEP_ALIVE_S`): a request sent on a connection the engine is closing would fail.
KEEPALIVE_S = SERVER_KEEP_ALIVE_S / 2


class EngineError(RuntimeError):
    """The engine could not be reached or answered a load read with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unreachable(self) -> bool:
        return self.status == 0


class Upstream:
    """HTTP client for every engine (one connection pool).

    Side effects: network calls only. Invariant: a relayed response's stream is closed when
    its `relay` generator is closed, whether it ended, failed or was abandoned.
    """

    def __init__(self, connect_timeout_s: float, request_timeout_s: float) -> None:
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=1024, max_keepalive_connections=256, keepalive_expiry=KEEPALIVE_S
            ),
        )

    async def open(self, engine: str, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """POST `body` to the engine's chat completions; its response, body unread. Raises
        EngineError(0) when the engine cannot be reached (nothing was sent: safe to retry
        elsewhere)."""
        request = self.http.build_request(
            "POST", engine + "/v1/chat/completions", content=body, headers=dict(headers)
        )
        try:
            return await self.http.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise EngineError(0, f"engine {engine} unreachable: {exc!r}") from None

    async def load(self, engine: str, timeout_s: float) -> dict[str, Any]:
        """The engine's `GET /v1/load` (routing numbers); EngineError if it does not answer."""
        try:
            r = await self.http.get(engine + "/v1/load", timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise EngineError(0, f"{engine}: {exc!r}") from None
        try:
            body = json.loads(r.content)
        except ValueError:
            body = None
        if r.status_code != 200 or not isinstance(body, dict):
            raise EngineError(r.status_code, f"{engine}: /v1/load answered {r.status_code}")
        return body

    async def close(self) -> None:
        await self.http.aclose()


async def relay(response: httpx.Response) -> AsyncIterator[bytes]:
    """The response's body as it arrives, raw; the stream is closed when this ends. An SSE
    stream that breaks off before its `[DONE]` (the engine died, its connection dropped) gets an
    error frame and `[DONE]` from here, so the client knows the answer was cut; a JSON body
    cannot be mended once its headers went out, and simply ends."""
    stream = response.headers.get("content-type", "").startswith("text/event-stream")
    tail = b""  # the body's last bytes, enough to see `[DONE]` across chunk boundaries
    try:
        async for chunk in response.aiter_raw():
            tail = (tail + chunk)[-len(SSE_DONE) :]
            yield chunk
    except httpx.HTTPError:
        pass
    finally:
        await response.aclose()
    if stream and tail != SSE_DONE:
        metrics.BROKEN_STREAMS.inc()
        yield sse(error_body("the engine's stream broke off before its end", "server_error"))
        yield SSE_DONE
