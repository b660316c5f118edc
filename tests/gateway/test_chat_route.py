"""The bare chat route (`gateway.chat_route`): a client that leaves is noticed from the moment
its body is read, so the engine's request is closed even while the engine has not answered yet
(a non-streamed completion, a long prefill). Under FastAPI's `StreamingResponse` only a client
leaving mid-body was noticed; one leaving earlier kept the engine working to the end.

Real processes' parts: a uvicorn server in a thread stands in for an engine that never answers a
POST and records when its caller goes away; the gateway is the real app on a real uvicorn
server; the client is a raw socket that sends one request and closes.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from interlude.gateway.app import make_app
from interlude.gateway.config import GatewayConfig

from .threaded import threaded_server

LOAD: dict[str, Any] = {"model": "tiny", "engine_id": "a", "ready": True, "max_num_seqs": 8}


class SilentEngine:
    """Answers `/v1/load`; takes a chat completion and never answers it, noting when the
    gateway closes that request (the ASGI disconnect)."""

    def __init__(self) -> None:
        self.posts = 0
        self.left_at: float | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["method"] == "GET":
            head = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": json.dumps(LOAD).encode()})
            return
        self.posts += 1
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left_at = time.monotonic()


@pytest.fixture
def engine(free_port: Callable[[], int]) -> Iterator[tuple[str, SilentEngine]]:
    silent = SilentEngine()
    with threaded_server(silent, free_port()) as url:
        yield url, silent


@pytest.fixture
def gateway(engine: tuple[str, SilentEngine], free_port: Callable[[], int]) -> Iterator[str]:
    config = GatewayConfig(engines=(engine[0],), auth=False, rate_limit="", request_timeout_s=60)
    with threaded_server(make_app(config), free_port()) as url:
        yield url


def _post_and_leave(gateway: str, body: dict[str, Any]) -> None:
    """Send one chat completion on a raw connection and close it without reading an answer."""
    host, port = gateway.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(raw)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head + raw)
        time.sleep(0.5)  # the body is read and the request is with the engine


def _disconnects(gateway: str) -> float:
    for line in httpx.get(gateway + "/metrics").text.splitlines():
        if line.startswith("interlude:gateway_client_disconnects_total "):
            return float(line.split()[1])
    return 0.0


def test_a_client_leaving_before_the_engine_answers_closes_the_engine_request(
    gateway: str, engine: tuple[str, SilentEngine]
) -> None:
    silent = engine[1]
    before = _disconnects(gateway)
    left = time.monotonic()
    _post_and_leave(gateway, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    end = time.monotonic() + 10
    while silent.left_at is None:
        assert time.monotonic() < end, "the engine's request outlived its client by 10 s"
        time.sleep(0.05)
    assert silent.posts == 1
    assert silent.left_at - left < 3.0
    assert _disconnects(gateway) == before + 1


def test_an_answer_the_client_waits_for_still_comes(
    gateway: str, engine: tuple[str, SilentEngine], caplog: pytest.LogCaptureFixture
) -> None:
    """The watcher leaves a client that stays alone: a refusal still answers in the envelope
    (logged with its trace id), another method gets a 405 naming POST, and a request whose
    engine is silent is still waiting when its client gives up."""
    caplog.set_level(logging.INFO, "interlude.gateway")
    r = httpx.post(gateway + "/v1/chat/completions", content=b"[1]", timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    lines = [m for m in caplog.messages if m.startswith("POST /v1/chat/completions 400")]
    assert len(lines) == 1 and re.search(r"trace_id=[0-9a-f]{32}$", lines[0]), lines
    r = httpx.get(gateway + "/v1/chat/completions", timeout=5)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gateway + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=1.0,
        )
