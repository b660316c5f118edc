"""The wire formats the engine and the gateway share: OpenAI's error envelope and SSE frames,
and how long either keeps an idle connection."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error envelope: every error either service answers has this shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse(payload: dict[str, Any] | str) -> bytes:
    """One SSE frame; every frame ends with a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = sse("[DONE]")


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """An SSE body's lines, split only where the SSE spec ends a line (CRLF, LF or CR).

    Not `httpx`'s `aiter_lines`: it splits as `str.splitlines` does, also at U+2028, U+0085
    and other separators that JSON may carry unescaped inside a string (stock vLLM's frames do,
    when a model writes one), which cut a frame in two. UTF-8 never has these bytes inside a
    character, so the body is split as bytes and each line decoded whole.
    """
    buf = b""
    async for chunk in chunks:
        buf += chunk
        start = 0
        while True:
            ends = [k for k in (buf.find(b"\r", start), buf.find(b"\n", start)) if k >= 0]
            i = min(ends, default=-1)
            if i < 0 or (buf[i] == 13 and i + 1 == len(buf)):  # a CR may start a CRLF
                break
            yield buf[start:i].decode(errors="replace")
            start = i + (2 if buf[i : i + 2] == b"\r\n" else 1)
        buf = buf[start:]
    if buf:
        yield buf.rstrip(b"\r").decode(errors="replace")


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The `data:` payloads of an SSE body (its raw byte chunks), up to `[DONE]`.

    The body is read past `[DONE]` to its end (the servers end it there): a response closed
    unread closes its connection, and the next request would pay a new one.
    """
    done = False
    async for line in sse_lines(chunks):
        if done or not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        yield line[6:]


# Seconds the engine and the gateway keep a client's idle connection open (uvicorn's
# `timeout_keep_alive`, 5 s by default). A client that reuses a connection just as the server
# closes it gets a ReadError for a request the server never read: with idle gaps of about the
# timeout, 12 of 300 requests failed so (client expiry 5 s, server 1 s; none with 0.8 s). So
# every client must give idle connections up first: httpx and the OpenAI SDK do after 5 s,
# the gateway's engine pool after `gateway.upstream.KEEPALIVE_S`.
SERVER_KEEP_ALIVE_S = 75
