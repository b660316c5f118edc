"""The gateway on the real stack, driven by the official `openai` client.

Processes, as in production: the embedded Valkey server, a tools-svc worker, two engines
(real vLLM on the CPU, the tiny random-weight model) and the gateway, each its own process.
Starting the engines takes ~30 s on 2 cores, so one stack serves the whole module.

The model's weights are random, so calls are forced as a production client would force them:
`tool_choice` names the tool and the tool's schema pins the arguments with an `enum`.
"""

from __future__ import annotations

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from openai import OpenAI

from interlude.stack.cpus import available_cores, engine_binds, parse_id_list

pytestmark = pytest.mark.engine


def tool(name: str, **props: Any) -> dict[str, Any]:
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


WEATHER = tool("get_weather", city="Paris")
CALCULATOR = tool("calculator", expression="2+3")
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def client(stack: Any) -> OpenAI:
    return OpenAI(base_url=stack.gateway + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_and_plain_chat(client: OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8, seed=1
    )
    assert r.object == "chat.completion"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage is not None and r.usage.completion_tokens >= 1
    assert r.usage.prompt_tokens > 0


def test_ignore_eos_generates_exactly_max_tokens(client: OpenAI) -> None:
    # vLLM's extension: a random-weight model ends on EOS early about half the time in 400
    # tokens (vocabulary 512); with ignore_eos it never does.
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=400,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 400


def test_streaming_ends_with_usage_when_asked(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            max_completion_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)


def test_unknown_model_is_a_404_naming_model(client: OpenAI) -> None:
    import openai

    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=ASK, max_tokens=4)
    assert err.value.body["param"] == "model"  # type: ignore[index]


def test_a_server_side_tool_runs_inside_one_request(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "What is 2+3?"}],
        tools=[CALCULATOR],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "calculator"}},
        max_tokens=160,
    )
    assert r.choices[0].finish_reason != "tool_calls"  # no call left for the client
    events = (r.model_extra or {})["interlude"]["server_tool_events"]
    results = [e for e in events if e["type"] == "tool_result"]
    assert results and results[0]["content"] == "5" and results[0]["ok"]


def _call(client: OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=160,
        **kw,
    )


def _reply(client: OpenAI, first: Any, max_tokens: int = 8, **kw: Any) -> Any:
    """The client's next turn: `first`'s tool call answered (`_answer`)."""
    return client.chat.completions.create(
        model="tiny",
        messages=_answer(first),
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=max_tokens,
        **kw,
    )


def _answer(first: Any, result: str = "sunny") -> list[dict[str, Any]]:
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    return [
        *ASK,
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]


def test_the_two_engines_compute_on_the_cores_planned_for_them(stack: Any) -> None:
    """vLLM's own binding would put both engines' workers on core 0 (stack/cpus.py); each
    engine's log says where its worker's threads went: the plan's cores (disjoint wherever
    the machine has a core per engine, as CI's 2 cores do)."""
    plan = engine_binds(len(stack.engines), available_cores())
    for i, bind in enumerate(plan):
        text = (stack.logs / f"engine-{i}.log").read_text(errors="replace")
        found = re.findall(r"local_rank=0, core ids=\[([\d, ]+)\]", text)
        assert found, f"engine-{i} logged no OpenMP binding"
        assert [int(c) for c in found[-1].split(",")] == parse_id_list(bind), (i, found[-1])


# First of the tests that park sessions: its spread needs two engines that look alike, and
# sessions parked by later tests would make one look busier for the rest of the module.
def test_two_engines_keep_session_affinity(client: OpenAI, stack: Any) -> None:
    firsts = [_call(client) for _ in range(6)]
    holders = set()
    for first in firsts:
        sid = (first.model_extra or {})["interlude"]["session_id"]
        holder = [
            e for e in stack.engines if httpx.get(f"{e}/v1/sessions/{sid}").status_code == 200
        ]
        assert len(holder) == 1
        holders.add(holder[0])
        second = _reply(client, first)
        assert (second.model_extra or {})["interlude"]["route"] == "resume"
    assert holders == set(stack.engines)  # new sessions spread over both engines


def test_the_conversations_kind_reaches_the_engines_session(client: OpenAI, stack: Any) -> None:
    def kind(first: Any) -> list[str]:
        sid = (first.model_extra or {})["interlude"]["session_id"]
        got = [httpx.get(f"{e}/v1/sessions/{sid}") for e in stack.engines]
        return [r.json()["kind"] for r in got if r.status_code == 200]

    told = _call(client, extra_body={"interlude_kind": "weather"})
    plain = _call(client)
    # The policy learns tool times and segment lengths per kind (policy/predict.py).
    assert kind(told) == ["weather"] and kind(plain) == ["unknown"]
    for first in (told, plain):  # end both, so no parked session outlives the test
        assert (_reply(client, first).model_extra or {})["interlude"]["route"] == "resume"


