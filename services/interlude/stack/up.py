"""`interlude up` / `interlude down`: the whole deployment as local processes on one machine.

Parts, in start order: the embedded Valkey server (unless a Redis URL is given), one tools-svc
worker, N engines and the gateway. Each logs to `<run-dir>/logs/<part>.log`; spans go to
`<run-dir>/traces/<service>.jsonl`; `<run-dir>/stack.json` records the parts' process ids, the
URLs and the API key, so `down` (from any shell) stops exactly what `up` started.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from interlude.stack.procs import Part, PartSpec, http_ok, spawn, stop_group, wait_ready
from interlude.stack.valkey import Valkey, free_port

STATE = "stack.json"
CLI = (sys.executable, "-m", "interlude.cli")


@dataclass(frozen=True)
class StackConfig:
    """What `interlude up` starts."""

    run_dir: Path
    engines: int = 1
    model: str = "tiny"
    policy: str = "interlude"
    blocks: int | None = None  # cap on each engine's KV blocks (None: what memory allows)
    redis_url: str = ""  # "" = start the embedded Valkey
    auth: bool = False  # API keys (off by default only here, on one trusted machine)
    rate_limit: str = "600/minute"  # the gateway's per-key limit
    host: str = "127.0.0.1"
    port: int = 8000
    engine_port: int = 8100
    client_deadline_s: float = 300.0
    start_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must be a redis:// URL, got {self.redis_url!r}")


@dataclass
class StackState:
    """What runs: written to `<run_dir>/stack.json` once every part is ready."""

    gateway: str
    engines: list[str]
    redis_url: str
    api_key: str
    run_dir: str
    parts: list[dict[str, Any]] = field(default_factory=list)  # name, pid, log

    def save(self) -> None:
        Path(self.run_dir, STATE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> StackState | None:
        try:
            return cls(**json.loads((run_dir / STATE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _published(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with Redis.from_url(url, socket_timeout=2) as r:
                return bool(r.hlen("interlude:tools"))
        except RedisError:
            return False

    return check


def _specs(cfg: StackConfig, redis_url: str, keys_file: Path | None) -> list[PartSpec]:
    logs = cfg.run_dir / "logs"
    env = {
        "INTERLUDE_REDIS_URL": redis_url,
        "INTERLUDE_TRACE_DIR": str(cfg.run_dir / "traces"),
        "PYTHONUNBUFFERED": "1",
    }
    tools = (
        sys.executable,
        "-m",
        "interlude_tools",
        "--redis-url",
        redis_url,
        "--consumer",
        "tools-0",
    )
    specs = [PartSpec("tools", tools, logs / "tools.log", _published(redis_url), env)]
    engines = []
    for i in range(cfg.engines):
        port = cfg.engine_port + i
        url = f"http://127.0.0.1:{port}"
        engines.append(url)
        argv = [*CLI, "engine", "--model", cfg.model, "--policy", cfg.policy]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--redis-url", redis_url]
        argv += ["--engine-id", f"engine-{i}", "--client-deadline", str(cfg.client_deadline_s)]
        if cfg.blocks is not None:
            argv += ["--blocks", str(cfg.blocks)]
        specs.append(
            PartSpec(
                f"engine-{i}", tuple(argv), logs / f"engine-{i}.log", http_ok(url + "/ready"), env
            )
        )
    gw = [*CLI, "gateway", "--host", cfg.host, "--port", str(cfg.port), "--redis-url", redis_url]
    for url in engines:
        gw += ["--engine", url]
    gw += ["--api-keys-file", str(keys_file)] if keys_file else ["--no-auth"]
    gw += ["--rate-limit", cfg.rate_limit]
    gw_url = f"http://127.0.0.1:{cfg.port}"
    specs.append(
        PartSpec("gateway", tuple(gw), logs / "gateway.log", http_ok(gw_url + "/ready"), env)
    )
    return specs


def up(cfg: StackConfig, tick: Callable[[Sequence[Part]], None] | None = None) -> StackState:
    """Start every part and wait until each is ready; on any failure stop them all and raise
    (`StartError` names the part and shows its log's tail)."""
    from interlude.gateway.auth import create_key

    if (old := StackState.load(cfg.run_dir)) is not None and any(_running(old)):
        raise RuntimeError(f"a stack already runs from {cfg.run_dir}: `interlude down` first")
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    parts: list[Part] = []
    valkey: Valkey | None = None
    try:
        redis_url = cfg.redis_url
        if not redis_url:
            valkey = Valkey(
                cfg.run_dir / "valkey", free_port(), cfg.run_dir / "logs" / "valkey.log"
            )
            (cfg.run_dir / "logs").mkdir(parents=True, exist_ok=True)
            redis_url = valkey.start()
        key, keys_file = "", None
        if cfg.auth:
            key, line = create_key("local")
            keys_file = cfg.run_dir / "api-keys"
            keys_file.write_text(line + "\n")
            keys_file.chmod(0o600)
        specs = _specs(cfg, redis_url, keys_file)
        parts = [spawn(s) for s in specs[:-1]]  # tools and engines start together
        wait_ready(parts, cfg.start_timeout_s, tick)
        parts.append(spawn(specs[-1]))  # the gateway, once it has engines to poll
        wait_ready(parts, 60.0, tick)
    except BaseException:
        for p in reversed(parts):
            stop_group(p.pid)
        if valkey is not None:
            valkey.stop()
        raise
    recorded = [{"name": p.spec.name, "pid": p.pid, "log": str(p.spec.log)} for p in parts]
    if valkey is not None and valkey.proc is not None:
        recorded.insert(0, {"name": "valkey", "pid": valkey.proc.pid, "log": str(valkey.log)})
    state = StackState(
        gateway=f"http://127.0.0.1:{cfg.port}",
        engines=[f"http://127.0.0.1:{cfg.engine_port + i}" for i in range(cfg.engines)],
        redis_url=redis_url,
        api_key=key,
        run_dir=str(cfg.run_dir),
        parts=recorded,
    )
    state.save()
    return state


def _running(state: StackState) -> list[str]:
    from interlude.stack.procs import alive

    return [p["name"] for p in state.parts if alive(int(p["pid"]))]


def down(run_dir: Path) -> list[str]:
    """Stop every part `up` recorded in `run_dir` (gateway first, Valkey last); returns the
    names of the parts that were still running. Harmless when nothing runs."""
    state = StackState.load(run_dir)
    if state is None:
        return []
    stopped = [p["name"] for p in reversed(state.parts) if stop_group(int(p["pid"]))]
    (run_dir / STATE).unlink(missing_ok=True)
    return stopped
