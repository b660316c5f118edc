"""`POST /v1/chat/completions`, served as a bare ASGI app in front of the FastAPI one.

The gateway's per-request work is small (read the body, check the key and its rate, pick an
engine, relay the answer's bytes), and FastAPI's path around it (its middleware stack, routing,
dependency injection, the OpenTelemetry ASGI middleware and `StreamingResponse` with its task
group) cost more CPU than that work at 200 requests/s (docs/gateway.md, "A bare route for
chat"). This route does the same things directly: the body limit (413), the guard (401/429),
routing's refusals (400/404/429/503) in OpenAI's envelope, one server span per request (its
context goes to the engine), the request metrics and log line. Every other path is FastAPI's.

A client that goes away is noticed from the moment its body is read: a watcher waits for the
ASGI disconnect and cancels the request, which closes the engine's stream (so the engine frees
the session's KV), whether the engine was still to answer or mid-stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind
from starlette.types import ASGIApp, Receive, Scope, Send

from interlude import telemetry
from interlude.api.wire import error_body
from interlude.gateway import metrics
from interlude.gateway.asgi import (
    BodyTooLarge,
    ClientLeft,
    declared_over,
    header_map,
    log_request,
    read_body,
    send_json,
)
from interlude.gateway.guard import Guard
from interlude.gateway.hint import Hint
from interlude.gateway.refusals import REFUSED, refusal_of
from interlude.gateway.relay import Relay
from interlude.gateway.upstream import Answer, relay

log = logging.getLogger("interlude.gateway")

PATH = "/v1/chat/completions"
_SPAN = f"POST {PATH}"


class Front:
    """The gateway's ASGI app: `POST /v1/chat/completions` to `chat`, everything else (other
    routes, other methods on this path, lifespan) to `app`."""

    def __init__(self, app: ASGIApp, chat: ChatRoute) -> None:
        self.app = app
        self.chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            await self.chat(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class ChatRoute:
    """Serves chat completions through `relay`, after `guard`.

    Side effects: one engine request per admitted request (more only when engines cannot be
    reached); metrics, a span and a log line per request. Invariant: once the request's body
    is read, the engine's stream is closed when the client leaves.
    """

    def __init__(self, relay: Relay, guard: Guard, max_body_bytes: int) -> None:
        self.relay = relay
        self.guard = guard
        self.max_body_bytes = max_body_bytes
        self.tracer = telemetry.tracer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        headers = header_map(scope)
        span = self.tracer.start_span(
            _SPAN,
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "http.route": PATH},
        )
        status = 500
        try:
            with trace.use_span(span, end_on_exit=False):
                status = await self._serve(scope, receive, send, headers, started)
        finally:
            span.set_attribute("http.response.status_code", status)
            span.end()
            log_request("POST", PATH, status, started)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], started: float
    ) -> int:
        """Answer the request; its status (a client that left before its body: 499)."""
        try:
            if declared_over(headers, self.max_body_bytes):
                raise BodyTooLarge
            raw = await read_body(receive, self.max_body_bytes)
        except BodyTooLarge:
            return await self._error(send, 413, f"request body over {self.max_body_bytes} bytes")
        except ClientLeft:
            return 499
        client = scope.get("client")
        watcher = _Watcher(receive, started)
        try:
            return await self._answer(send, raw, headers, client[0] if client else "", watcher)
        finally:
            watcher.stop()

    async def _answer(
        self, send: Send, raw: bytes, headers: Mapping[str, str], address: str, watcher: _Watcher
    ) -> int:
        """Admit, route and relay; the status the client got (499: it left first)."""
        started = watcher.started
        hint: Hint | None = None
        try:
            caller = await self.guard.admit(headers, address)
            hint = Hint.of(raw, self.relay.benchmark_mode)
            answer, out = await self.relay.open(hint, raw, headers, caller, started)
        except REFUSED as exc:
            r = refusal_of(exc)
            await send_json(send, r.status, r.body(), r.headers)
            return r.status
        except asyncio.CancelledError:
            if not watcher.took(hint is not None and hint.stream):
                raise
            return 499
        except Exception as exc:  # our own bug: a 500 with a reference, never internals
            ref = uuid.uuid4().hex[:12]
            log.error("internal error %s", ref, exc_info=exc)
            return await self._error(send, 500, f"internal error {ref}; see the gateway log")
        try:
            return await _relay(send, answer, out, started)
        except asyncio.CancelledError:
            if not watcher.took(answer.streamed):
                raise
            return 499

    @staticmethod
    async def _error(send: Send, status: int, message: str) -> int:
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        await send_json(send, status, error_body(message, type_))
        return status


async def _relay(send: Send, answer: Answer, out: Mapping[str, str], started: float) -> int:
    """The engine's answer to the client, bytes as they come; its status, counted once sent."""
    raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out.items()]
    body: AsyncIterator[bytes] = relay(answer)
    try:
        status = answer.status_code
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        async for chunk in body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await body.aclose()  # type: ignore[attr-defined]
    _count(str(answer.status_code), answer.streamed, started)
    return answer.status_code


def _count(outcome: str, stream: bool, started: float) -> None:
    metrics.REQUESTS.labels(outcome, "true" if stream else "false").inc()
    metrics.LATENCY.observe(time.perf_counter() - started, exemplar=telemetry.exemplar())


class _Watcher:
    """Waits for the client's disconnect, then cancels the request's task with `left` set, so
    the request tells that cancellation from any other (`took`). The request runs on the same
    loop, so the cancellation lands at whatever it awaits then: its key's rate, the engine's
    answer, the next bytes of it, or a send to the client."""

    def __init__(self, receive: Receive, started: float) -> None:
        task = asyncio.current_task()
        assert task is not None, "a request runs in a task"
        self.task = task
        self.receive = receive
        self.started = started  # the request's start (perf_counter), for its latency
        self.left = False
        self.watch = asyncio.ensure_future(self._wait())

    async def _wait(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.left = True
        self.task.cancel()

    def took(self, stream: bool) -> bool:
        """Whether the cancellation the request got was this watcher's (the client left): then
        it is undone and counted; else it is someone else's to handle."""
        if not self.left:
            return False
        self.task.uncancel()
        metrics.DISCONNECTS.inc()
        _count("disconnected", stream, self.started)
        return True

    def stop(self) -> None:
        self.watch.cancel()
