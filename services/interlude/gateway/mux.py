"""The gateway's end of the multiplexed link (`api/mux.py`): chat completions to each engine
over one WebSocket, instead of an HTTP connection per request.

`MuxUpstream.open` sends a request as a REQUEST frame on the engine's link (connected on first
use) and returns a `MuxAnswer` once its START came; the link's reader hands each answer its DATA
as it arrives, many answers' tokens in one message. Closing an answer early sends CANCEL, which
the engine takes as the client's disconnect. A link that closes breaks every answer still on it
(`relay` then ends an SSE answer with an error frame, as when a connection drops); the next
request connects again. An engine that refuses the link (an older engine without it) is called
over plain HTTP for a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping

import aiohttp

from interlude.api import mux
from interlude.api.engine import GATEWAY_TOKEN_HEADER
from interlude.gateway.upstream import Answer, AnswerBroken, EngineError, Upstream

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
# How long an engine that refused the link is called over HTTP before the link is tried again.
HTTP_FALLBACK_S = 60.0
# Pings on an idle link, so a peer that vanished is noticed without waiting for a request.
HEARTBEAT_S = 20.0
# An answer's bytes held for a client that does not read them: past this the answer is given
# up (its session cancelled on the engine). Over its own connection TCP would slow the engine's
# stream instead; on the link one stream must not hold the others back, so it is bounded here.
MAX_BUFFERED_BYTES = 16 * 1024 * 1024


class MuxAnswer(Answer):
    """One exchange on a link, fed by the link's reader; `chunks` reads what was fed."""

    def __init__(self, link: MuxLink, stream: int) -> None:
        self.link = link
        self.stream = stream
        self.status_code = 0
        self.headers: Mapping[str, str] = {}
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last = time.monotonic()  # the last frame's arrival (the read timeout's start)
        self._parts: list[bytes] = []
        self._buffered = 0  # bytes in `_parts`
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._broken: str | None = None
        self._closed = False

    def feed(self, kind: mux.Kind, payload: bytes) -> None:
        self.last = time.monotonic()
        if kind is mux.Kind.DATA:
            self._parts.append(payload)
            self._buffered += len(payload)
            if self._buffered > MAX_BUFFERED_BYTES:
                self._parts, self._buffered = [], 0
                self.close(False)  # first: a broken answer would not be cancelled
                self.break_off(f"the client read nothing of {MAX_BUFFERED_BYTES} bytes")
                return
        elif kind is mux.Kind.START and not self.started.done():
            self.status_code, self.headers = mux.parse_start(payload)
            self.started.set_result(None)
        elif kind is mux.Kind.END:
            self._ended = True
        self._wake()

    def break_off(self, reason: str) -> None:
        if self._ended or self._broken is not None:
            return
        self._broken = reason
        if not self.started.done():
            self.started.set_exception(AnswerBroken(reason))
            self.started.exception()  # retrieved: whoever awaits it gets it all the same
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self._parts:
                parts, self._parts, self._buffered = self._parts, [], 0
                yield parts[0] if len(parts) == 1 else b"".join(parts)
            elif self._ended:
                return
            elif self._broken is not None:
                raise AnswerBroken(self._broken)
            else:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None

    def close(self, whole: bool) -> None:
        if not self._closed:
            self._closed = True
            self.link.forget(self.stream, cancel=not (whole or self._ended or self._broken))


