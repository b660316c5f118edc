"""`interlude up` / `interlude down`: the whole deployment as local processes on one machine.

Parts, in start order: the embedded Valkey server (unless a Redis URL is given), one tools-svc
worker, N engines and the gateway. Each logs to `<run-dir>/logs/<part>.log`; spans go to
`<run-dir>/traces/<service>.jsonl`; `<run-dir>/stack.json` records the parts' process ids, the
URLs and the API key, so `down` (from any shell) stops exactly what `up` started.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from interlude.api.engine import ENGINE_ROLES
from interlude.api.mux import UPSTREAMS
from interlude.api.redis_url import SCHEMES as REDIS_URL_SCHEMES
from interlude.gateway.file_discovery import write_roster
from interlude.stack.cpus import check_binds
from interlude.stack.procs import (
    Part,
    PartSpec,
    alive,
    start_all,
    start_ticks,
    stop_groups,
)
from interlude.stack.specs import ROSTER, engine_cpus, engine_ports, part_specs, port_free
from interlude.stack.valkey import Valkey, free_port

STATE = "stack.json"


@dataclass(frozen=True)
class StackConfig:
    """What `interlude up` starts."""

    run_dir: Path
    engines: int = 1
    model: str = "tiny"
    policy: str = "interlude"
    blocks: int | None = None  # cap on each engine's KV blocks (None: what memory allows)
    host_blocks: int | None = None  # each engine's host swap pool (None: the engine's default)
    redis_url: str = ""  # "" = start the embedded Valkey
    auth: bool = False  # API keys (off by default only here, on one trusted machine)
    rate_limit: str = "600/minute"  # the gateway's per-key limit
    host: str = "127.0.0.1"
    port: int = 8000
    engine_port: int = 8100
    client_deadline_s: float = 300.0
    start_timeout_s: float = 600.0
    emulate: str | None = None  # the engines' emulated accelerator (a profile; engine/emulate.py)
    # Scripted tool calls (`interlude_script`) and the test tools, for load generators: the
    # gateway and engines run with --benchmark-mode. Off, they refuse a script with a 400.
    benchmark_mode: bool = False
    # Each engine's cores (vLLM's `VLLM_CPU_OMP_THREADS_BIND`, one list per engine, or `auto`);
    # empty: split this process's cores between the engines (stack/cpus.py says why).
    engine_cpus: tuple[str, ...] = ()
    # Each engine's role (`api.engine.ENGINE_ROLES`), one per engine; empty: all mixed. Any
    # prefill or decode role starts every engine with the host link (`--kv-link`).
    roles: tuple[str, ...] = ()
    # How the gateway reaches the engines (`GatewayConfig.upstream`): mux or http; "": the
    # gateway's default (INTERLUDE_GATEWAY_UPSTREAM, else mux).
    gateway_upstream: str = ""
    stream_interval: int = 1  # each engine's tokens per streamed chunk (`--stream-interval`)
    # A pool scaled by the operator's rule (`stack/pool.py`): start this many engines, and let
    # the foreground `up` run between it and `engines`; None: `engines`, fixed.
    min_engines: int | None = None

    def __post_init__(self) -> None:
        if self.roles and len(self.roles) != self.engines:
            raise ValueError(f"{len(self.roles)} roles for {self.engines} engines")
        for role in self.roles:
            if role not in ENGINE_ROLES:
                raise ValueError(f"role must be one of {ENGINE_ROLES}, got {role!r}")
        if "prefill" in self.roles and "decode" not in self.roles:
            raise ValueError("prefill engines need a decode engine to hand their KV to")
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if self.min_engines is not None:
            if not 1 <= self.min_engines <= self.engines:
                raise ValueError(
                    f"min_engines must be within [1, engines ({self.engines})], "
                    f"got {self.min_engines}"
                )
            if self.roles:
                raise ValueError("a scaled pool runs mixed engines only: no roles")
        if self.gateway_upstream and self.gateway_upstream not in UPSTREAMS:
            raise ValueError(
                f"gateway_upstream must be one of {', '.join(UPSTREAMS)} (or empty), got "
                f"{self.gateway_upstream!r}"
            )
        if self.engine_cpus:
            check_binds(self.engine_cpus, self.engines)
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.host_blocks is not None and self.host_blocks < 0:
            raise ValueError(f"host_blocks must be >= 0, got {self.host_blocks}")
        if self.redis_url and not self.redis_url.startswith(REDIS_URL_SCHEMES):
            raise ValueError(f"redis_url must be a redis:// URL, got {self.redis_url!r}")


@dataclass
class StackState:
    """What runs (`engines`: those started with the stack; a scaled pool's are in its roster,
    `engines.json`): `<run_dir>/stack.json`, rewritten as each part starts (so `down` can stop a
    stack whose `up` was killed half-way) and once more, `ready`, when all are up."""

    gateway: str
    engines: list[str]
    redis_url: str
    api_key: str
    run_dir: str
    parts: list[dict[str, Any]] = field(default_factory=list)  # name, pid, started, log
    ready: bool = False
    # The foreground `interlude up` that restarts dead parts (pid, start ticks), if one does:
    # `down` asks it to stop first, or it would start again what `down` stops.
    supervisor: list[int] = field(default_factory=list)
    engine_cpus: list[str] = field(default_factory=list)  # each engine's cores, as bound
    roles: list[str] = field(default_factory=list)  # each engine's role at start (empty: mixed)

    def save(self) -> None:
        # Atomically: `down` in another shell may read it while `up` rewrites it.
        tmp = Path(self.run_dir, STATE + ".tmp")
        tmp.unlink(missing_ok=True)
        tmp.touch(mode=0o600)  # it holds the API key
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(Path(self.run_dir, STATE))

    @classmethod
    def load(cls, run_dir: Path) -> StackState | None:
        try:
            return cls(**json.loads((run_dir / STATE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def up(
    cfg: StackConfig,
    tick: Callable[[Sequence[Part]], None] | None = None,
    started: list[Part] | None = None,
    spares: list[tuple[PartSpec, str]] | None = None,
) -> StackState:
    """Start every part and wait until each is ready; on any failure (Ctrl-C included) stop them
    all and raise (`StartError` names the part and shows its log's tail). `started`, if given,
    receives the parts once all are ready (for a `Supervisor`); `spares` the engines a scaled
    pool (`cfg.min_engines`) may start later, with their URLs.

    Side effects: processes, `<run_dir>/logs/`, `<run_dir>/valkey/` (the embedded server's
    append-only file: a restart replays accepted work), the keys file with `auth`, and the state
    file, which names every started part from the moment it starts.
    """
    # Absolute in the state file and in every part's paths, whatever the caller's cwd later.
    cfg = replace(cfg, run_dir=cfg.run_dir.resolve())
    # Each engine's cores, decided once: the specs bind them and the state file records them.
    cfg = replace(cfg, engine_cpus=tuple(engine_cpus(cfg)))
    if (old := StackState.load(cfg.run_dir)) is not None and _running(old):
        raise RuntimeError(f"a stack already runs from {cfg.run_dir}: `interlude down` first")
    if not port_free(cfg.host, cfg.port):
        raise RuntimeError(f"port {cfg.port} is taken (another gateway?): pass --port")
    ports = engine_ports(cfg)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    waves: list[tuple[Sequence[PartSpec], float]] = []
    redis_url = cfg.redis_url
    if not redis_url:
        valkey = Valkey(cfg.run_dir / "valkey", free_port(), cfg.run_dir / "logs" / "valkey.log")
        redis_url = valkey.url
        waves.append(([valkey.spec()], 30.0))
    key, keys_file = _local_key(cfg.run_dir) if cfg.auth else ("", None)
    specs = part_specs(cfg, redis_url, ports, keys_file)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    n = cfg.engines if cfg.min_engines is None else cfg.min_engines
    if cfg.min_engines is not None:
        write_roster(cfg.run_dir / ROSTER, urls[:n], [])  # before the gateway reads it
    if spares is not None:
        spares.extend(zip(specs[1 + n : -1], urls[n:], strict=True))
    waves.append((specs[: 1 + n], cfg.start_timeout_s))  # tools and engines start together
    waves.append((specs[-1:], 60.0))  # the gateway, once it has engines to poll
    state = StackState(
        gateway=f"http://127.0.0.1:{cfg.port}",
        engines=urls[:n],
        redis_url=redis_url,
        api_key=key,
        run_dir=str(cfg.run_dir),
        engine_cpus=list(cfg.engine_cpus),
        roles=list(cfg.roles),
    )

    try:
        parts = start_all(waves, tick, lambda part: record_start(state, part))
    except BaseException:
        (cfg.run_dir / STATE).unlink(missing_ok=True)  # start_all stopped every part
        raise
    if started is not None:
        started.extend(parts)
    state.ready = True
    state.save()
    return state


def _local_key(run_dir: Path) -> tuple[str, Path]:
    """A new API key for the stack, and the keys file (mode 0600) the gateway reads it from."""
    from interlude.gateway.auth import create_key

    key, line = create_key("local")
    keys_file = run_dir / "api-keys"
    keys_file.unlink(missing_ok=True)  # so that `touch` creates it with this mode
    keys_file.touch(mode=0o600)  # never readable by others, not even for a moment
    keys_file.write_text(line + "\n")
    return key, keys_file


def record_restart(state: StackState, old: Part, new: Part) -> None:
    """A supervisor started `old`'s part again as `new`: the state file names the new process,
    so that `down` stops it."""
    for entry in state.parts:
        if entry["pid"] == old.pid:
            entry.update(pid=new.pid, started=start_ticks(new.pid))
    state.save()


def record_start(state: StackState, part: Part) -> None:
    """A part started after `up` returned (a local pool's new engine): the state file names
    it, so that `down` stops it."""
    entry = {"name": part.spec.name, "pid": part.pid, "log": str(part.spec.log)}
    state.parts.append({**entry, "started": start_ticks(part.pid)})
    state.save()


def record_stop(state: StackState, name: str) -> None:
    """A part stopped for good while the stack runs (a drained engine): no longer named."""
    state.parts = [p for p in state.parts if p["name"] != name]
    state.save()


def _running(state: StackState) -> list[str]:
    return [p["name"] for p in state.parts if alive(int(p["pid"]), p.get("started"))]


def down(run_dir: Path, timeout_s: float = 20.0) -> list[str]:
    """Stop every part `up` recorded in `run_dir` (Valkey last), each part's whole process
    group; returns the names of the parts that were still running. Harmless when
    nothing runs (no state file, or its processes long gone). A foreground `interlude up`
    supervising the parts is stopped first (it stops the parts itself on its way out)."""
    state = StackState.load(run_dir)
    if state is None:
        return []
    # A supervisor stops the parts itself on its way out: they count as stopped here too.
    running = set(_running(state))
    _stop_supervisor(state, timeout_s)
    # Every part but Valkey at once under one deadline (a gateway draining its connections
    # and an engine shutting vLLM down each took up to the whole timeout, one after the other),
    # then Valkey, which the others may still write to on their way out.
    first = [p for p in reversed(state.parts) if p["name"] != "valkey"]
    last = [p for p in state.parts if p["name"] == "valkey"]
    stopped = []
    for wave in (first, last):
        ran = stop_groups([(int(p["pid"]), p.get("started")) for p in wave], timeout_s)
        stopped += [p["name"] for p, r in zip(wave, ran, strict=True) if r or p["name"] in running]
    (run_dir / STATE).unlink(missing_ok=True)
    return stopped


def _stop_supervisor(state: StackState, timeout_s: float) -> None:
    """SIGTERM the supervising `interlude up` (not this process) and wait for it to exit."""
    if not state.supervisor:
        return
    pid, started = state.supervisor
    if pid == os.getpid() or not alive(pid, started):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid, started) and time.monotonic() < deadline:
        time.sleep(0.05)
