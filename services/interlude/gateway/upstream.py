"""The engine's internal HTTP API, as the gateway calls it (see `interlude.engine.server`).

A leg is an SSE stream of engine events (`data: {...}` frames, ending with `data: [DONE]`).
`Upstream.leg` opens one and yields the events typed (`interlude.api.events.decode`); an
engine that answers with an error envelope raises `EngineError` before any event, so the
caller can fall back or pass the error on. Closing the generator early closes the HTTP
stream, and the engine cancels the session and frees its KV when its caller goes away: that
is how a client's disconnect reaches the engine.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from interlude.api.engine import ResumeBody, SubmitBody
from interlude.api.events import Event, decode
from interlude.api.wire import SERVER_KEEP_ALIVE_S, sse_data

# Idle connections to an engine are given up after this, well before the engine closes them
# (`SERVER_KEEP_ALIVE_S`): a leg sent on a connection the engine is closing would fail, and a
# resume would then fall back to recompute.
KEEPALIVE_S = SERVER_KEEP_ALIVE_S / 2


class EngineError(RuntimeError):
    """The engine refused a call (`status` and its error envelope) or could not be reached."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        err = body.get("error") or {}
        super().__init__(err.get("message") or f"engine answered {status}")
        self.status = status
        self.body = dict(body)

    @property
    def unreachable(self) -> bool:
        return self.status == 0


class Upstream:
    """HTTP client for every engine (one connection pool).

    Side effects: network calls only. Invariant: a leg's stream is closed when its generator is
    closed, whether it ended, failed or was abandoned.
    """

    def __init__(self, connect_timeout_s: float, request_timeout_s: float) -> None:
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=1024, max_keepalive_connections=256, keepalive_expiry=KEEPALIVE_S
            ),
        )

    async def submit(
        self, engine: str, body: SubmitBody, headers: Mapping[str, str]
    ) -> AsyncIterator[Event]:
        """Start a session; its first leg."""
        return await self._leg(engine + "/v1/sessions", body, headers)

    async def resume(
        self, engine: str, session_id: str, body: ResumeBody, headers: Mapping[str, str]
    ) -> AsyncIterator[Event]:
        """Post the client's tool results to a paused session; its next leg."""
        return await self._leg(f"{engine}/v1/sessions/{session_id}/resume", body, headers)

    async def cancel(self, engine: str, session_id: str) -> None:
        """Cancel a session (its KV is freed); an unknown session is already gone."""
        # An unreachable engine frees the session at its own deadline.
        with contextlib.suppress(httpx.HTTPError):
            await self.http.delete(f"{engine}/v1/sessions/{session_id}", timeout=5.0)

    async def load(self, engine: str, timeout_s: float) -> dict[str, Any]:
        """The engine's `GET /v1/load` (routing numbers); EngineError if it does not answer."""
        try:
            r = await self.http.get(engine + "/v1/load", timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise EngineError(0, {"error": {"message": f"{engine}: {exc!r}"}}) from None
        body = _json(r.content)
        if r.status_code != 200:
            raise EngineError(r.status_code, body)
        return body

    async def close(self) -> None:
        await self.http.aclose()

    async def _leg(
        self, url: str, body: SubmitBody | ResumeBody, headers: Mapping[str, str]
    ) -> AsyncIterator[Event]:
        # None means "not given" in both bodies: left out, the engine applies its default.
        payload = body.model_dump(mode="json", exclude_none=True)
        request = self.http.build_request("POST", url, json=payload, headers=dict(headers))
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise EngineError(0, {"error": {"message": f"engine unreachable: {exc!r}"}}) from None
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            raise EngineError(response.status_code, _json(content))
        return _events(response)


async def _events(response: httpx.Response) -> AsyncIterator[Event]:
    try:
        async for data in sse_data(response.aiter_bytes()):
            try:
                ev = decode(json.loads(data))
            except ValueError as exc:  # json's errors are ValueErrors too
                raise EngineError(0, {"error": {"message": f"bad engine event: {exc}"}}) from None
            if ev is not None:  # a newer engine's event that this gateway does not know
                yield ev
    except httpx.HTTPError as exc:
        # The engine went away mid-leg (a crash, a restart): the session is lost with it.
        raise EngineError(0, {"error": {"message": f"engine stream broke: {exc!r}"}}) from None
    finally:
        await response.aclose()


def _json(content: bytes) -> dict[str, Any]:
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"error": {"message": content[:500].decode(errors="replace") or "no body"}}
