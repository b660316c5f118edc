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
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from interlude.gateway.auth import create_key
from interlude.stack.procs import stop_group

from .conftest import CLI, wait_ready

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
