"""A key's caps, end to end: the keys file's `sessions=` and `tool_calls=`, the gateway's caps
header, and the engine that holds its tenant to them. On the shared real stack's engines, each
behind a gateway of its own with API keys (`conftest.extra_gateway`); each gateway fronts one
engine, because each engine counts its own sessions and calls."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from interlude.gateway.auth import create_key

pytestmark = pytest.mark.engine

ASK = [{"role": "user", "content": "Weather in Paris?"}]
SLEEP_S = 1.5  # each server-side call's own time


def _tool(name: str, **pinned: Any) -> dict[str, Any]:
    """A function tool whose arguments are pinned by enums, so a forced call is exact."""
    properties = {k: {"enum": [v]} for k, v in pinned.items()}
    parameters = {"type": "object", "properties": properties, "required": list(pinned)}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _forced(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


WEATHER = _tool("get_weather", city="Paris")


def _gateway(
    extra_gateway: Callable[..., str], engine: str, tmp_path: Path, **keys: dict[str, Any]
) -> tuple[str, dict[str, dict[str, str]]]:
    """A gateway in front of `engine` with one key per `keys` entry (create_key's options);
    (its URL, each key's request headers by name)."""
    lines, headers = [], {}
    for name, options in keys.items():
        key, line = create_key(name, **options)
        lines.append(line)
        headers[name] = {"authorization": f"Bearer {key}"}
    path = tmp_path / "api-keys"
    path.write_text("\n".join(lines) + "\n")
    options = ("--api-keys-file", str(path), "--rate-limit", "", "--default-tools", "*")
    return extra_gateway(*options, engines=(engine,)), headers


def _chat(gateway: str, headers: dict[str, str], **body: Any) -> httpx.Response:
    return httpx.post(
        gateway + "/v1/chat/completions",
        json={"model": "tiny", "messages": ASK, **body},
        headers=headers,
        timeout=120,
    )


def test_a_key_capped_at_one_session_gets_a_429_until_its_session_ends(
    stack: Any, extra_gateway: Callable[..., str], tmp_path: Path
) -> None:
    gateway, keys = _gateway(
        extra_gateway, stack.engines[0], tmp_path, one={"sessions": 1}, free={}
    )
    first = _chat(gateway, keys["one"], tools=[WEATHER], tool_choice=_forced("get_weather"))
    assert first.status_code == 200, first.text
    paused = first.json()["choices"][0]
    assert paused["finish_reason"] == "tool_calls"  # parked on the engine: a live session

    second = _chat(gateway, keys["one"], max_tokens=4)
    assert second.status_code == 429, second.text
    err = second.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "rate_limit_error" and err["code"] == "too_many_sessions"
    assert "at most 1" in err["message"] and second.headers["retry-after"] == "1"
    # The cap is the key's: another key on the same engine is served meanwhile.
    assert _chat(gateway, keys["free"], max_tokens=4).status_code == 200

    # The continuation resumes the parked session (it starts none) and runs it to its end.
    call = paused["message"]["tool_calls"][0]
    answer = {"role": "tool", "tool_call_id": call["id"], "content": "18 C"}
    results = [*ASK, paused["message"], answer]
    resumed = _chat(gateway, keys["one"], messages=results, tools=[WEATHER], max_tokens=4)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["interlude"]["route"] == "resume"
    assert _chat(gateway, keys["one"], max_tokens=4).status_code == 200


def test_a_key_capped_at_one_tool_call_gets_its_calls_run_one_after_the_other(
    stack: Any, extra_gateway: Callable[..., str], tmp_path: Path
) -> None:
    """Two requests of the key call `sleep` at about the same time: the second call waits for
    the first to finish (the documented choice: wait in line, within the call's deadline),
    and both answers are whole, with their tool results."""
    gateway, keys = _gateway(extra_gateway, stack.engines[1], tmp_path, one={"tool_calls": 1})
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Wait a little."}],
        "tools": [_tool("sleep", delay_s=SLEEP_S, tokens=1)],
        "tool_choice": _forced("sleep"),
        "max_tokens": 120,
        "stream": True,
        "stream_options": {"include_tool_events": True},
    }
    seen: list[dict[str, float | bool]] = []

    def ask() -> None:
        times: dict[str, float | bool] = {}
        url = gateway + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=keys["one"], timeout=120) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:]).get("interlude", {}).get("event")
                if event is not None:
                    times[event["type"]] = time.monotonic()
                    if event["type"] == "tool_result":
                        times["ok"] = event["ok"]
        seen.append(times)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert len(seen) == 2, "a request failed (see its assertion above)"
    first, second = sorted(seen, key=lambda t: t["tool_result"])
    assert first["ok"] is True and second["ok"] is True
    # Both calls were made while the first ran, so only the cap kept them apart.
    assert max(float(first["tool_call"]), float(second["tool_call"])) < float(first["tool_result"])
    assert float(second["tool_result"]) - float(first["tool_result"]) >= SLEEP_S - 0.2
