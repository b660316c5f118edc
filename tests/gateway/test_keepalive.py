"""Both SSE readers (the gateway's relay from its engine, the load generator's client) keep
their connection for the next request: a stream closed before its body's end (right after `[DONE]`)
closes its connection, and every turn then pays a new one on each hop. And both read a frame
whose JSON carries line separators unescaped (U+2028, U+0085), as stock vLLM writes a model's
text, as one frame.

A real uvicorn server streams the frames; the client's port, as the server sees it, tells the
connections apart.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn

from interlude.api.wire import SERVER_KEEP_ALIVE_S
from interlude.gateway import upstream
from interlude.gateway.upstream import Upstream, relay
from interlude.loadgen import replay
from interlude.loadgen.stream import chat

UVICORN_DEFAULT_KEEP_ALIVE_S = uvicorn.Config(app=None).timeout_keep_alive

TEXT = "hi\u2028there\x85\u2029!"  # separators `str.splitlines` (and httpx's lines) split at
FRAMES = (
    {"choices": [{"index": 0, "delta": {"content": TEXT}, "finish_reason": None}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@asynccontextmanager
async def sse_server(free_port: Callable[[], int]) -> AsyncIterator[tuple[str, list[int]]]:
    """A server answering every POST with FRAMES and `[DONE]` as SSE; yields its URL and the
    client port of every request it served."""
    ports: list[int] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        ports.append(scope["client"][1])
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for frame in [*(json.dumps(f, ensure_ascii=False) for f in FRAMES), "[DONE]"]:
            body = f"data: {frame}\n\n".encode()
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with serving(app, free_port()) as url:
        yield url, ports


@asynccontextmanager
async def serving(app: Any, port: int) -> AsyncIterator[str]:
    """`app` on a real uvicorn server at `port`; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="critical", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def test_the_load_generator_reuses_its_connection(free_port: Callable[[], int]) -> None:
    async def main() -> list[int]:
        async with sse_server(free_port) as (url, ports), httpx.AsyncClient() as http:
            for _ in range(3):
                answer = await chat(http, url, {"model": "m", "messages": []})
                assert answer.content == TEXT and answer.completion_tokens == 1
            return ports

    ports = asyncio.run(main())
    assert len(ports) == 3 and len(set(ports)) == 1


def test_the_gateways_engine_legs_reuse_their_connection(free_port: Callable[[], int]) -> None:
    async def main() -> list[int]:
        upstream = Upstream(connect_timeout_s=5.0, request_timeout_s=10.0)
        try:
            async with sse_server(free_port) as (url, ports):
                for _ in range(3):
                    response = await upstream.open(url, b"{}", {})
                    body = b"".join([chunk async for chunk in relay(response)])
                    # The engine's bytes, relayed unread to their end (`[DONE]` included).
                    data = [f[6:] for f in body.decode().split("\n\n") if f]
                    assert [json.loads(d) for d in data[:-1]] == list(FRAMES)
                    assert data[-1] == "[DONE]"
                return ports
        finally:
            await upstream.close()

    ports = asyncio.run(main())
    assert len(ports) == 3 and len(set(ports)) == 1


def test_clients_give_idle_connections_up_before_servers_close_them() -> None:
    # A request sent on a connection the server is closing at that instant fails unread
    # (`interlude.api.wire.SERVER_KEEP_ALIVE_S`); so each client must let go first. The servers'
    # own setting is checked on the real stack (test_stack.py).
    assert upstream.KEEPALIVE_S < SERVER_KEEP_ALIVE_S
    assert replay.KEEPALIVE_S < UVICORN_DEFAULT_KEEP_ALIVE_S  # stock vLLM's server keeps 5 s


@asynccontextmanager
async def breaking_server(free_port: Callable[[], int], abort: bool) -> AsyncIterator[str]:
    """A server streaming one frame, then ending its body without `[DONE]` (`abort`: by
    dropping the connection, as a dying engine does)."""

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        body = f"data: {json.dumps(FRAMES[0])}\n\n".encode()
        await send({"type": "http.response.body", "body": body, "more_body": True})
        if abort:
            raise RuntimeError("the engine died")
        await send({"type": "http.response.body", "body": b""})

    async with serving(app, free_port()) as url:
        yield url


def test_a_stream_cut_before_its_end_ends_with_an_error_frame(free_port: Callable[[], int]) -> None:
    async def main(abort: bool) -> list[str]:
        upstream = Upstream(connect_timeout_s=5.0, request_timeout_s=10.0)
        try:
            async with breaking_server(free_port, abort) as url:
                response = await upstream.open(url, b"{}", {})
                body = b"".join([chunk async for chunk in relay(response)])
                return [f[6:] for f in body.decode().split("\n\n") if f]
        finally:
            await upstream.close()

    for abort in (False, True):
        data = asyncio.run(main(abort))
        assert json.loads(data[0]) == FRAMES[0]  # what the engine sent, relayed
        assert json.loads(data[1])["error"]["type"] == "server_error", data
        assert data[2:] == ["[DONE]"]
