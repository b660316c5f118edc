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
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import ASGIApp, Receive, Scope, Send

from interlude import telemetry
from interlude.api.wire import error_body
from interlude.gateway import metrics
from interlude.gateway.asgi import (
    BodyTooLarge,
    ClientLeft,
    header_map,
    log_request,
    read_body,
    send_json,
)
from interlude.gateway.guard import Guard
from interlude.gateway.hint import Hint
from interlude.gateway.refusals import REFUSED, refusal_of
from interlude.gateway.relay import Relay
from interlude.gateway.upstream import Answer, AnswerBroken, relay

log = logging.getLogger("interlude.gateway")

PATH = "/v1/chat/completions"
_SPAN = f"POST {PATH}"


class Front:
    """The gateway's ASGI app: `POST /v1/chat/completions` to `chat`, another method on that
    path to a 405, everything else (other routes, lifespan) to `app`."""

    def __init__(self, app: ASGIApp, chat: ChatRoute) -> None:
        self.app = app
        self.chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
        elif scope["method"] == "POST":
            await self.chat(scope, receive, send)
        else:
            body = error_body(
                f"{scope['method']} is not allowed here: POST", "invalid_request_error"
            )
            await send_json(send, 405, body, {"allow": "POST"})


class ChatRoute:
    """Serves chat completions through `relay`, after `guard`.

    Side effects: one engine request per admitted request (more only when engines cannot be
    reached); metrics, a span and a log line per request. Invariant: once the request's body
    is read, the engine's stream is closed when the client leaves, and the request is counted
    once however it ends.
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
        visit = _Visit(started)
        with trace.use_span(span, end_on_exit=True):
            try:
                await self._serve(scope, receive, send, headers, visit)
            finally:
                span.set_attribute("http.response.status_code", visit.status)
                if visit.status >= 500:
                    span.set_status(StatusCode.ERROR)
                log_request("POST", PATH, visit.status, started)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], visit: _Visit
    ) -> None:
        try:
            raw = await read_body(receive, headers, self.max_body_bytes)
        except BodyTooLarge:
            await self._error(send, visit, 413, f"request body over {self.max_body_bytes} bytes")
            return
        except ClientLeft:
            visit.status = 499
            return
        client = scope.get("client")
        visit.watch(receive)
        try:
            await self._answer(send, raw, headers, client[0] if client else "", visit)
        except asyncio.CancelledError:
            if not visit.took_cancel():
                raise
        finally:
            visit.unwatch()

    async def _answer(
        self, send: Send, raw: bytes, headers: Mapping[str, str], address: str, visit: _Visit
    ) -> None:
        """Admit, route and relay."""
        try:
            caller = await self.guard.admit(headers, address)
            hint = Hint.of(raw, self.relay.benchmark_mode)
            visit.stream = hint.stream
            answer, out = await self.relay.open(hint, raw, headers, caller, visit.started)
        except REFUSED as exc:
            r = refusal_of(exc)
            visit.status = r.status
            await send_json(send, r.status, r.body(), r.headers)
            return
        except AnswerBroken as exc:  # the engine took the request and went before answering
            log.warning("an engine's answer broke off before it began: %s", exc)
            await self._error(send, visit, 502, "the engine failed before it answered")
            return
        except Exception as exc:  # our own bug: a 500 with a reference, never internals
            ref = uuid.uuid4().hex[:12]
            log.error("internal error %s", ref, exc_info=exc)
            await self._error(send, visit, 500, f"internal error {ref}; see the gateway log")
            return
        visit.stream = answer.streamed
        await _relay(send, answer, out, visit)

    @staticmethod
    async def _error(send: Send, visit: _Visit, status: int, message: str) -> None:
        visit.status = status
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        await send_json(send, status, error_body(message, type_))


async def _relay(send: Send, answer: Answer, out: Mapping[str, str], visit: _Visit) -> None:
    """The engine's answer to the client, bytes as they come; counted once, however it ends
    (a client that left is counted by `_Visit.took_cancel`)."""
    raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out.items()]
    body: AsyncIterator[bytes] = relay(answer)
    finished = False
    try:
        if visit.left:  # the client left as the engine answered (a cancellation lost on the way)
            raise asyncio.CancelledError
        visit.status = answer.status_code
        await send({"type": "http.response.start", "status": visit.status, "headers": raw_headers})
        async for chunk in body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        finished = True
    finally:
        await body.aclose()  # type: ignore[attr-defined]
        if finished:
            visit.count(str(visit.status))
        elif not visit.left:  # broken off otherwise: counted as the old relay counted it
            visit.count("disconnected")


class _Visit:
    """One request's state: its start, whether it asked for a stream, the status the client
    got, and the watcher that cancels it when its client leaves (`left` set first, so the
    request tells that cancellation from any other: `took_cancel`). The request runs on the
    same loop, so the cancellation lands at whatever it awaits then: its key's rate, the
    engine's answer, the next bytes of it, or a send to the client."""

    def __init__(self, started: float) -> None:
        self.started = started  # perf_counter at the request's start
        self.stream = False
        self.status = 500  # what the client got (499: it left first)
        self.left = False
        self.counted = False
        self._watch: asyncio.Task[None] | None = None
        self._task: asyncio.Task[object] | None = None

    def watch(self, receive: Receive) -> None:
        self._task = asyncio.current_task()
        self._watch = asyncio.ensure_future(self._wait(receive))

    async def _wait(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left = True
        if self._task is not None:
            self._task.cancel()

    def unwatch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def took_cancel(self) -> bool:
        """Whether the cancellation the request got was the watcher's alone (the client
        left): then it is undone, and the request counted as a disconnect; else (a shutdown
        too) it is someone else's to handle."""
        if not self.left or self._task is None or self._task.uncancel() > 0:
            return False
        self.status = 499
        metrics.DISCONNECTS.inc()
        self.count("disconnected")
        return True

    def count(self, outcome: str) -> None:
        if self.counted:
            return
        self.counted = True
        metrics.REQUESTS.labels(outcome, "true" if self.stream else "false").inc()
        elapsed = time.perf_counter() - self.started
        metrics.LATENCY.observe(elapsed, exemplar=telemetry.exemplar())
