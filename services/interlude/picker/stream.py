"""One request's ext_proc stream: Envoy opens one per HTTP request and sends its parts in
order (headers, body chunks, trailers; then the response's if configured to); the picker
answers each part in the same order.

The body is read once, for the choice (`Decider`); in full duplex mode it is held until its
last chunk, then the headers' answer (the route) and the whole body go back. Response parts,
if the proxy sends them at all, go back untouched: the picker never changes an answer.
"""

from __future__ import annotations

import logging
import time

from interlude.gateway.refusals import Refusal
from interlude.picker import metrics
from interlude.picker.decide import Decider, Route, refused_route
from interlude.picker.protocol import (
    BUFFERED,
    FULL_DUPLEX,
    NO_BODY,
    Message,
    body_back,
    client_of,
    headers_of,
    passed,
    refused,
    routed_body,
    routed_headers,
    subset_of,
)

log = logging.getLogger(__name__)


class Exchange:
    """The picker's side of one ext_proc stream.

    Side effects: metrics; one `Decider.decide` per request. Invariant: exactly one answer
    routes or refuses the request, and it comes before any of the body goes back.
    """

    def __init__(self, decider: Decider) -> None:
        self.decider = decider
        self.request_mode = FULL_DUPLEX  # until the proxy says otherwise (protocol_config)
        self.response_mode = NO_BODY
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.client = ""
        self.body = bytearray()
        self.route: Route | None = None
        self.done = False  # refused: the proxy answered the client and ends the stream

    async def on(self, message: Message) -> list[Message]:
        """The answers to one message from the proxy (none while a body is still arriving)."""
        if self.done:
            return []
        if message.HasField("protocol_config"):
            self.request_mode = message.protocol_config.request_body_mode
            self.response_mode = message.protocol_config.response_body_mode
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return await self._headers(message)
        if kind == "request_body":
            return await self._body(message.request_body.body, message.request_body.end_of_stream)
        if kind == "request_trailers":
            return [*await self._body(b"", True, trailers=True), passed("request_trailers")]
        if kind == "response_body" and self.response_mode == FULL_DUPLEX:
            part = message.response_body
            return [body_back(part.body, part.end_of_stream, response=True)]
        if kind in ("response_headers", "response_body", "response_trailers"):
            return [passed(kind)]
        log.warning("ext_proc message of an unknown kind: %s", kind)
        return []

    async def _headers(self, message: Message) -> list[Message]:
        self.headers = headers_of(message.request_headers)
        self.subset = subset_of(message)
        self.client = client_of(message, self.headers)
        if (refusal := refused_route(self.headers)) is not None:  # before its body arrives
            return [self._refuse(refusal)]
        if message.request_headers.end_of_stream or self.request_mode == NO_BODY:
            # No body (GET /v1/models), or one the proxy will not show: routed on headers.
            return [await self._answer(None)]
        if self.request_mode == BUFFERED:
            return [passed("request_headers")]  # the answer comes with the body
        if self.request_mode != FULL_DUPLEX:
            message = (
                "the proxy streams the body to the endpoint picker in a mode it cannot route "
                "by (set the ext_proc request body mode to FULL_DUPLEX_STREAMED or BUFFERED)"
            )
            return [self._refuse(Refusal(500, message, "server_error"))]
        return []

    async def _body(self, chunk: bytes, end: bool, trailers: bool = False) -> list[Message]:
        if self.route is not None:  # routed already: the rest passes (it should not come)
            return [body_back(chunk, end)] if self.request_mode == FULL_DUPLEX and chunk else []
        self.body += chunk
        limit = self.decider.config.max_body_bytes
        if len(self.body) > limit:  # refused before the rest arrives
            return [await self._answer(bytes(self.body))]
        if not end:
            return []
        answer = await self._answer(bytes(self.body))
        if self.route is None or self.request_mode != FULL_DUPLEX:
            return [answer]
        # Full duplex: the route answers the headers, then the body goes back whole.
        return [answer, body_back(bytes(self.body), not trailers)]

    async def _answer(self, body: bytes | None) -> Message:
        started = time.perf_counter()
        verdict = await self.decider.decide(self.headers, body, self.subset, self.client)
        metrics.PICK_SECONDS.observe(time.perf_counter() - started)
        if isinstance(verdict, Refusal):
            return self._refuse(verdict)
        self.route = verdict
        for route in verdict.routes:
            metrics.PICKS.labels(route).inc()
        if body is not None and self.request_mode == BUFFERED:
            return routed_body(verdict)
        sent_back = len(body) if body is not None and self.request_mode == FULL_DUPLEX else None
        return routed_headers(verdict, sent_back)

    def _refuse(self, refusal: Refusal) -> Message:
        """The immediate answer that ends this exchange, counted."""
        self.done = True
        metrics.REFUSALS.labels(str(refusal.status)).inc()
        return refused(refusal)
