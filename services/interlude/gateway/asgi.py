"""Plain-ASGI pieces the gateway's routes share: request headers as a dict, a body read under a
byte limit, a JSON answer, and the one log line per request.

Plain ASGI because the chat route (`chat_route`) is served outside FastAPI: its routing,
dependency injection, middleware stack and `StreamingResponse` cost more CPU than the request's
own work (docs/gateway.md, "A bare route for chat").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from starlette.types import Receive, Scope, Send

log = logging.getLogger("interlude.gateway")

PROBES = ("/health", "/ready", "/metrics")


class BodyTooLarge(Exception):
    """The request's body is over the limit (a 413)."""


class ClientLeft(Exception):
    """The client went away before its body was read."""


def header_map(scope: Scope) -> dict[str, str]:
    """The request's headers, names lower-cased (as ASGI sends them); a repeated header keeps
    its last value, which no header the gateway reads is allowed to be."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def read_body(receive: Receive, headers: Mapping[str, str], max_bytes: int) -> bytes:
    """The whole body; BodyTooLarge when its declared length or what came of it passes
    `max_bytes` (reading stops there), ClientLeft when the client disconnects first."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientLeft
        body += message.get("body", b"")
        if len(body) > max_bytes:
            raise BodyTooLarge
        if not message.get("more_body", False):
            return bytes(body)


async def send_json(
    send: Send, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> None:
    """A whole JSON answer in two ASGI messages."""
    content = json.dumps(body, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


def log_request(method: str, path: str, status: int, started: float) -> None:
    """One line per API request, with its trace id (probes are not logged)."""
    if path in PROBES or not log.isEnabledFor(logging.INFO):
        return
    ctx = trace.get_current_span().get_span_context()
    log.info(
        "%s %s %d %.1f ms trace_id=%s",
        method,
        path,
        status,
        (time.perf_counter() - started) * 1000,
        format(ctx.trace_id, "032x") if ctx.is_valid else "-",
    )