class MuxLink:
    """One engine's WebSocket and the answers open on it.

    Side effects: a reader task and a timer task for the link's life; one message per request
    and per cancellation. Invariant: when the link closes, every answer on it is broken off,
    and none is added after.
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, read_timeout_s: float) -> None:
        self.ws = ws
        self.read_timeout_s = read_timeout_s
        self.answers: dict[int, MuxAnswer] = {}
        self.next_stream = 1
        self.closed = False
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._time_out())]

    async def open(self, body: bytes, headers: Mapping[str, str]) -> MuxAnswer:
        """Send the request; its answer once the engine started it. EngineError(0) if the
        link was closed before it could be sent (nothing reached the engine); AnswerBroken if
        it closed after."""
        if self.closed:
            raise EngineError(0, "the link to the engine is closed")
        stream, self.next_stream = self.next_stream, self.next_stream % 0xFFFFFFFF + 1
        answer = MuxAnswer(self, stream)
        payload = mux.request_payload("POST", CHAT_PATH, headers, body)
        self.answers[stream] = answer
        try:
            await self.ws.send_bytes(mux.frame(stream, mux.Kind.REQUEST, payload))
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            self.answers.pop(stream, None)
            raise EngineError(0, f"the link to the engine failed: {exc!r}") from None
        try:
            await answer.started
        except asyncio.CancelledError:
            answer.close(False)
            raise
        return answer

    def forget(self, stream: int, cancel: bool) -> None:
        """The answer is done with; `cancel`: tell the engine its caller left."""
        if self.answers.pop(stream, None) is not None and cancel and not self.closed:
            task = asyncio.get_running_loop().create_task(self._cancel(stream))
            self._tasks.append(task)
            task.add_done_callback(self._tasks.remove)

    async def _cancel(self, stream: int) -> None:
        with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
            await self.ws.send_bytes(mux.frame(stream, mux.Kind.CANCEL))

    async def _read(self) -> None:
        reason = "the engine closed the link"
        try:
            async for message in self.ws:
                if message.type is aiohttp.WSMsgType.ERROR:
                    reason = f"the link failed: {message.data!r}"
                    break
                if message.type is not aiohttp.WSMsgType.BINARY:
                    continue
                for stream, kind, payload in mux.frames(message.data):
                    if (answer := self.answers.get(stream)) is not None:
                        answer.feed(kind, payload)
        except mux.MuxError as exc:
            reason = f"the engine sent a bad frame: {exc}"
            log.warning("closing the link to an engine: %s", reason)
        finally:
            self._close(reason)
            await self.ws.close()

    async def _time_out(self) -> None:
        """Break off answers that got nothing for the read timeout (as a connection's read
        timeout would), checked a few times per timeout."""
        while True:
            await asyncio.sleep(min(self.read_timeout_s / 4, 5.0))
            now = time.monotonic()
            for answer in list(self.answers.values()):
                if now - answer.last > self.read_timeout_s:
                    answer.break_off(f"nothing from the engine for {self.read_timeout_s:g} s")

    def _close(self, reason: str) -> None:
        self.closed = True
        for answer in self.answers.values():
            answer.break_off(reason)
        self.answers.clear()

    async def close(self) -> None:
        self._close("the gateway is stopping")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ws.close()


class MuxUpstream(Upstream):
    """`Upstream` whose chat completions go over each engine's link (loads stay plain HTTP).

    Side effects: one WebSocket per engine, opened on first use and again after it closes.
    """

    def __init__(self, connect_timeout_s: float, request_timeout_s: float, token: str) -> None:
        super().__init__(connect_timeout_s, request_timeout_s)
        self.request_timeout_s = request_timeout_s
        self.token = token
        self.links: dict[str, MuxLink] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._http_until: dict[str, float] = {}  # engines that refused the link, until when

    async def open(self, engine: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        if self._http_until.get(engine, 0.0) > time.monotonic():
            return await super().open(engine, body, headers)
        link = await self._link(engine)
        if link is None:
            return await super().open(engine, body, headers)
        return await link.open(body, headers)

    async def _link(self, engine: str) -> MuxLink | None:
        """The engine's open link, connected if it has none; None if the engine refused it."""
        link = self.links.get(engine)
        if link is not None and not link.closed:
            return link
        async with self._locks.setdefault(engine, asyncio.Lock()):
            link = self.links.get(engine)
            if link is not None and not link.closed:
                return link
            try:
                ws = await self.http.ws_connect(
                    engine + mux.MUX_PATH,
                    headers={GATEWAY_TOKEN_HEADER: self.token} if self.token else None,
                    max_msg_size=mux.MAX_MESSAGE,
                    heartbeat=HEARTBEAT_S,
                )
            except aiohttp.WSServerHandshakeError as exc:
                log.warning("engine %s refused the mux link (%s): plain HTTP", engine, exc.status)
                self._http_until[engine] = time.monotonic() + HTTP_FALLBACK_S
                return None
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise EngineError(0, f"engine {engine} unreachable: {exc!r}") from None
            self.links[engine] = link = MuxLink(ws, self.request_timeout_s)
            return link

    async def close(self) -> None:
        for link in list(self.links.values()):
            await link.close()
        self.links.clear()
        await super().close()
