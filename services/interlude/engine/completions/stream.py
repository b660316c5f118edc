"""A chat completion as SSE: each choice's leg rendered as chunks as it is generated, the
choices of one request (`n`) interleaved as they come, then usage and `[DONE]`.

A choice whose session fails mid-answer ends with an error frame (the others go on); a leg
cut short by a stop string, or by a client that went away, cancels its session so the KV is
freed at once; a leg that ends paused for client-side tools is recorded (`remember`) before
the client sees its end, so an immediate follow-up finds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence

from interlude import telemetry
from interlude.engine.completions import metrics, render
from interlude.engine.completions.leg import Leg
from interlude.engine.completions.service import ChatService

log = logging.getLogger(__name__)


async def frames(
    service: ChatService, legs: Sequence[Leg], usage: bool, events: bool
) -> AsyncIterator[bytes]:
    """The whole response body."""
    chunks = render.Chunks(legs)
    choices = [_choice(service, leg, chunks, events) for leg in legs]
    body = choices[0] if len(choices) == 1 else _merged(choices)
    ended = False
    broken = False
    try:
        try:
            async for frame in body:
                yield frame
        except Exception:
            # A bug, not a session's error (those end their choice with an error frame): the
            # stream still ends with an error frame and [DONE], never cut without a word.
            log.exception("a streamed answer failed")
            broken = True
            yield render.sse(render.error_body("the engine failed mid-answer", "server_error"))
        if usage and not broken:
            yield chunks.usage()
        ended = True
        yield render.SSE_DONE
        failed = broken or any(leg.error is not None for leg in legs)
        finish(legs, "engine_error" if failed else "200", stream=True)
    finally:
        if not ended:  # the client went away mid-answer (each choice freed its session)
            metrics.DISCONNECTS.inc()


async def _choice(
    service: ChatService, leg: Leg, chunks: render.Chunks, events: bool
) -> AsyncIterator[bytes]:
    ended = False
    try:
        yield chunks.first(leg)
        async for ev in leg.events:
            text = leg.fold(ev)
            if text or leg.last_logprobs:
                yield chunks.delta(leg, {"content": text}, entries=leg.last_logprobs)
            if events and leg.server_events and ev is leg.server_events[-1]:
                yield chunks.event(ev)
            if leg.stops.stopped or leg.error:
                break
        else:
            if tail := leg.flush():
                yield chunks.delta(leg, {"content": tail})
        if leg.stops.stopped:
            await service.cancel(leg)
        if leg.error is not None:
            ended = True
            yield render.sse(render.error_body(leg.error.message, "server_error"))
            return
        service.remember(leg)
        if leg.tool_calls:
            yield chunks.tool_calls(leg)
        ended = True
        yield chunks.delta(leg, {}, leg.finish_reason or "stop")
    finally:
        if not ended:  # nobody reads the rest: free the session's KV now
            asyncio.get_running_loop().create_task(service.cancel(leg))
        await leg.events.aclose()  # type: ignore[attr-defined]


async def _merged(streams: Sequence[AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """The frames of several streams as each comes; closing this closes them all."""
    queue: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[bytes]) -> None:
        try:
            async for frame in stream:
                await queue.put(frame)
        except Exception as exc:  # raised to the reader, as one stream's would be
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        left = len(tasks)
        while left:
            frame = await queue.get()
            if frame is None:
                left -= 1
            elif isinstance(frame, Exception):
                raise frame
            else:
                yield frame
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def finish(legs: Sequence[Leg], status: str, stream: bool) -> None:
    """Count one answered request (its choices' tokens)."""
    metrics.REQUESTS.labels(status, str(stream).lower()).inc()
    started = min(leg.started for leg in legs)
    metrics.LATENCY.observe(time.monotonic() - started, exemplar=telemetry.exemplar())
    metrics.TOKENS.labels("prompt").inc(legs[0].usage[0])
    metrics.TOKENS.labels("completion").inc(sum(leg.usage[1] for leg in legs))
