"""`make demo`'s workload: a short agentic run through the gateway with the official client.

Two things an agent does, on whatever stack `interlude up` started:

1. **Server-side tools inside one request.** The calculator is registered by the tools-svc
   worker, so a call to it pauses the engine's session, the worker answers over the bus, and
   the session resumes; the client sees one answer.
2. **A client-side tool round trip.** A tool the deployment does not run ends the response with
   `finish_reason="tool_calls"`; the session stays parked on its engine under the policy; the
   client runs the tool and sends the conversation back, and the gateway resumes that session.

The model has random weights, so calls are forced the way a client forces them (`tool_choice`
names the tool, the schema pins the arguments): the text is noise, the mechanics are real.
Then it prints what the engines did: sessions paused by KV strategy, context tokens reused
instead of recomputed, and the trace of one request across gateway, engine and tool pod.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console


def _tool(name: str, description: str, **pinned: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "enum": [v]} for k, v in pinned.items()},
                "required": list(pinned),
            },
        },
    }


def _totals(engines: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in engines:
        load = httpx.get(e + "/v1/load", timeout=5).json()
        for key in ("resumed_context_tokens", "recompute_tokens"):
            out[key] = out.get(key, 0.0) + float(load.get(key, 0))
        for strategy, n in (load.get("resumes") or {}).items():
            out[f"paused:{strategy}"] = out.get(f"paused:{strategy}", 0.0) + float(n)
    return out


def run_demo(
    gateway: str, api_key: str, engines: Sequence[str], trace_dir: Path | None, console: Console
) -> None:
    """Run the workload against `gateway` and print what happened."""
    from openai import OpenAI

    # Any: the client's overloads want TypedDicts where we pass plain dicts, as users do.
    client: Any = OpenAI(base_url=gateway + "/v1", api_key=api_key or "none", max_retries=0)
    model = client.models.list().data[0].id
    before = _totals(engines)
    _server_side_calls(client, model, console)
    _client_round_trip(client, model, console)
    _engine_report(before, _totals(engines), console)
    if trace_dir is not None:
        console.print(f"traces (OpenTelemetry spans, JSON lines): {trace_dir}/*.jsonl")
        _print_trace(trace_dir, console)


def _server_side_calls(client: Any, model: str, console: Console) -> None:
    """Three requests whose calculator calls run on a tool pod inside the request."""
    calculator = _tool("calculator", "Evaluate an arithmetic expression", expression="17*23")
    console.rule("1. server-side calculator calls inside one request")
    for i in range(3):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is 17*23?"}],
            tools=[calculator],
            tool_choice={"type": "function", "function": {"name": "calculator"}},
            max_tokens=160,
            seed=i,
        )
        ext = (r.model_extra or {}).get("interlude", {})
        results = [e for e in ext.get("server_tool_events", []) if e["type"] == "tool_result"]
        answer = results[0]["content"] if results else "(no tool result)"
        generated = r.usage.completion_tokens if r.usage else 0
        console.print(
            f"request {i + 1}: calculator answered [bold]{answer}[/] inside the request; "
            f"finish_reason={r.choices[0].finish_reason}, {generated} tokens generated"
        )


def _client_round_trip(client: Any, model: str, console: Console) -> None:
    """A client-side call: the session parks on its engine and the follow-up resumes it."""
    console.rule("2. a client-side tool round trip that resumes the paused session")
    weather = _tool("get_weather", "Current weather for a city", city="Paris")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[weather],
        tool_choice="required",
        max_tokens=160,
    )
    call = (first.choices[0].message.tool_calls or [None])[0]
    assert call is not None and call.type == "function", "the model did not call the tool"
    console.print(
        f"response 1: finish_reason=[bold]{first.choices[0].finish_reason}[/], the model asks "
        f"{call.function.name}({call.function.arguments}); the session stays parked on its engine"
    )
    time.sleep(1.0)  # the client "runs" its tool; the engine's policy decides about the KV
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
    ]
    second = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[weather],
        max_tokens=24,
    )
    route = (second.model_extra or {}).get("interlude", {}).get("route")
    console.print(
        f"response 2: route=[bold]{route}[/] (resume = the same engine session went on), "
        f"finish_reason={second.choices[0].finish_reason}"
    )


def _engine_report(before: dict[str, float], after: dict[str, float], console: Console) -> None:
    """What the engines' counters moved by: context resumed, recomputed, pauses by handling."""
    console.rule("what the engines did")
    reused = after.get("resumed_context_tokens", 0) - before.get("resumed_context_tokens", 0)
    recomputed = after.get("recompute_tokens", 0) - before.get("recompute_tokens", 0)
    console.print(f"context tokens resumed from parked KV: [bold]{reused:.0f}[/]")
    console.print(f"tokens recomputed: [bold]{recomputed:.0f}[/]")
    console.print(f"tokens not recomputed: [bold]{max(0.0, reused - recomputed):.0f}[/]")
    paused = {
        k.split(":", 1)[1]: v - before.get(k, 0)
        for k, v in after.items()
        if k.startswith("paused:")
    }
    shown = json.dumps(paused) if paused else "none"
    console.print(f"pauses that resumed, by what the policy did with the KV: {shown}")


def _print_trace(trace_dir: Path, console: Console) -> None:
    """The spans of the latest trace that reached the tool pod, by service."""
    time.sleep(1.5)  # the processes export spans in batches every 0.5 s
    spans: list[dict[str, Any]] = []
    for f in trace_dir.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            if line.strip():
                span = json.loads(line)
                span["_service"] = f.stem
                spans.append(span)
    tools = [s for s in spans if s["_service"] == "interlude-tools"]
    if not tools:
        console.print("(no tool span exported yet)")
        return
    trace_id = tools[-1]["context"]["trace_id"]
    chain = sorted(
        (
            s
            for s in spans
            if s["context"]["trace_id"] == trace_id
            and not s["name"].endswith(("http receive", "http send"))  # ASGI internals
        ),
        key=lambda s: s["start_time"],
    )
    console.print(f"one trace, {trace_id}:")
    for s in chain:
        console.print(f"  {s['_service']:<18} {s['name']}")
