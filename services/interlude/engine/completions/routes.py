"""The engine's OpenAI route: ``POST /v1/chat/completions``, served from this engine's sessions.

A chat completion is one leg per choice (`ChatService.open`), read to its end for a JSON answer
or sent as SSE chunks as it is generated (`stream.py`). Either way: a leg that ends paused for
client-side tools is recorded *before* the client sees its end (so an immediate follow-up finds
it); a leg cut short by a stop string, or by a client that went away, cancels its session so the
KV is freed at once.

Who is asking: the gateway authenticates and names the caller's tenant in `TENANT_HEADER`, the
server-side tools its key may run in `TOOLS_HEADER` and its caps in `CAPS_HEADER`; the engine
believes these only with the gateway's token (`GATEWAY_TOKEN_HEADER`), when one is configured.
A request straight to the engine is tenant "", with every published tool and no caps
(`api.engine.tenant_of`, `tools_of`, `caps_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from interlude.api.engine import caps_of, prefill_of, tenant_of, tools_of
from interlude.api.events import Failed
from interlude.api.names import SESSION_ID
from interlude.api.openai import ChatCompletionRequest, Unsupported
from interlude.engine.completions import metrics, render, stream
from interlude.engine.completions.leg import Leg
from interlude.engine.completions.service import ChatService


class LegFailed(RuntimeError):
    """The session ended with an error before its answer was whole (a JSON answer cut short
    is a 502 or 504, never a 200 with part of the text)."""

    def __init__(self, event: Failed) -> None:
        super().__init__(event.message or "the engine failed the session")
        self.code = event.code or "engine_error"


def _alias(request: Request) -> str | None:
    alias = request.headers.get("x-session-id")
    if alias is not None and not SESSION_ID.fullmatch(alias):
        raise Unsupported("x-session-id", "x-session-id must be 1-128 of [A-Za-z0-9._:-]")
    return alias


def chat_router(chat: Callable[[], ChatService], gateway_token: str) -> APIRouter:
    """The route; `chat()` gives the service once the engine is up (it raises while not)."""
    router = APIRouter()

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        started = time.perf_counter()
        tenant = tenant_of(request.headers, gateway_token)
        trace = {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}
        service = chat()
        allowed = tools_of(request.headers, gateway_token)
        caps = caps_of(request.headers, gateway_token)
        prefill = prefill_of(request.headers, gateway_token)
        legs = await service.open(body, tenant, _alias(request), trace, allowed, caps, prefill)
        headers = {"x-session-id": legs[0].alias}
        if body.stream:
            headers["server-timing"] = _server_timing(legs[0], started)
            opts = body.stream_options
            body_frames = stream.frames(
                service,
                legs,
                usage=bool(opts and opts.include_usage),
                events=bool(opts and opts.include_tool_events),
            )
            return StreamingResponse(body_frames, media_type="text/event-stream", headers=headers)
        reading = asyncio.create_task(_read_all(service, legs))
        gone = asyncio.create_task(_disconnected(request))
        await asyncio.wait((reading, gone), return_when=asyncio.FIRST_COMPLETED)
        if not reading.done():
            reading.cancel()
            metrics.DISCONNECTS.inc()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            return Response(status_code=499)
        gone.cancel()
        answer = render.completion(reading.result(), f"chatcmpl-{uuid.uuid4().hex}")
        stream.finish(legs, "200", stream=False)
        headers["server-timing"] = _server_timing(legs[0], started)
        return JSONResponse(answer, headers=headers)

    return router


def _server_timing(leg: Leg, started: float) -> str:
    """W3C Server-Timing: this engine's time so far (a stream's: before its first byte), the
    part spent finding or starting the session, the route it took and, for a resumed turn
    once reported (so in JSON answers, not in a stream's headers), how its KV came back and
    how long it waited for its first step."""
    total_ms = (time.perf_counter() - started) * 1000
    timing = (
        f'engine;dur={total_ms:.3f}, open;dur={leg.open_s * 1000:.3f}, route;desc="{leg.route}"'
    )
    if leg.turn_start is not None:
        start = leg.turn_start
        timing += f', kv;desc="{start.kv}", queue;dur={start.queue_s * 1000:.3f}'
    return timing


async def _read(service: ChatService, leg: Leg) -> Leg:
    """Read a leg to its end (or its stop string); raises LegFailed if it failed unanswered."""
    try:
        async for ev in leg.events:
            leg.fold(ev)
            if leg.stops.stopped or leg.error:
                break
        else:
            leg.flush()
    except asyncio.CancelledError:
        asyncio.get_running_loop().create_task(service.cancel(leg))
        raise
    finally:
        await leg.events.aclose()  # type: ignore[attr-defined]
    if leg.stops.stopped:
        await service.cancel(leg)
    if leg.error is not None:  # a cut answer is not passed off as a whole one
        raise LegFailed(leg.error)
    service.remember(leg)
    return leg


async def _read_all(service: ChatService, legs: list[Leg]) -> list[Leg]:
    """Every choice read to its end; LegFailed (every choice cancelled) if one failed."""
    results = await asyncio.gather(*(_read(service, leg) for leg in legs), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            for leg in legs:
                await service.cancel(leg)
            raise r
    return legs


async def _disconnected(request: Request) -> None:
    # The body was read; the next message uvicorn delivers is the client's disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
