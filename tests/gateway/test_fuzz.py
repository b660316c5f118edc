"""Schemathesis against the gateway's own OpenAPI document, and the engine's, on the real stack.

Every operation gets positive (schema-valid) and negative (schema-violating) cases; none may
answer 5xx or hang (each call has a timeout). The fuzzing gateway has auth on and every case
carries a real key (with caps on its sessions and tool calls), as a deployment's clients do; it
routes to an engine of its own that caps `max_tokens` at 4 (the engines check requests now), so
a valid case is a real but short generation. The engine is fuzzed directly too, as anything
inside the cluster could call it. The number of cases is printed.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from interlude.gateway.auth import create_key
from interlude.stack.procs import stop_group

from .conftest import CLI, wait_ready
from .test_stack import tool

pytestmark = pytest.mark.engine

EXAMPLES = 60  # per operation and mode


@pytest.fixture(scope="module")
def fuzz_stack(
    stack: Any, tiny_model: str, free_port: Callable[[], int], tmp_path_factory: Any
) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(the gateway's URL, its engine's URL, a real key's headers)."""
    key, line = create_key("fuzzer", sessions=4, tool_calls=2)
    keys = tmp_path_factory.mktemp("fuzz") / "api-keys"
    keys.write_text(line + "\n")
    engine_port, port = free_port(), free_port()
    engine = [*CLI, "engine", "--model", tiny_model, "--served-model-name", "tiny"]
    engine += ["--host", "127.0.0.1", "--port", str(engine_port), "--engine-id", "fuzz-engine"]
    engine += ["--max-tokens", "4", "--redis-url", stack.redis_url]
    argv = [*CLI, "gateway", "--api-keys-file", str(keys), "--introspection", "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    argv += ["--rate-limit", "", "--request-timeout", "20", "--redis-url", stack.redis_url]
    argv += ["--engine", f"http://127.0.0.1:{engine_port}"]
    procs = []
    for name, cmd in (("fuzz-engine", engine), ("fuzz-gateway", argv)):
        log = (stack.logs / f"{name}.log").open("wb")
        procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"http://127.0.0.1:{engine_port}/ready", procs, stack.logs, 240)
        end = time.monotonic() + 30
        while httpx.get(url + "/ready").status_code != 200:  # the gateway polls every 2 s
            assert time.monotonic() < end, "the fuzzing gateway never saw its engine"
            time.sleep(0.5)
        yield url, f"http://127.0.0.1:{engine_port}", {"authorization": f"Bearer {key}"}
    finally:
        for p in procs:
            stop_group(p.pid)


@pytest.mark.parametrize("target", ["gateway", "engine"])
def test_no_5xx_and_no_hang(
    fuzz_stack: tuple[str, str, dict[str, str]], target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway, engine, headers = fuzz_stack
    base = gateway if target == "gateway" else engine
    headers = headers if target == "gateway" else {}
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def run(case: Any) -> None:
                response = case.call(base_url=base, headers=headers, timeout=30)
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.path} {case.body!r:.300} -> "
                        f"{response.status_code} {response.text[:300]}"
                    )

            try:
                run()
            except Unsatisfiable:
                # No schema-violating input exists for an operation without inputs (GET /health).
                assert mode is GenerationMode.NEGATIVE
    with capsys.disabled():
        print(f"\nschemathesis, {target}: {sum(statuses.values())} cases, {dict(statuses)}")
    assert not failures, "\n".join(failures[:5])
    assert sum(statuses.values()) >= 100
    if target == "gateway":  # the key was taken: real generations, not a wall of 401s
        assert statuses[200] > 0 and statuses[401] < sum(statuses.values()) / 2


RESUME_EXAMPLES = 20
# A tool with one allowed argument value: the random model's forced call is a valid one.
WEATHER = tool("get_weather", city="Paris")
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
JUNK = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=40),
                 st.lists(st.text(max_size=8), max_size=3))  # fmt: skip


@st.composite
def continuations(draw: Any) -> dict[str, Any]:
    """How a client (or an attacker) might answer a real parked session: the real call id or
    another, content of any JSON type, the alias or another, stray fields, a missing turn."""
    return {
        "call_id": draw(st.sampled_from(["real", "other", "empty", "missing"])),
        "content": draw(st.one_of(st.text(max_size=300), JUNK)),
        "alias": draw(st.sampled_from(["real", "other", "bad", "none"])),
        "extra": draw(
            st.dictionaries(st.sampled_from(["name", "x", "tool_calls", "role"]), JUNK, max_size=2)
        ),
        "drop_assistant": draw(st.booleans()),
        "max_tokens": draw(st.one_of(st.none(), st.integers(-2, 12))),
    }


def test_resuming_a_real_parked_session_never_5xx(
    stack: Any, extra_gateway: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stateful link schemathesis does not follow: a real first turn that parks its session
    at a client-side tool call (create), then a generated continuation of it (resume), through
    a gateway with auth on. Valid continuations resume; the rest get a 4xx; none a 5xx."""
    key, line = create_key("stateful")
    keys = tmp_path / "api-keys"
    keys.write_text(line + "\n")
    gateway = extra_gateway("--api-keys-file", str(keys), "--rate-limit", "")
    headers = {"authorization": f"Bearer {key}"}
    statuses: Counter[int] = Counter()
    failures: list[str] = []

    @given(case=continuations())
    @settings(max_examples=RESUME_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), database=None)  # fmt: skip
    def run(case: dict[str, Any]) -> None:
        first = httpx.post(
            gateway + "/v1/chat/completions",
            json={"model": "tiny", "messages": ASK, "tools": [WEATHER], "max_tokens": 160,
                  "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            headers=headers, timeout=60,
        )  # fmt: skip
        assert first.status_code == 200, first.text
        body = first.json()
        msg = body["choices"][0]["message"]
        call_id = {"real": msg["tool_calls"][0]["id"], "other": "call_0000", "empty": ""}
        tool_msg: dict[str, Any] = {"role": "tool", "content": case["content"], **case["extra"]}
        if case["call_id"] != "missing":
            tool_msg["tool_call_id"] = call_id[case["call_id"]]
        turn = [] if case["drop_assistant"] else [msg]
        alias = {"real": body.get("interlude", {}).get("session_id", ""), "other": "conv-x",
                 "bad": "a b", "none": None}[case["alias"]]  # fmt: skip
        more = {"max_tokens": case["max_tokens"]} if case["max_tokens"] is not None else {}
        r = httpx.post(
            gateway + "/v1/chat/completions",
            json={"model": "tiny", "messages": [*ASK, *turn, tool_msg], "tools": [WEATHER],
                  **more},
            headers={**headers, **({"x-session-id": alias} if alias else {})}, timeout=60,
        )  # fmt: skip
        statuses[r.status_code] += 1
        if r.status_code >= 500:
            failures.append(f"{case} -> {r.status_code} {r.text[:300]}")

    run()
    with capsys.disabled():
        print(f"\nstateful resumes through the gateway: {dict(statuses)}")
    assert not failures, "\n".join(failures[:5])
    assert statuses[200] > 0 and sum(statuses.values()) == RESUME_EXAMPLES
