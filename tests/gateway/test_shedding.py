"""Shedding, the choice the gateway and the endpoint picker share (`gateway.placement`): with
`shed_queue`, a new session gets a 429 when every engine that could take it has that many
requests waiting per slot; a continuation is never shed (its KV is parked on its engine).

A real uvicorn server in a thread stands in for an engine (its `/v1/load` says how many wait;
a POST gets a one-line JSON answer); the gateway is the real app (FastAPI's TestClient)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from interlude.api.names import engine_tag, new_call_id
from interlude.gateway.app import make_app
from interlude.gateway.config import GatewayConfig
from interlude.gateway.hint import Hint
from interlude.gateway.placement import Shed, place
from interlude.gateway.roster import EngineRoster, EngineState, StaticDiscovery

from .threaded import threaded_server

LOAD: dict[str, Any] = {"model": "tiny", "engine_id": "a", "ready": True, "max_num_seqs": 8}


async def _engine(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = LOAD if scope["method"] == "GET" else {"served": True}
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


@pytest.fixture
def engine(free_port: Callable[[], int]) -> Iterator[str]:
    with threaded_server(_engine, free_port(), lifespan="off") as url:
        yield url


def _chat(messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages or [{"role": "user", "content": "hi"}]}


def _continuation(engine_id: str) -> list[dict[str, Any]]:
    call = new_call_id(engine_tag(engine_id))
    fn = {"name": "w", "arguments": "{}"}
    return [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": call, "type": "function", "function": fn}]},
        {"role": "tool", "tool_call_id": call, "content": "18 C"},
    ]


def test_the_gateway_sheds_new_sessions_with_a_429_and_serves_continuations(engine: str) -> None:
    LOAD["waiting"] = 16  # 2 per slot
    config = GatewayConfig(engines=(engine,), auth=False, rate_limit="", shed_queue=2.0)
    with TestClient(make_app(config)) as client:
        r = client.post("/v1/chat/completions", json=_chat())
        assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "overloaded"
        assert r.headers["retry-after"] == "1"
        resumed = client.post("/v1/chat/completions", json=_chat(_continuation("a")))
        assert resumed.status_code == 200 and resumed.json() == {"served": True}


def test_without_shed_queue_nothing_is_shed(engine: str) -> None:
    LOAD["waiting"] = 800
    config = GatewayConfig(engines=(engine,), auth=False, rate_limit="")
    with TestClient(make_app(config)) as client:
        assert client.post("/v1/chat/completions", json=_chat()).status_code == 200


def test_one_engine_under_the_limit_takes_the_session() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(1))  # type: ignore[arg-type]
    full = EngineState("http://a", True, load={"model": "tiny", "max_num_seqs": 8, "waiting": 16})
    room = EngineState("http://b", True, load={"model": "tiny", "max_num_seqs": 8, "waiting": 15})
    pool.engines = {"http://a": full, "http://b": room}
    for _ in range(3):
        at = place(pool, Hint("tiny", None), shed_queue=2.0)
        assert at.engine is room and at.routes == ("balanced",)
        room.routed = 0
    room.routed = 1  # one sent since the last read: 16 waiting per 8 slots now
    with pytest.raises(Shed):
        place(pool, Hint("tiny", None), shed_queue=2.0)
