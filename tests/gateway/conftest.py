"""The real stack for the gateway's tests: Valkey, a tools-svc worker, two engines, a gateway.

Each part is its own process, as in production. Starting the engines takes ~30 s on 2 cores, so
one stack serves the whole session (`test_stack.py` and `test_fuzz.py`). The worker runs the
test tools (`--test-tools`) and the engines and gateway are in benchmark mode, so scripted
calls pass; `extra_gateway` starts more gateways (seconds each) in front of its engines, with
other options (no benchmark mode, API keys with caps).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from interlude.stack.cpus import available_cores, engine_binds
from interlude.stack.procs import stop_group

CLIENT_DEADLINE_S = 20.0
CLI = [sys.executable, "-m", "interlude.cli"]


@dataclass(frozen=True)
class Stack:
    gateway: str
    engines: tuple[str, ...]
    logs: Path
    redis_url: str

    def load(self, engine: str) -> dict[str, Any]:
        return dict(httpx.get(engine + "/v1/load", timeout=5).json())

    def totals(self, key: str) -> float:
        return sum(float(self.load(e).get(key, 0)) for e in self.engines)


def wait_ready(
    url: str, procs: list[subprocess.Popen[bytes]], logs: Path, timeout_s: float
) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                tails = "\n".join(f"--- {f.name}\n{f.read_text()[-2000:]}" for f in logs.iterdir())
                pytest.fail(f"a stack process exited ({p.args}):\n{tails}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} not ready after {timeout_s} s")


@pytest.fixture(scope="session")
def stack(
    tiny_model: str,
    redis_server: str,
    free_port: Callable[[], int],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("stack-logs")
    # vLLM's INFO lines in the engines' logs (test_stack reads the OpenMP binding there),
    # whatever an earlier in-process `bench` command left in this process's environment.
    env = {**os.environ, "INTERLUDE_REDIS_URL": redis_server, "VLLM_LOGGING_LEVEL": "INFO"}
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
        out = (logs / f"{name}.log").open("wb")
        # Its own process group: stopping it stops vLLM's engine-core child too.
        procs.append(
            subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, **(extra or {})},
                start_new_session=True,
            )
        )

    start(
        "tools",
        [
            sys.executable,
            "-m",
            "interlude_tools",
            "--redis-url",
            redis_server,
            "--metrics-port",
            "0",
            "--test-tools",
        ],
    )
    engines = []
    # Cores of their own, as `interlude up` gives them (stack/cpus.py: on one core, the engine
    # that served last slows the other's forward).
    binds = engine_binds(2, available_cores())
    for i in range(2):
        port = free_port()
        engines.append(f"http://127.0.0.1:{port}")
        start(
            f"engine-{i}",
            [
                *CLI,
                "engine",
                "--model",
                tiny_model,
                "--served-model-name",
                "tiny",
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--engine-id",
                f"engine-{i}",
                "--client-deadline",
                str(CLIENT_DEADLINE_S),
                "--benchmark-mode",
                # The host link beside the host swap (a MultiConnector): every test runs with
                # it, and test_disaggregated flips these engines to prefill and decode roles.
                "--kv-link",
            ],
            {"VLLM_CPU_OMP_THREADS_BIND": binds[i]},
        )
    gw_port = free_port()
    gateway = f"http://127.0.0.1:{gw_port}"
    argv = [*CLI, "gateway", "--no-auth", "--host", "127.0.0.1", "--port", str(gw_port)]
    argv += ["--benchmark-mode"]
    for e in engines:
        argv += ["--engine", e]
    start("gateway", argv)
    try:
        # Server-side tools are the published ones: wait for the worker's.
        end = time.monotonic() + 60
        with Redis.from_url(redis_server) as r:
            while not r.hexists("interlude:tools", "calculator"):
                assert time.monotonic() < end, "the tools worker never published its tools"
                time.sleep(0.2)
        for e in engines:
            wait_ready(e + "/ready", procs, logs, 240)
        wait_ready(gateway + "/ready", procs, logs, 30)
        # Both engines in the gateway's pool (it polls every 2 s).
        end = time.monotonic() + 30
        while sum(x["ready"] for x in httpx.get(gateway + "/ready").json()["engines"]) < 2:
            assert time.monotonic() < end, "the gateway did not see both engines ready"
            time.sleep(0.5)
        yield Stack(gateway, tuple(engines), logs, redis_server)
    finally:
        for p in procs:
            stop_group(p.pid)


ExtraGateway = Callable[..., str]


@pytest.fixture(scope="module")
def extra_gateway(
    stack: Stack, free_port: Callable[[], int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExtraGateway]:
    """`extra_gateway(*options, engines=stack.engines)`: the base URL of one more gateway (its
    own process, rate limits in the stack's Valkey) in front of the stack's `engines` with
    `options`, ready; every one started is stopped when the module is done. Benchmark mode
    is off unless `options` turn it on, whatever this process's environment says."""
    logs = tmp_path_factory.mktemp("extra-gateways")
    procs: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if k != "INTERLUDE_BENCHMARK_MODE"}
    env["INTERLUDE_REDIS_URL"] = stack.redis_url

    def start(*options: str, engines: tuple[str, ...] = stack.engines) -> str:
        port = free_port()
        argv = [*CLI, "gateway", "--host", "127.0.0.1", "--port", str(port), *options]
        for e in engines:
            argv += ["--engine", e]
        out = (logs / f"gateway-{port}.log").open("wb")
        procs.append(
            subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )
        url = f"http://127.0.0.1:{port}"
        wait_ready(url + "/ready", procs, logs, 60)
        return url

    try:
        yield start
    finally:
        for p in procs:
            stop_group(p.pid)
