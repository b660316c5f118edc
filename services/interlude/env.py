"""Every environment variable Interlude reads, in one typed place.

Each setting has an ``INTERLUDE_`` name, a type and a default. Read them through `load_env()` so a
bad value fails at start-up with the variable's name in the message, not deep inside a request.
Command-line flags override these; the variables exist for containers (Helm sets them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from interlude.api.mux import UPSTREAMS
from interlude.api.redis_url import SCHEMES as REDIS_URL_SCHEMES

PREFIX = "INTERLUDE_"


@dataclass(frozen=True)
class Env:
    """Typed view of the ``INTERLUDE_*`` variables (field ``x`` is read from ``INTERLUDE_X``)."""

    trace: str = ""  # InferCept workload file; empty = ../shared/data, else generated workloads
    redis_url: str = "redis://127.0.0.1:6379/0"  # the tool bus
    engine_id: str = ""  # this engine's name on the bus; empty = host name + port (stable)
    tool_deadline_s: float = 300.0  # a tool call not answered by then ends as a timeout result
    model_cache: str = ""  # where the tiny test model is built; empty = a per-user cache dir
    otlp_endpoint: str = ""  # OpenTelemetry collector; empty = spans stay in-process
    trace_dir: str = ""  # spans as JSON lines here, one file per service (no collector needed)
    gateway_engines: str = ""  # the gateway's engines: comma-separated base URLs
    gateway_engine_service: str = ""  # or Kubernetes "namespace/service" of the engines
    gateway_engines_file: str = ""  # or a roster file (`gateway.file_discovery`)
    api_keys_file: str = ""  # the gateway's hashed API keys
    # The secret the gateway sends engines beside the caller's tenant; empty = none
    # (`interlude.api.engine.tenant_of`). The same value on the gateway and its engines.
    gateway_token: str = ""
    rate_limit: str = "600/minute"  # per API key at the gateway; empty = no limit
    # How the gateway reaches engines: mux (one WebSocket per engine) or http; `--upstream` wins.
    gateway_upstream: str = "mux"
    # The gateway and engines take `interlude_script` (scripted tool calls) only in benchmark
    # mode: 1/true/yes/on; `--benchmark-mode` wins. Off in production, where it would let a
    # client run server-side tools with arguments no model wrote.
    benchmark_mode: bool = False
    tools_config: str = ""  # a tool worker's tools file (TOML); empty = the standard tools only
    prometheus_url: str = ""  # the operator's Prometheus for pools naming none; empty = scrape
    sim_compiled: str = "auto"  # the mypyc-compiled simulator: auto, on or off (interlude.compiled)
    compiled_dir: str = ""  # where compiled builds live; empty = ~/.cache/interlude/compiled
    # `bench chaos`: where its `tally` tool records each run and effect of a call (drill only).
    drill_dir: str = ""
    # Seconds vLLM's shared-memory queue readers sleep between polls instead of spinning
    # (`interlude.engine.queue_nap`); negative = vLLM's own spin. CPU-build engines: 0.0001.
    vllm_queue_nap_s: float = -1.0

    def __post_init__(self) -> None:
        if self.tool_deadline_s <= 0:
            raise ValueError(f"{PREFIX}TOOL_DEADLINE_S must be > 0, got {self.tool_deadline_s}")
        if not self.redis_url.startswith(REDIS_URL_SCHEMES):
            raise ValueError(f"{PREFIX}REDIS_URL must be a redis:// URL, got {self.redis_url!r}")
        if not math.isfinite(self.vllm_queue_nap_s) or self.vllm_queue_nap_s >= 1:
            # vLLM's busy window is 1 s: a nap that long is a stall, not a nap.
            raise ValueError(
                f"{PREFIX}VLLM_QUEUE_NAP_S must be a number of seconds under 1 (negative: "
                f"off), got {self.vllm_queue_nap_s}"
            )
        if self.gateway_upstream not in UPSTREAMS:
            raise ValueError(
                f"{PREFIX}GATEWAY_UPSTREAM must be one of {', '.join(UPSTREAMS)}, got "
                f"{self.gateway_upstream!r}"
            )
        if self.sim_compiled not in ("auto", "on", "off"):
            raise ValueError(
                f"{PREFIX}SIM_COMPILED must be auto, on or off, got {self.sim_compiled!r}"
            )


def load_env(environ: Mapping[str, str] | None = None) -> Env:
    """Build `Env` from `environ` (default: the process environment); unset names keep defaults."""
    source = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for f in fields(Env):
        name = PREFIX + f.name.upper()
        if name not in source:
            continue
        raw = source[name]
        if f.type == "bool":
            values[f.name] = _flag(name, raw)
            continue
        try:
            values[f.name] = float(raw) if f.type == "float" else raw
        except ValueError:
            raise ValueError(f"{name} must be a number, got {raw!r}") from None
    return Env(**values)  # type: ignore[arg-type]


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _flag(name: str, raw: str) -> bool:
    """A boolean setting; anything but the usual spellings is a mistake worth stopping for."""
    word = raw.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError(f"{name} must be one of {', '.join(_TRUE + _FALSE[1:])}, got {raw!r}")
    return word in _TRUE
