"""One failed connect does not take an engine out of the pool; its polls decide.

A continuation whose engine cannot be reached goes to another engine (which recomputes it), and
the unreachable engine stays in the pool until `failures` polls in a row miss it: a restart of
a few seconds, or one refused connect, must not push every paused session on it to recompute.
Two real uvicorn servers stand in for engines (their `/v1/load` and a one-frame SSE answer);
one of them is stopped and started again on its port.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY

from interlude.api.names import engine_tag
from interlude.gateway.hint import Hint
from interlude.gateway.relay import Relay
from interlude.gateway.roster import EngineRoster, StaticDiscovery
from interlude.gateway.upstream import Answer, Upstream, relay

from .test_keepalive import Receive, Send, serving


def engine_app(engine_id: str) -> Any:
    """An ASGI app answering `/v1/load` as an engine named `engine_id` and any POST with one
    SSE frame naming it."""

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["method"] == "GET":
            body = json.dumps({"model": "tiny", "engine_id": engine_id, "ready": True})
            kind = b"application/json"
        else:
            body, kind = f"data: {engine_id}\n\ndata: [DONE]\n\n", b"text/event-stream"
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]}
        )
        await send({"type": "http.response.body", "body": body.encode()})

    return app


def _retries() -> float:
    value = REGISTRY.get_sample_value("interlude:gateway_routes_total", {"decision": "retry"})
    return value or 0.0


async def _body(answer: Answer) -> bytes:
    return b"".join([chunk async for chunk in relay(answer)])


def test_an_unreachable_engine_stays_until_its_polls_fail(free_port: Callable[[], int]) -> None:
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"

    async def main() -> None:
        upstream = Upstream(connect_timeout_s=2.0, request_timeout_s=5.0)
        pool = EngineRoster(StaticDiscovery((url_a, url_b)), upstream, interval_s=60.0)
        relay = Relay(pool, upstream, token="")
        continuation = Hint("tiny", engine_tag("a"))  # its paused session is on engine a
        try:
            async with serving(engine_app("b"), port_b):
                async with serving(engine_app("a"), port_a):
                    await pool.poll()
                    assert [e.url for e in pool.ready()] == [url_a, url_b]
                    response, _ = await relay._send(continuation, b"{}", {})
                    assert (await _body(response)).startswith(b"data: a")
                # Engine a is down: the continuation goes to b, and a stays in the pool.
                before = _retries()
                response, _ = await relay._send(continuation, b"{}", {})
                assert (await _body(response)).startswith(b"data: b")
                assert _retries() == before + 1
                assert pool.is_ready(url_a) and pool.engines[url_a].failures == 0
                await pool.poll()  # one missed read: still in (failures=2)
                assert pool.is_ready(url_a)
                await pool.poll()
                assert not pool.is_ready(url_a) and pool.is_ready(url_b)
                async with serving(engine_app("a"), port_a):
                    await pool.poll()  # one good read brings it back
                    assert pool.is_ready(url_a)
                    response, _ = await relay._send(continuation, b"{}", {})
                    assert (await _body(response)).startswith(b"data: a")
        finally:
            await upstream.close()

    asyncio.run(main())
