"""The gateway's routes: chat completions, models, probes and metrics.

A chat completion is one engine leg (`ChatService.open`), read to its end for a JSON answer or
relayed as SSE chunks. Either way: a leg that ends paused for client-side tools is recorded
*before* the client sees its end (so an immediate follow-up finds it); a leg cut short by a stop
string, or by a client that went away, cancels its engine session so the KV is freed at once.
"""

# No `from __future__ import annotations`: FastAPI must see `Depends(guard)` (a local) at
# definition time, not as a string it would look up in the module.
import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import propagate

from interlude import telemetry
from interlude.api.events import Failed
from interlude.api.names import SESSION_ID
from interlude.api.openai import ChatCompletionRequest, ModelCard, ModelList, Unsupported
from interlude.gateway import metrics, render
from interlude.gateway.guard import Caller, Guard
from interlude.gateway.pool import EnginePool, summary
from interlude.gateway.service import ChatService, Leg
from interlude.gateway.upstream import EngineError


class LegFailed(RuntimeError):
    """The engine ended the session with an error before anything was answered."""

    def __init__(self, event: Failed) -> None:
        super().__init__(event.message or "the engine failed the session")
        self.code = event.code or "engine_error"


def _alias(request: Request) -> str | None:
    alias = request.headers.get("x-session-id")
    if alias is not None and not SESSION_ID.fullmatch(alias):
        raise Unsupported("x-session-id", "x-session-id must be 1-128 of [A-Za-z0-9._:-]")
    return alias


def _trace_headers() -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)  # the server span FastAPI's instrumentation opened
    return carrier


def make_router(service: ChatService, pool: EnginePool, guard: Guard) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, caller: Annotated[Caller, Depends(guard)]
    ) -> Response:
        leg = await service.open(body, _trace_headers(), _alias(request))
        headers = {"x-session-id": leg.alias, **caller.headers}
        if body.stream:
            headers["server-timing"] = _server_timing(request, leg)
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
        return JSONResponse(
            answer, headers={**headers, "server-timing": _server_timing(request, leg)}
        )

    @router.get("/v1/models", response_model=ModelList)
    async def models(_: Annotated[Caller, Depends(guard)]) -> ModelList:
        now = int(time.time())
        return ModelList(data=[ModelCard(id=m, created=now) for m in pool.models()])

    @router.get("/v1/models/{model:path}", response_model=ModelCard)
    async def model(model: str, _: Annotated[Caller, Depends(guard)]) -> ModelCard:
        if model not in pool.models():
            raise Unsupported("model", f"the model {model!r} does not exist")
        return ModelCard(id=model, created=int(time.time()))

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/ready")
    async def ready() -> Response:
        engines = summary(list(pool.engines.values()))
        status = 200 if pool.ready() else 503
        return JSONResponse({"ready": status == 200, "engines": engines}, status_code=status)

    @router.get("/metrics")
    async def prometheus(request: Request) -> Response:
        states = list(pool.engines.values())
        metrics.ENGINES.labels("true").set(sum(e.ready for e in states))
        metrics.ENGINES.labels("false").set(sum(not e.ready for e in states))
        paused: dict[str, float] = {}
        for e in pool.ready():
            for strategy, n in (e.load.get("paused") or {}).items():
                paused[strategy] = paused.get(strategy, 0) + float(n)
        for strategy, n in paused.items():
            metrics.PAUSED.labels(strategy).set(n)
        body, media_type = telemetry.exposition(request.headers.get("accept"))
        return Response(body, media_type=media_type)

    return router


def _server_timing(request: Request, leg: Leg) -> str:
    """W3C Server-Timing of this request so far: the gateway's own share (`bench gateway`
    reads it), its waits on the session store and on the engine. A stream's is taken when its
    headers go out: the time before the answer could start."""
    total_ms = (time.perf_counter() - request.state.started) * 1000
    engine_ms, store_ms = leg.upstream_s * 1000, leg.store_s * 1000
    return (
        f"gateway;dur={total_ms - engine_ms - store_ms:.3f}, store;dur={store_ms:.3f}, "
        f"engine;dur={engine_ms:.3f}"
    )


async def _read(service: ChatService, leg: Leg) -> Leg:
    """Read a leg to its end (or its stop string); raises LegFailed if it failed unanswered."""
    t0 = time.perf_counter()
    try:
        async for ev in leg.events:
            leg.fold(ev)
            if leg.stops.stopped or leg.error:
                break
        else:
            leg.flush()
        leg.upstream_s += time.perf_counter() - t0
    except asyncio.CancelledError:
        asyncio.get_running_loop().create_task(service.cancel(leg))
        raise
    finally:
        await leg.events.aclose()  # type: ignore[attr-defined]
    if leg.stops.stopped:
        await service.cancel(leg)
    if leg.error is not None and not (leg.content or leg.tool_calls):
        raise LegFailed(leg.error)
    await service.remember(leg)
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
            if text:
                yield chunks.delta({"content": text})
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
        await service.remember(leg)
        if leg.tool_calls:
            yield chunks.tool_calls()
        yield chunks.delta({}, leg.finish_reason or "stop")
        if usage:
            yield chunks.usage()
        ended = True
        yield render.SSE_DONE
        _finish(leg, "200", stream=True)
    except EngineError as exc:
        ended = True
        yield render.sse(render.error_body(str(exc), "server_error"))
        yield render.SSE_DONE
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
