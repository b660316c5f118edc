"""The gateway's settings: one frozen dataclass, validated when built."""

from __future__ import annotations

from dataclasses import dataclass

from interlude.api.mux import UPSTREAMS
from interlude.api.redis_url import SCHEMES as REDIS_URL_SCHEMES
from interlude.gateway.auth import parse_tools


def check_engines(engines: tuple[str, ...], engine_service: str, engines_file: str = "") -> None:
    """ValueError unless the engines are named: base URLs, a "namespace/name" Service, or a
    roster file (`gateway.file_discovery`); a Service and a file exclude each other."""
    if not engines and not engine_service and not engines_file:
        raise ValueError(
            "name at least one engine (--engine URL), --engine-service NS/NAME or --engines-file"
        )
    if engine_service and engines_file:
        raise ValueError("give --engine-service or --engines-file, not both")
    for url in engines:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL must start with http:// or https://, got {url!r}")
    if engine_service and engine_service.count("/") != 1:
        raise ValueError(f"engine_service must be 'namespace/name', got {engine_service!r}")


def check_positive(values: dict[str, float]) -> None:
    """ValueError naming the first of `values` (by setting name) that is not > 0."""
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True)
class GatewayConfig:
    """What one gateway process serves and how it protects itself."""

    engines: tuple[str, ...] = ()  # static engine base URLs (http://host:port)
    # Kubernetes: "namespace/service" whose EndpointSlices list the engines (port below).
    engine_service: str = ""
    engine_port: int = 8100
    # Or a roster file a local pool controller rewrites as it scales (`interlude up
    # --min-engines`; `gateway.file_discovery`).
    engines_file: str = ""
    redis_url: str = ""  # rate limits; "" = kept in this process
    auth: bool = True  # API keys required (off only in the one-machine mode)
    api_keys_file: str = ""  # hashed keys (`interlude keys create`); required when auth is on
    rate_limit: str = "600/minute"  # per API key: N/unit, N per unit, N/M units; "" = none
    # Server-side tools a key without its own list (or any caller, without keys) may run:
    # comma-separated, "*" every published tool, "" none; None: none with keys, every one
    # without (one trusted machine).
    default_tools: str | None = None
    # Caps of a key without its own (or of any caller, without keys), on each engine: live
    # sessions and server-side tool calls in flight (`api.engine.Caps`); 0 = no cap.
    default_sessions: int = 0
    default_tool_calls: int = 0
    # Take `interlude_script` (scripted tool calls, for load generators); off, it is a 400.
    benchmark_mode: bool = False
    max_body_bytes: int = 4 * 1024 * 1024
    # New sessions get a 429 when every engine that could take one has this many requests
    # waiting per slot (`gateway.placement`); 0 = never shed.
    shed_queue: float = 0.0
    # Sent to engines beside the caller's tenant (`api.engine.tenant_of`); "" = none.
    gateway_token: str = ""
    # How chat completions reach engines: "mux", every request to an engine over one WebSocket
    # (`api/mux.py`; an engine without it is called over HTTP), or "http", a connection each.
    upstream: str = "mux"
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0  # a whole leg, from the engine's first byte to its last
    health_interval_s: float = 2.0  # how often each engine's load is read
    health_failures: int = 2  # consecutive failed reads that take an engine out of the pool
    otlp_endpoint: str = ""
    # The API document (/docs, /openapi.json) and the engines' addresses on /ready: off by
    # default, because a public endpoint should not map the cluster for whoever asks.
    introspection: bool = False
    # /metrics on a port of its own, not the API's (which a NetworkPolicy or an Ingress may
    # open to the world); 0 = on the API port, for one machine.
    metrics_port: int = 0

    def __post_init__(self) -> None:
        check_engines(self.engines, self.engine_service, self.engines_file)
        if self.auth and not self.api_keys_file:
            raise ValueError("auth is on: give --api-keys-file (or --no-auth on a trusted machine)")
        parse_tools(self.tools_by_default)  # ValueError naming what is not a tool name
        if not 0 <= self.shed_queue < float("inf"):
            raise ValueError(f"shed_queue must be >= 0 (0: never shed), got {self.shed_queue}")
        if self.default_sessions < 0 or self.default_tool_calls < 0:
            raise ValueError("default_sessions and default_tool_calls must be >= 0 (0: no cap)")
        if self.redis_url and not self.redis_url.startswith(REDIS_URL_SCHEMES):
            raise ValueError(f"redis_url must be a redis:// URL, got {self.redis_url!r}")
        if self.upstream not in UPSTREAMS:
            raise ValueError(
                f"upstream must be one of {', '.join(UPSTREAMS)}, got {self.upstream!r}"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(
                f"metrics_port must be 0 (the API's) or a port, got {self.metrics_port}"
            )
        positive = {
            "max_body_bytes": self.max_body_bytes,
            "connect_timeout_s": self.connect_timeout_s,
            "request_timeout_s": self.request_timeout_s,
            "health_interval_s": self.health_interval_s,
            "health_failures": self.health_failures,
        }
        check_positive(positive)

    @property
    def tools_by_default(self) -> str:
        """`default_tools`, or when None: none with keys, every one without."""
        if self.default_tools is not None:
            return self.default_tools
        return "" if self.auth else "*"
