"""The engine's OpenAI route: ``POST /v1/chat/completions``, served from this engine's sessions.

A chat completion is one leg (`ChatService.open`), read to its end for a JSON answer or sent
as SSE chunks as it is generated. Either way: a leg that ends paused for client-side tools is
recorded *before* the client sees its end (so an immediate follow-up finds it); a leg cut short
by a stop string, or by a client that went away, cancels its session so the KV is freed at once.

Who is asking: the gateway authenticates and names the caller's tenant in `TENANT_HEADER`;
the engine believes that header only with the gateway's token (`GATEWAY_TOKEN_HEADER`), when
one is configured. A request straight to the engine is tenant "" (`api.engine.tenant_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from interlude import telemetry
from interlude.api.engine import tenant_of
from interlude.api.events import Failed
from interlude.api.names import SESSION_ID
from interlude.api.openai import ChatCompletionRequest, Unsupported
from interlude.engine.completions import metrics, render
from interlude.engine.completions.leg import Leg
from interlude.engine.completions.service import ChatService


class LegFailed(RuntimeError):
    """The session ended with an error before anything was answered."""

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
        leg = await service.open(body, tenant, _alias(request), trace)
        headers = {"x-session-id": leg.alias}
        if body.stream:
            headers["server-timing"] = _server_timing(leg, started)
            opts = body.stream_options
            frames = _frames(
                service,
                leg,
                usage=bool(opts and opts.include_usage),
                events=bool(opts and opts.include_tool_events),
            )
            return StreamingResponse(frames, media_type="text/event-stream", headers=headers)
        reading = asyncio.create_task(_read(service, leg))
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
        _finish(leg, "200", stream=False)
        headers["server-timing"] = _server_timing(leg, started)
        return JSONResponse(answer, headers=headers)

    return router


def _server_timing(leg: Leg, started: float) -> str:
    """W3C Server-Timing: this engine's time so far (a stream's: before its first byte), the
    part spent finding or starting the session, and how the session's KV came back."""
    total_ms = (time.perf_counter() - started) * 1000
    return f'engine;dur={total_ms:.3f}, open;dur={leg.open_s * 1000:.3f}, route;desc="{leg.route}"'


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
    if leg.error is not None and not (leg.content or leg.tool_calls):
        raise LegFailed(leg.error)
    service.remember(leg)
    return leg


async def _disconnected(request: Request) -> None:
    # The body was read; the next message uvicorn delivers is the client's disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _frames(
    service: ChatService, leg: Leg, usage: bool, events: bool
) -> AsyncIterator[bytes]:
    chunks = render.Chunks(leg)
    ended = False
    try:
        yield chunks.first()
        async for ev in leg.events:
            text = leg.fold(ev)
            if text or leg.last_logprobs:
                yield chunks.delta({"content": text}, entries=leg.last_logprobs)
            if events and leg.server_events and ev is leg.server_events[-1]:
                yield chunks.event(ev)
            if leg.stops.stopped or leg.error:
                break
        else:
            if tail := leg.flush():
                yield chunks.delta({"content": tail})
        if leg.stops.stopped:
            await service.cancel(leg)
        if leg.error is not None:
            ended = True
            yield render.sse(render.error_body(leg.error.message, "server_error"))
            yield render.SSE_DONE
            _finish(leg, "engine_error", stream=True)
            return
        service.remember(leg)
        if leg.tool_calls:
            yield chunks.tool_calls()
        yield chunks.delta({}, leg.finish_reason or "stop")
        if usage:
            yield chunks.usage()
        ended = True
        yield render.SSE_DONE
        _finish(leg, "200", stream=True)
    finally:
        if not ended:  # the client went away mid-answer: free the session's KV now
            metrics.DISCONNECTS.inc()
            asyncio.get_running_loop().create_task(service.cancel(leg))
        await leg.events.aclose()  # type: ignore[attr-defined]


def _finish(leg: Leg, status: str, stream: bool) -> None:
    metrics.REQUESTS.labels(status, str(stream).lower()).inc()
    metrics.LATENCY.observe(time.monotonic() - leg.started, exemplar=telemetry.exemplar())
    prompt, completion = leg.usage
    metrics.TOKENS.labels("prompt").inc(prompt)
    metrics.TOKENS.labels("completion").inc(completion)