def test_client_tool_round_trip_resumes_without_recompute(client: OpenAI, stack: Any) -> None:
    first = _call(client)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert '"Paris"' in call.function.arguments
    recomputed = stack.totals("recompute_tokens")
    reused = stack.totals("resumed_context_tokens")
    second = _reply(client, first, max_tokens=16)
    assert (second.model_extra or {})["interlude"]["route"] == "resume"
    assert second.choices[0].finish_reason in ("stop", "length")
    assert stack.totals("recompute_tokens") == recomputed
    # The whole context the session held came back without a prefill.
    assert stack.totals("resumed_context_tokens") - reused >= first.usage.prompt_tokens


def _timing(header: str) -> dict[str, str]:
    parts = (p.strip().split(";", 1) for p in header.split(","))
    return {name: value.split("=", 1)[1].strip('"') for name, value in parts}


def test_streamed_turns_say_where_their_start_waited(client: OpenAI) -> None:
    # `server-timing` on a stream covers the time before its headers went out: the gateway's
    # own share, its wait on the engine, the engine's own time, its part opening the leg,
    # and how the session's KV came back (the route).
    first = _call(client)
    timings = {}
    for name, messages in (("new", ASK), ("resume", _answer(first))):
        with client.chat.completions.with_streaming_response.create(
            model="tiny",
            messages=messages,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            max_tokens=4,
            stream=True,
        ) as raw:
            timings[name] = _timing(raw.headers["server-timing"])
            route = [json.loads(line[6:]) for line in raw.iter_lines() if line[6:7] == "{"]
        assert route[0]["interlude"]["route"] == name
    for name, t in timings.items():
        assert set(t) == {"gateway", "upstream", "engine", "open", "route"}
        assert float(t["gateway"]) >= 0 and float(t["upstream"]) >= float(t["engine"]) > 0
        assert t["route"] == name


def test_resume_by_explicit_session_id(client: OpenAI, stack: Any) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=160,
        extra_headers={"x-session-id": "conv-42"},
    )
    assert raw.headers["x-session-id"] == "conv-42"
    first = raw.parse()
    assert first.choices[0].finish_reason == "tool_calls"
    second = _reply(client, first, extra_headers={"x-session-id": "conv-42"})
    assert (second.model_extra or {})["interlude"]["route"] == "resume"


def test_fallback_to_recompute_when_the_session_is_gone(client: OpenAI, stack: Any) -> None:
    first = _call(client)
    sid = (first.model_extra or {})["interlude"]["session_id"]
    for e in stack.engines:  # the engine forgets it (as after an eviction or a restart)
        httpx.delete(f"{e}/v1/sessions/{sid}")
    second = _reply(client, first)
    assert (second.model_extra or {})["interlude"]["route"] == "fallback"
    assert second.choices[0].finish_reason in ("stop", "length")
    # An edited history is not resumed either: the paused session is freed and recomputed.
    third = _call(client)
    edited = _answer(third)
    edited[0] = {"role": "user", "content": "What is the weather in Rome?"}
    again = client.chat.completions.create(
        model="tiny",
        messages=edited,
        tools=[WEATHER],
        max_tokens=8,  # type: ignore[arg-type,list-item]
    )
    assert (again.model_extra or {})["interlude"]["route"] == "fallback"


def test_a_continuations_tool_choice(client: OpenAI, stack: Any) -> None:
    # `none` or `auto` goes to the parked session with the results: it is resumed.
    plain = _reply(client, _call(client), tool_choice="none")
    assert (plain.model_extra or {})["interlude"]["route"] == "resume"
    # A forced call resumes the parked session too: its next turn is that call (the scheduler
    # gives each turn its own grammar; vLLM alone would keep the first turn's).
    history = _answer(_call(client))
    forced = client.chat.completions.create(
        model="tiny",
        messages=history,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=160,
    )
    assert (forced.model_extra or {})["interlude"]["route"] == "resume"
    assert forced.choices[0].finish_reason == "tool_calls"
    assert forced.choices[0].message.tool_calls[0].function.name == "get_weather"
    # Its call answered, the session resumes again (so no parked session outlives the test).
    call = forced.choices[0].message
    end = client.chat.completions.create(
        model="tiny",
        messages=[  # type: ignore[arg-type]
            *history,
            call.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "rain"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=8,
    )
    assert (end.model_extra or {})["interlude"]["route"] == "resume"


def test_a_client_disconnect_frees_the_kv(client: OpenAI, stack: Any) -> None:
    # The session waits inside the request on a 30 s server-side tool, so it is certainly live
    # when the client leaves. (It used to generate 4,000 tokens instead: on a loaded machine
    # the whole answer could be generated, and fit in the socket buffers, before the client
    # read its first chunk, and no engine listed the session any more: CI's rare failure.)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Wait for the slow tool."}],
        tools=[tool("sleep", delay_s=30)],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "sleep"}},
        max_tokens=400,
        stream=True,
    )
    first = next(iter(stream))
    sid = (first.model_extra or {})["interlude"]["session_id"]

    def answers() -> dict[str, str]:
        out = {}
        for e in stack.engines:
            r = httpx.get(f"{e}/v1/sessions/{sid}")
            out[e] = f"{r.status_code} {r.text[:200]}"
        return out

    def holders() -> list[str]:
        return [e for e, a in answers().items() if a.startswith("200")]

    def disconnects() -> float:
        # Counted over the whole stack's life: other tests' clients may have left too.
        for line in httpx.get(stack.gateway + "/metrics").text.splitlines():
            if line.startswith("interlude:gateway_client_disconnects_total "):
                return float(line.split()[1])
        return 0.0

    before = disconnects()
    # Live on one engine, waiting for its tool. The first chunk can reach the client before
    # that engine lists the session, so wait for it, not look once.
    end = time.monotonic() + 20
    while len(holders()) != 1:
        assert time.monotonic() < end, f"no engine lists the waiting session: {answers()}"
        time.sleep(0.1)
    stream.close()
    end = time.monotonic() + 10
    while holders():
        assert time.monotonic() < end, "the engine kept the session after the client left"
        time.sleep(0.2)
    # Its own deadline: the count lands when the gateway's stream to the client ends.
    end = time.monotonic() + 10
    while disconnects() < before + 1:
        assert time.monotonic() < end, "the gateway did not count the disconnect"
        time.sleep(0.2)


