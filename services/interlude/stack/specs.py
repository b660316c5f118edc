"""The processes `interlude up` starts, as `PartSpec`s: their command lines, environments,
readiness checks and ports (engines' cores: `stack/cpus.py`)."""

from __future__ import annotations

import json
import secrets
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from redis import Redis
from redis.exceptions import RedisError

from interlude.api.tools import KEY as TOOLS_KEY
from interlude.stack.cpus import AUTO, available_cores, engine_binds
from interlude.stack.procs import PartSpec, http_failed, http_ok
from interlude.stack.valkey import free_port

if TYPE_CHECKING:
    from interlude.stack.up import StackConfig

CLI = (sys.executable, "-m", "interlude.cli")
ROSTER = "engines.json"  # a scaled pool's engines, for the gateway (`gateway.file_discovery`)


def _published(url: str, worker: str) -> Callable[[], bool]:
    """Ready when `worker` has published its tools since now: an existing Redis may still hold
    entries from an earlier run, which say nothing about this worker."""
    since = time.time() - 1.0  # the worker's clock is ours; a second of slack for rounding

    def check() -> bool:
        try:
            with Redis.from_url(url, socket_timeout=2) as r:
                entries = r.hvals(TOOLS_KEY)
        except RedisError:
            return False
        for text in entries:
            try:
                entry = json.loads(text)
                if entry["worker"] == worker and float(entry["updated_at"]) >= since:
                    return True
            except (ValueError, KeyError, TypeError):
                continue
        return False

    return check


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As servers bind (uvicorn sets SO_REUSEADDR): a port in TIME_WAIT counts as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def engine_ports(cfg: StackConfig) -> list[int]:
    """`cfg.engines` free ports from `cfg.engine_port` up, skipping busy ones and the gateway's."""
    ports: list[int] = []
    port = cfg.engine_port
    while len(ports) < cfg.engines:
        if port > 65535:
            raise RuntimeError(f"no {cfg.engines} free ports from {cfg.engine_port} up")
        if port != cfg.port and port_free("127.0.0.1", port):
            ports.append(port)
        port += 1
    return ports


def engine_cpus(cfg: StackConfig) -> list[str]:
    """Each engine's `VLLM_CPU_OMP_THREADS_BIND`: the ones asked for, or a split of our cores."""
    return list(cfg.engine_cpus) or engine_binds(cfg.engines, available_cores())


def part_specs(
    cfg: StackConfig, redis_url: str, ports: Sequence[int], keys_file: Path | None
) -> list[PartSpec]:
    """The tools worker and the engines (started together), then the gateway. A scaled pool
    (`cfg.min_engines`) has all `cfg.engines` specs here and its gateway reads the pool's
    roster file instead of a list of engines."""
    env = {
        "INTERLUDE_REDIS_URL": redis_url,
        "INTERLUDE_TRACE_DIR": str(cfg.run_dir / "traces"),
        "PYTHONUNBUFFERED": "1",
        # The engines believe the gateway's tenant header only beside this (engines listen
        # on 127.0.0.1, but any local process could reach them).
        "INTERLUDE_GATEWAY_TOKEN": secrets.token_hex(16),
    }
    binds = engine_cpus(cfg)
    engines = [_engine_spec(cfg, i, port, redis_url, env, binds[i]) for i, port in enumerate(ports)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    gateway = _gateway_spec(cfg, redis_url, env, urls, keys_file)
    return [_tools_spec(cfg, redis_url, env), *engines, gateway]


def _tools_spec(cfg: StackConfig, redis_url: str, env: Mapping[str, str]) -> PartSpec:
    tools = (
        sys.executable,
        "-m",
        "interlude_tools",
        "--redis-url",
        redis_url,
        "--consumer",
        "tools-0",
        # Its /health and /metrics, on a port of its own (9100 may be another worker's).
        "--metrics-port",
        str(free_port()),
        # echo, scripted/sleep and fail too: the load generator's server-side calls use them.
        "--test-tools",
    )
    log = cfg.run_dir / "logs" / "tools.log"
    return PartSpec("tools", tools, log, _published(redis_url, "tools-0"), env)


def _engine_spec(
    cfg: StackConfig, i: int, port: int, redis_url: str, env: Mapping[str, str], bind: str
) -> PartSpec:
    url = f"http://127.0.0.1:{port}"
    argv = [*CLI, "engine", "--model", cfg.model, "--policy", cfg.policy]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--redis-url", redis_url]
    argv += ["--engine-id", f"engine-{i}", "--client-deadline", str(cfg.client_deadline_s)]
    if cfg.blocks is not None:
        argv += ["--blocks", str(cfg.blocks)]
    if cfg.host_blocks is not None:
        argv += ["--host-blocks", str(cfg.host_blocks)]
    if cfg.emulate is not None:
        argv += ["--emulate", cfg.emulate]
    if cfg.stream_interval > 1:
        argv += ["--stream-interval", str(cfg.stream_interval)]
    if cfg.benchmark_mode:
        argv.append("--benchmark-mode")
    if cfg.roles and set(cfg.roles) != {"mixed"}:
        argv += ["--kv-link", "--role", cfg.roles[i]]
    log, ready = cfg.run_dir / "logs" / f"engine-{i}.log", http_ok(url + "/ready")
    # `auto` is vLLM's default: leave the variable as the caller's environment has it.
    own = env if bind == AUTO else {**env, "VLLM_CPU_OMP_THREADS_BIND": bind}
    # An engine whose start failed stays up to say so (503 on /health): fail now, not later.
    return PartSpec(f"engine-{i}", tuple(argv), log, ready, own, http_failed(url + "/health"))


def _gateway_spec(
    cfg: StackConfig,
    redis_url: str,
    env: Mapping[str, str],
    engines: Sequence[str],
    keys_file: Path | None,
) -> PartSpec:
    gw = [*CLI, "gateway", "--host", cfg.host, "--port", str(cfg.port), "--redis-url", redis_url]
    if cfg.min_engines is not None:
        gw += ["--engines-file", str(cfg.run_dir / ROSTER)]
    else:
        for url in engines:
            gw += ["--engine", url]
    # With keys too, the local key runs every published tool: one trusted machine.
    gw += (
        ["--api-keys-file", str(keys_file), "--default-tools", "*"] if keys_file else ["--no-auth"]
    )
    gw += ["--rate-limit", cfg.rate_limit, "--introspection"]  # one trusted machine
    gw += ["--upstream", cfg.gateway_upstream] if cfg.gateway_upstream else []
    gw += ["--benchmark-mode"] if cfg.benchmark_mode else []
    ready = http_ok(f"http://127.0.0.1:{cfg.port}/ready")
    return PartSpec("gateway", tuple(gw), cfg.run_dir / "logs" / "gateway.log", ready, env)
