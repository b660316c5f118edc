"""The engine's end of the multiplexed link (`api/mux.py`): ``WS /v1/mux``.

Each REQUEST on the link is served by this engine's own ASGI app, in-process, exactly as if it
had come on a connection of its own (same routes, errors, headers, disconnect handling); what
the app sends back becomes START, DATA and END frames. Frames wait in the link's outbox and
one writer sends everything there in one WebSocket message, after letting the event loop run a
few more turns: the tokens of one engine step reach many answers in the same turns, so they
leave together.

A CANCEL, or the link closing, is that exchange's `http.disconnect`: the chat route cancels
the session and frees its KV, as when a client's own connection drops. With a gateway token
configured, the link is accepted only from a caller presenting it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from prometheus_client import Counter, Gauge
from starlette.types import ASGIApp, Message

from interlude.api import mux
from interlude.api.engine import from_gateway
from interlude.api.wire import error_body

log = logging.getLogger(__name__)

# Here, not in `engine/metrics.py` (which imports vLLM's), so a stand-in engine can serve the link.
# Frames / messages: how many answers' bytes one socket write carries.
MUX_LINKS = Gauge("interlude:mux_links", "Gateways' multiplexed links open on this engine")
MUX_EXCHANGES = Counter("interlude:mux_exchanges", "Requests served over multiplexed links")
MUX_MESSAGES = Counter("interlude:mux_messages", "WebSocket messages sent on multiplexed links")
MUX_FRAMES = Counter("interlude:mux_frames", "Frames sent on multiplexed links")

# Event-loop turns the writer lets pass before it sends: a token goes from vLLM's output
# handler through a few awaits to the route's `send`, and every answer of the step should be
# in the outbox by then. Each turn costs microseconds; a token's step takes milliseconds.
COALESCE_TURNS = 2
# A message's size past which the writer starts another (well under `mux.MAX_MESSAGE`).
MESSAGE_BYTES = 1024 * 1024
# WebSocket close code for a caller without the gateway's token (policy violation).
_FORBIDDEN = 1008


class Exchange:
    """One request on the link, served by the app. Its `receive` gives the body, then waits
    for the exchange to end or be cancelled (then `http.disconnect`)."""

    def __init__(self, link: Link, stream: int, body: bytes) -> None:
        self.link = link
        self.stream = stream
        self.body: bytes | None = body
        self.gone = asyncio.get_running_loop().create_future()
        self.started = self.ended = False

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.shield(self.gone)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.gone.done():
            return  # the gateway no longer reads it
        if message["type"] == "http.response.start":
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message["headers"]]
            self.started = True
            self.link.put(
                mux.frame(
                    self.stream, mux.Kind.START, mux.start_payload(message["status"], headers)
                )
            )
        elif message["type"] == "http.response.body":
            if body := message.get("body", b""):
                self.link.put(*mux.data_frames(self.stream, bytes(body)))
            if not message.get("more_body", False):
                self.end()

    def end(self) -> None:
        """The answer is whole (or given up): END, and the exchange is over."""
        if not self.ended:
            self.ended = True
            self.link.put(mux.frame(self.stream, mux.Kind.END))
        self.cancel()

    def cancel(self) -> None:
        if not self.gone.done():
            self.gone.set_result(None)


class Link:
    """One gateway's WebSocket: its exchanges by stream id, and the outbox of frames to send.

    Side effects: one task per exchange running the app, one writer task. Invariant: every
    exchange that started gets an END (a failed app's too, after a 500 if it had not started),
    unless the link closed first, which ends them all as disconnected.
    """

    def __init__(self, app: ASGIApp, ws: WebSocket) -> None:
        self.app = app
        self.ws = ws
        self.exchanges: dict[int, Exchange] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.outbox: list[bytes] = []
        self.ready = asyncio.Event()

    def put(self, *frames: bytes) -> None:
        self.outbox.extend(frames)
        self.ready.set()

    async def serve(self) -> None:
        """Read the gateway's frames until the link closes; then end everything on it."""
        writer = asyncio.create_task(self._write())
        try:
            while True:
                for stream, kind, payload in mux.frames(await self.ws.receive_bytes()):
                    if kind is mux.Kind.REQUEST:
                        self._start(stream, payload)
                    elif kind is mux.Kind.CANCEL and (ex := self.exchanges.get(stream)):
                        ex.cancel()
        except (WebSocketDisconnect, RuntimeError):
            pass  # closed (RuntimeError: Starlette's "not connected" once it is)
        except mux.MuxError as exc:
            log.warning("closing a mux link that sent a bad frame: %s", exc)
        finally:
            for ex in self.exchanges.values():
                ex.cancel()
            writer.cancel()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(writer, *self.tasks, return_exceptions=True)

    def _start(self, stream: int, payload: bytes) -> None:
        try:
            method, path, headers, body = mux.parse_request(payload)
        except mux.MuxError as exc:
            self._refuse(stream, str(exc))
            return
        ex = Exchange(self, stream, body)
        MUX_EXCHANGES.inc()
        self.exchanges[stream] = ex
        task = asyncio.create_task(self._run(ex, method, path, headers))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, ex: Exchange, method: str, path: str, headers: dict[str, str]) -> None:
        try:
            await self.app(self._scope(method, path, headers), ex.receive, ex.send)
        except Exception:
            log.exception("a request on the mux link failed")
            if not ex.started and not ex.gone.done():
                self._refuse(ex.stream, "the engine failed the request", 500, "server_error")
        finally:
            ex.end()
            self.exchanges.pop(ex.stream, None)

    def _scope(self, method: str, path: str, headers: dict[str, str]) -> dict[str, Any]:
        """The HTTP scope the app would get for this request on a connection of its own."""
        ws = self.ws.scope
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
            ],
            "client": ws.get("client"),
            "server": ws.get("server"),
            "state": dict(ws.get("state", {})),
        }

    def _refuse(
        self, stream: int, message: str, status: int = 400, type_: str = "invalid_request_error"
    ) -> None:
        body = json.dumps(error_body(message, type_)).encode()
        start = mux.start_payload(status, [("content-type", "application/json")])
        self.put(
            mux.frame(stream, mux.Kind.START, start),
            *mux.data_frames(stream, body),
            mux.frame(stream, mux.Kind.END),
        )

    async def _write(self) -> None:
        while True:
            await self.ready.wait()
            for _ in range(COALESCE_TURNS):
                await asyncio.sleep(0)
            self.ready.clear()
            out, self.outbox = self.outbox, []
            MUX_FRAMES.inc(len(out))
            for message in _messages(out):
                MUX_MESSAGES.inc()
                await self.ws.send_bytes(message)


def _messages(frames: list[bytes]) -> Iterator[bytes]:
    """The frames joined into messages of about `MESSAGE_BYTES` at most (a frame is never cut)."""
    start, size = 0, 0
    for i, f in enumerate(frames):
        if size and size + len(f) > MESSAGE_BYTES:
            yield b"".join(frames[start:i])
            start, size = i, 0
        size += len(f)
    if start < len(frames):
        yield b"".join(frames[start:])


def mux_router(gateway_token: str) -> APIRouter:
    """``WS /v1/mux``: each exchange is served by the app the route belongs to."""
    router = APIRouter()

    @router.websocket(mux.MUX_PATH)
    async def link(ws: WebSocket) -> None:
        if not from_gateway(ws.headers, gateway_token):
            await ws.close(_FORBIDDEN)
            return
        await ws.accept()
        MUX_LINKS.inc()
        try:
            await Link(ws.scope["app"], ws).serve()
        finally:
            MUX_LINKS.dec()
        # The link usually ends because the gateway closed it (a shutdown, a restart): there
        # is then nobody to close it towards, which is not an error.
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close()

    return router
