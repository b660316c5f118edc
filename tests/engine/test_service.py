"""The engine service over real HTTP: real vLLM (CPU), a real redis-server and tools-svc worker.

One engine process serves every test of this module (starting one takes ~20 s on 2 cores).
The tiny model's weights are random, so tool calls are forced the way a production client
forces them: `tool_choice` names the tool and the tool's JSON schema pins the arguments
(an `enum`), and vLLM's structured outputs make the model write exactly that call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis import Redis

from interlude.api.tools import CACHE_S, KEY, TTL_S
from interlude.engine.config import EngineConfig
from interlude.engine.server import ServiceConfig, make_app

pytestmark = pytest.mark.engine

ENGINE_ID = "engine-test"
CLIENT_DEADLINE_S = 8.0
TOOL_DEADLINE_S = 3.0
PUBLISHED_CACHE_S = CACHE_S + 0.2  # the engine's view of the published tools is this fresh


def tool(name: str, **props: Any) -> dict[str, Any]:
    """An OpenAI function tool whose arguments are pinned by `enum`s: a forced call is exact."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {
                "type": "object",
                "properties": {k: {"enum": [v]} for k, v in props.items()},
                "required": list(props),
                "additionalProperties": False,
            },
        },
    }


USER = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def spans() -> Any:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from interlude import telemetry

    exporter = InMemorySpanExporter()
    telemetry.setup_tracing("interlude-test", exporter=exporter)
    return exporter