def test_idle_connections_outlive_the_clients_keepalive(stack: Any) -> None:
    """The gateway and the engines keep an idle connection longer than clients keep theirs
    (httpx and the OpenAI SDK: 5 s), so a client never sends on one the server is closing."""

    def health(conn: socket.socket) -> bytes:
        """The status line of one whole response on `conn` (b"" once the server closed it)."""
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            if not (chunk := conn.recv(65536)):
                return b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        )  # fmt: skip
        while len(body) < length:
            body += conn.recv(65536)
        return head.split(b"\r\n")[0]

    conns = []
    for url in (stack.gateway, stack.engines[0]):
        host, port = url.removeprefix("http://").split(":")
        conns.append(socket.create_connection((host, int(port)), timeout=10))
    try:
        assert [health(c) for c in conns] == [b"HTTP/1.1 200 OK"] * 2
        time.sleep(6)  # idle past uvicorn's default keep-alive (5 s)
        assert [health(c) for c in conns] == [b"HTTP/1.1 200 OK"] * 2
    finally:
        for c in conns:
            c.close()


def test_streamed_server_tool_events_when_asked(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "What is 2+3?"}],
            tools=[CALCULATOR],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "calculator"}},
            max_tokens=160,
            stream=True,
            stream_options={"include_tool_events": True},  # type: ignore[typeddict-unknown-key]
        )
    )
    events = [(c.model_extra or {})["interlude"]["event"] for c in chunks if not c.choices]
    assert [e["type"] for e in events] == ["tool_call", "tool_result"]
    assert events[1]["content"] == "5"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_the_gateway_reaches_each_engine_over_one_link(client: OpenAI, stack: Any) -> None:
    """Chat completions go over each engine's multiplexed link (the gateway's default
    upstream), and concurrent answers' tokens share the link's messages."""

    def mux(engine: str) -> dict[str, float]:
        out = {}
        for line in httpx.get(engine + "/metrics").text.splitlines():
            if line.startswith("interlude:mux_") and not line.startswith("#"):
                name, value = line.split()[:2]
                out[name.removeprefix("interlude:mux_").removesuffix("_total")] = float(value)
        return out

    def stream(i: int) -> int:
        chunks = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"Count to {i}."}],
            max_tokens=48,
            extra_body={"ignore_eos": True},
            stream=True,
        )
        return sum(1 for _ in chunks)

    before = {e: mux(e) for e in stack.engines}
    with ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(stream, range(8)))
    # Streamed, in several chunks. Not one per token: on a loaded machine vLLM's front end
    # merges the deltas a slow reader has not taken yet (a CI run beside two simulations got
    # 10 or fewer chunks for 48 tokens).
    assert all(n > 3 for n in counts), counts
    after = {e: mux(e) for e in stack.engines}
    served = [e for e in stack.engines if after[e]["exchanges"] > before[e].get("exchanges", 0)]
    assert served, f"no engine served a request over its link: {after}"
    assert sum(after[e]["exchanges"] - before[e].get("exchanges", 0) for e in served) >= 8
    assert all(after[e]["links"] == 1 for e in served)
    frames = sum(after[e]["frames"] - before[e].get("frames", 0) for e in served)
    messages = sum(after[e]["messages"] - before[e].get("messages", 0) for e in served)
    assert frames > 1.5 * messages, (frames, messages)  # written together, not one by one
