"""Schemathesis against the gateway's own OpenAPI document, on the real stack.

Every operation gets positive (schema-valid) and negative (schema-violating) cases; none may
answer 5xx or hang (each call has a timeout). The fuzzing gateway routes to an engine of its
own that caps `max_tokens` at 4 (the engines check requests now), so a valid case is a real but
short generation. The number of cases is printed.
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

from interlude.stack.procs import stop_group

from .conftest import CLI, wait_ready

pytestmark = pytest.mark.engine

EXAMPLES = 60  # per operation and mode


@pytest.fixture(scope="module")
def fuzz_gateway(stack: Any, tiny_model: str, free_port: Callable[[], int]) -> Iterator[str]:
    engine_port, port = free_port(), free_port()
    engine = [*CLI, "engine", "--model", tiny_model, "--served-model-name", "tiny"]
    engine += ["--host", "127.0.0.1", "--port", str(engine_port), "--engine-id", "fuzz-engine"]
    engine += ["--max-tokens", "4", "--redis-url", stack.redis_url]
    argv = [*CLI, "gateway", "--no-auth", "--introspection", "--host", "127.0.0.1"]
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
        yield url
    finally:
        for p in procs:
            stop_group(p.pid)


def test_no_5xx_and_no_hang(fuzz_gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = schemathesis.openapi.from_url(fuzz_gateway + "/openapi.json")
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
                response = case.call(base_url=fuzz_gateway, timeout=30)
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
        print(f"\nschemathesis: {sum(statuses.values())} cases, statuses {dict(statuses)}")
    assert not failures, "\n".join(failures[:5])
    assert sum(statuses.values()) >= 100