@pytest.fixture(scope="module")
def worker(redis_server: str) -> Iterator[subprocess.Popen[bytes]]:
    """A tools-svc worker process on the bus (calculator, echo, sleep, fail)."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "interlude_tools", "--redis-url", redis_server),
            *("--consumer", "w1", "--metrics-port", "0", "--test-tools"),
        ]
    )
    # Server-side tools are the published ones: wait until the worker has published its own.
    deadline = time.monotonic() + 30
    with Redis.from_url(redis_server) as r:
        while not r.hexists("interlude:tools", "calculator"):
            assert time.monotonic() < deadline and proc.poll() is None, "tools never published"
            time.sleep(0.1)
    yield proc
    proc.terminate()
    proc.wait(timeout=15)


@pytest.fixture(scope="module")
def service(
    tiny_model: str, redis_server: str, worker: Any, spans: Any, free_port: Any
) -> Iterator[str]:
    """Base URL of an engine service (uvicorn in a thread of this process)."""
    import uvicorn

    config = ServiceConfig(
        engine=EngineConfig(model=tiny_model, num_gpu_blocks=40, host_blocks=64),
        redis_url=redis_server,
        engine_id=ENGINE_ID,
        tool_deadline_s=TOOL_DEADLINE_S,
        client_deadline_s=CLIENT_DEADLINE_S,
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(config), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{url}/ready").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the engine service did not become ready in 180 s")
        time.sleep(0.5)
    yield url
    server.should_exit = True
    thread.join(timeout=60)


def leg(
    url: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """POST and read one SSE leg; checks the framing and returns the events."""
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    frames = raw.split("\n\n")
    assert frames[-1] == "", "every frame ends with a blank line"
    assert frames[-2] == "data: [DONE]"
    assert all(f.startswith("data: ") for f in frames[:-1])
    return [json.loads(f[len("data: ") :]) for f in frames[:-2]]


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return dict(body["error"])


def engine_stats(url: str) -> dict[str, float]:
    """interlude:* and vllm:* samples from /metrics (name{labels} -> value)."""
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_probes_and_metrics(service: str) -> None:
    assert httpx.get(f"{service}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{service}/ready").json()
    assert ready["engine_id"] == ENGINE_ID and ready["tool_bus"] == "connected"
    # What the worker published is what this engine runs server-side.
    assert {"calculator", "echo", "sleep", "fail"} <= set(ready["server_tools"])
    text = httpx.get(f"{service}/metrics").text
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting",
        "interlude:kv_waste_ratio",
        "interlude:kv_waste_gb_seconds_total",
        "interlude:kv_waste_contended_gb_seconds_total",
        "interlude:resumed_context_tokens_total",
    ):
        assert name in text


def test_answer_without_tools(service: str) -> None:
    events = leg(service, "/v1/sessions", {"messages": USER, "max_tokens": 12})
    done = events[-1]
    assert done["type"] == "done" and done["tool_calls"] == 0 and done["turns"] == 1
    assert 1 <= done["completion_tokens"] <= 12
    texts = [e for e in events if e["type"] == "text"]
    assert all(e["text"] for e in texts)
    assert sum(e["tokens"] for e in texts) <= done["completion_tokens"]


def test_bad_requests_get_the_error_envelope(service: str) -> None:
    post = lambda body: httpx.post(f"{service}/v1/sessions", json=body)  # noqa: E731
    assert error_of(post({"messages": []}), 400)["type"] == "invalid_request_error"
    assert (
        "role" in error_of(post({"messages": [{"role": "robot", "content": "x"}]}), 400)["message"]
    )
    assert (
        "tool_choice" in error_of(post({"messages": USER, "tool_choice": "nope"}), 400)["message"]
    )
    assert error_of(post({"messages": USER, "max_tokens": 0}), 400)["param"] == "max_tokens"
    huge = [{"role": "user", "content": "word " * 5000}]
    assert "tokens" in error_of(post({"messages": huge}), 400)["message"]
    bad_json = httpx.post(
        f"{service}/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}
    )
    error_of(bad_json, 400)
    # A schema the forced call's grammar cannot be built from: refused before anything streams.
    weird = tool("f") | {"function": {"name": "f", "parameters": {"type": "nonsense"}}}
    refused = error_of(post({"messages": USER, "tools": [weird], "tool_choice": "f"}), 400)
    assert refused["param"] == "tools[0].function.parameters"
    assert "nonsense" in refused["message"]
    assert error_of(post({"session_id": "a/b", "messages": USER}), 400)["param"] == "session_id"
    ok = {"results": [{"tool_call_id": "c", "content": "x"}]}
    error_of(httpx.post(f"{service}/v1/sessions/nobody/resume", json=ok), 404)
    error_of(httpx.delete(f"{service}/v1/sessions/nobody"), 404)


def test_scripted_calls_are_refused_without_benchmark_mode(service: str) -> None:
    """This engine was started without benchmark mode: a script, which would make it call any
    published tool with the client's arguments, is a 400 on every route that takes one, so
    the engine port is no way around a gateway that refuses it."""
    script = [{"tool": "sleep", "after_tokens": 2, "arguments": {"delay_s": 9}}]
    chat = {
        "model": httpx.get(f"{service}/v1/load").json()["model"],
        "messages": USER,
        "tools": [tool("sleep")],
        "max_tokens": 8,
        "interlude_script": script,
    }
    for path, body, param in (
        ("/v1/chat/completions", chat, "interlude_script"),
        ("/v1/sessions", {"messages": USER, "tools": [tool("sleep")], "script": script}, "script"),
        (
            "/v1/sessions/anyone/resume",
            {"results": [{"tool_call_id": "c", "content": "x"}], "script": script},
            "script",
        ),
    ):
        err = error_of(httpx.post(service + path, json=body), 400)
        assert err["type"] == "invalid_request_error" and err["param"] == param, path
        assert "benchmark mode is off" in err["message"], err
    # Without a script the same request is served.
    plain = {k: v for k, v in chat.items() if k not in ("interlude_script", "tools")}
    assert httpx.post(f"{service}/v1/chat/completions", json=plain, timeout=60).status_code == 200


def test_client_tool_pauses_and_resumes(service: str) -> None:
    tools = [tool("lookup", query="weather in Oslo")]
    body = {"session_id": "client-1", "messages": USER, "tools": tools, "tool_choice": "lookup"}
    first = leg(service, "/v1/sessions", {**body, "max_tokens": 60})
    calls = [e for e in first if e["type"] == "tool_call"]
    assert [(c["name"], c["side"]) for c in calls] == [("lookup", "client")]
    assert json.loads(calls[0]["arguments"]) == {"query": "weather in Oslo"}
    assert first[-1]["type"] == "paused" and first[-1]["call_ids"] == [calls[0]["call_id"]]
    assert "<tool_call>" not in "".join(e["text"] for e in first if e["type"] == "text")
    state = httpx.get(f"{service}/v1/sessions/client-1").json()
    assert state["state"] == "awaiting_client"

    # The same session id cannot start twice, and results must answer exactly the open call.
    error_of(httpx.post(f"{service}/v1/sessions", json=body), 409)
    wrong = {"results": [{"tool_call_id": "other", "content": "x"}]}
    error_of(httpx.post(f"{service}/v1/sessions/client-1/resume", json=wrong), 400)

    answer = {"results": [{"tool_call_id": calls[0]["call_id"], "content": "sunny, 21 C"}]}
    second = leg(service, "/v1/sessions/client-1/resume", answer)
    assert second[0] == {
        "type": "tool_result", "call_id": calls[0]["call_id"], "ok": True,
        "content": "sunny, 21 C", "error": "",
    }  # fmt: skip
    done = second[-1]
    assert done["type"] == "done" and done["tool_calls"] == 1 and done["turns"] == 2
    assert done["tool_tokens"] > 0
    error_of(httpx.get(f"{service}/v1/sessions/client-1"), 404)  # ended sessions are gone


def test_server_tool_runs_on_the_bus_with_one_trace(service: str, spans: Any) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    body = {
        "messages": USER,
        "tools": [tool("calculator", expression="2+3")],
        "tool_choice": {"type": "function", "function": {"name": "calculator"}},
        "max_tokens": 60,
    }
    events = leg(service, "/v1/sessions", body, headers)
    kinds = [e["type"] for e in events if e["type"] != "text"]
    # The turn after the tool's result is a resumed one: the scheduler says how it started.
    assert kinds == ["tool_call", "tool_result", "turn_start", "done"]
    result = next(e for e in events if e["type"] == "tool_result")
    assert (result["ok"], result["content"]) == (True, "5")
    start = next(e for e in events if e["type"] == "turn_start")
    assert start["kv"] in ("preserve", "swap", "prefix-cache", "recompute")
    ours = [s for s in spans.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]
    assert {"session", "turn", "pause", "tool result"} <= {s.name for s in ours}
    resumed = [s for s in ours if s.name == "turn" and "interlude.kv_return" in s.attributes]
    assert [s.attributes["interlude.kv_return"] for s in resumed] == [start["kv"]]
    assert resumed[0].attributes["interlude.queue_wait_ms"] == start["queue_s"] * 1000
    # The result's span links to the span its result names (the worker's, in the same trace).
    (done,) = [s for s in ours if s.name == "tool result"]
    assert done.attributes["interlude.ok"] is True
    assert [f"{link.context.trace_id:032x}" for link in done.links] == [trace_id]


def test_server_tool_timeout_is_a_result_the_model_sees(service: str) -> None:
    body = {
        "messages": USER,
        "tools": [tool("sleep", delay_s=30)],
        "tool_choice": "sleep",
        "max_tokens": 60,
    }
    started = time.monotonic()
    events = leg(service, "/v1/sessions", body)
    result = next(e for e in events if e["type"] == "tool_result")
    assert not result["ok"] and result["error"].startswith("timeout")
    assert events[-1]["type"] == "done" and events[-1]["tool_calls"] == 1
    assert time.monotonic() - started < 30


def test_unanswered_client_call_ends_by_deadline_and_frees_kv(service: str) -> None:
    body = {"session_id": "late", "messages": USER, "tools": [tool("ask", q="x")]}
    first = leg(service, "/v1/sessions", {**body, "tool_choice": "ask", "max_tokens": 60})
    assert first[-1]["type"] == "paused"
    time.sleep(CLIENT_DEADLINE_S + 2)
    error_of(httpx.get(f"{service}/v1/sessions/late"), 404)
    stats = engine_stats(service)
    assert sum(v for k, v in stats.items() if k.startswith("interlude:paused_requests{")) == 0


def test_cancel_a_paused_session(service: str) -> None:
    body = {"session_id": "gone", "messages": USER, "tools": [tool("ask", q="y")]}
    assert leg(service, "/v1/sessions", {**body, "tool_choice": "ask"})[-1]["type"] == "paused"
    r = httpx.delete(f"{service}/v1/sessions/gone")
    assert r.json() == {"id": "gone", "cancelled": True}
    error_of(httpx.get(f"{service}/v1/sessions/gone"), 404)


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]},
            "tool_calls[0].function",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]},
            "tool_calls[0].function.name",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1"}}],
            },
            "tool_calls[0].function.arguments",
        ),
        ({"role": "tool", "content": "5"}, "tool_call_id"),
    ],
)
def test_malformed_messages_are_a_400_naming_the_field(
    service: str, message: dict[str, Any], param: str
) -> None:
    r = httpx.post(f"{service}/v1/sessions", json={"messages": [*USER, message]})
    assert error_of(r, 400)["param"] == f"messages[1].{param}"


def test_the_caller_cannot_choose_server_tools(service: str) -> None:
    body = {"messages": USER, "tools": [tool("ask", q="x")], "server_tools": ["ask"]}
    assert error_of(httpx.post(f"{service}/v1/sessions", json=body), 400)["param"] == "server_tools"


def test_only_published_tools_run_server_side(service: str, redis_server: str) -> None:
    """The same declared tools in two sessions: the published one runs on the bus, the other
    (no worker publishes it) pauses for the client; an entry past its TTL is not published."""
    tools = [tool("calculator", expression="2+3"), tool("lookup", query="x"), tool("stale", q="y")]
    old = {"description": "", "parameters": {}, "worker": "gone", "updated_at": time.time() - 3600}
    with Redis.from_url(redis_server) as r:
        r.hset(KEY, "stale", json.dumps(old))
    time.sleep(PUBLISHED_CACHE_S)  # the engine's cached view of the registry
    assert "stale" not in httpx.get(f"{service}/ready").json()["server_tools"]
    sides = {}
    for name in ("calculator", "lookup", "stale"):
        body = {"session_id": f"mixed-{name}", "messages": USER, "tools": tools}
        events = leg(service, "/v1/sessions", {**body, "tool_choice": name, "max_tokens": 60})
        call = next(e for e in events if e["type"] == "tool_call")
        sides[call["name"]] = (call["side"], events[-1]["type"])
        if events[-1]["type"] == "paused":
            httpx.delete(f"{service}/v1/sessions/mixed-{name}")
    assert sides == {
        "calculator": ("server", "done"),
        "lookup": ("client", "paused"),
        "stale": ("client", "paused"),
    }


def test_the_engine_follows_the_registry(service: str, redis_server: str) -> None:
    """A tool published now is seen within the cache age; once its entry is older than the
    TTL (its workers gone), it is no longer server-side."""

    def entry(age_s: float) -> str:
        return json.dumps(
            {
                "description": "d",
                "parameters": {},
                "worker": "w9",
                "updated_at": time.time() - age_s,
            }
        )

    def server_tools() -> set[str]:
        return set(httpx.get(f"{service}/ready").json()["server_tools"])

    with Redis.from_url(redis_server) as r:
        r.hset(KEY, "newcomer", entry(0))
        time.sleep(PUBLISHED_CACHE_S)
        assert "newcomer" in server_tools()
        r.hset(KEY, "newcomer", entry(TTL_S + 1))
        time.sleep(PUBLISHED_CACHE_S)
        assert "newcomer" not in server_tools()
        r.hdel(KEY, "newcomer")


def test_load_reports_routing_numbers(service: str, tiny_model: str) -> None:
    model = os.path.basename(tiny_model)
    ask = {"model": model, "messages": USER, "max_tokens": 8, "ignore_eos": True}
    httpx.get(f"{service}/v1/load")  # a first sample of its busy time
    assert httpx.post(f"{service}/v1/chat/completions", json=ask, timeout=60).status_code == 200
    load = httpx.get(f"{service}/v1/load").json()
    assert load["itl_ms"] > 0  # its speed, from the tokens it just generated
    assert 0.0 < load["busy_share"] <= 1.0  # it computed between the two reads
    assert load["engine_id"] == ENGINE_ID and load["ready"] is True
    assert load["model"] == os.path.basename(tiny_model)  # no --served-model-name: the dir's
    assert load["max_model_len"] > 0 and 0.0 <= load["kv_usage"] <= 1.0
    for key in ("waiting", "running", "resumed_context_tokens", "recompute_tokens"):
        assert isinstance(load[key], int) and load[key] >= 0
    assert load["contended_waste"] >= 0.0 and load["waste_contended_gb_s"] <= load["waste_gb_s"]


def test_resume_with_a_new_token_limit_and_counters(service: str) -> None:
    body = {"session_id": "budget", "messages": USER, "tools": [tool("ask", q="z")]}
    first = leg(service, "/v1/sessions", {**body, "tool_choice": "ask", "max_tokens": 60})
    paused = first[-1]
    assert paused["type"] == "paused" and paused["completion_tokens"] > 0
    assert paused["prompt_tokens"] > 0
    load = httpx.get(f"{service}/v1/load").json()
    assert load["sessions"].get("awaiting_client", 0) >= 1
    assert load["waiting"] == 0  # a paused session waits for its client, not for the GPU
    before = load["resumed_context_tokens"]
    waits = 'interlude:resume_waits_total{via="preserve"}'
    waits_before = engine_stats(service).get(waits, 0.0)
    results = {"results": [{"tool_call_id": paused["call_ids"][0], "content": "ok"}]}
    # A resume may say whether calls are parsed from here on, but cannot force one (vLLM
    # builds a request's grammar once): the engine refuses it in the error envelope.
    forced = httpx.post(
        f"{service}/v1/sessions/budget/resume", json={**results, "tool_choice": "required"}
    )
    assert forced.status_code == 400 and "tool_choice" in forced.json()["error"]["message"]
    second = leg(
        service, "/v1/sessions/budget/resume", {**results, "max_tokens": 3, "tool_choice": "none"}
    )
    done = second[-1]
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["completion_tokens"] == paused["completion_tokens"] + 3
    # The context the session held came back without a prefill, and it is counted.
    deadline = time.monotonic() + 5
    while httpx.get(f"{service}/v1/load").json()["resumed_context_tokens"] <= before:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # Its wait from the answer to its first step is counted, under how its KV came back; and
    # the steps' time, vLLM's part and ours apart.
    while (stats := engine_stats(service)).get(waits, 0.0) < waits_before + 1:
        assert time.monotonic() < deadline, {k: v for k, v in stats.items() if "resume" in k}
        time.sleep(0.1)
    assert stats[waits] == waits_before + 1
    assert 0 < stats['interlude:resume_wait_seconds_total{via="preserve"}'] < 5
    # One by one too, for percentiles: every counted wait is in the histogram.
    assert stats['interlude:resume_start_seconds_count{via="preserve"}'] == stats[waits]
    assert stats["interlude:scheduler_steps_total"] > 0
    assert stats['interlude:scheduler_seconds_total{part="vllm"}'] > 0
    assert stats['interlude:scheduler_seconds_total{part="interlude"}'] > 0
