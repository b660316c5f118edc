"""The endpoint picker's settings: one frozen dataclass, validated when built."""

from __future__ import annotations

import re
from dataclasses import dataclass

from interlude.gateway.auth import parse_tools
from interlude.gateway.config import check_engines, check_positive

AUTH_MODES = ("keys", "header", "none")
_HEADER = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")


@dataclass(frozen=True)
class PickerConfig:
    """What one picker process routes to and how it names each request's tenant."""

    engines: tuple[str, ...] = ()  # static engine base URLs (http://host:port)
    # Kubernetes: "namespace/service" whose EndpointSlices list the engines (port below).
    engine_service: str = ""
    engine_port: int = 8100
    # Who the caller is (the tenant the engines scope sessions, tools and caps by): "keys"
    # checks the API key against `api_keys_file`, as the gateway does; "header" trusts
    # `tenant_header`, set by a cluster gateway that authenticated the caller; "none" names
    # no one (one trusted network).
    auth: str = "keys"
    api_keys_file: str = ""
    tenant_header: str = ""
    # As the gateway's: tools and caps of a key without its own (or of any caller without keys).
    default_tools: str | None = None
    default_sessions: int = 0
    default_tool_calls: int = 0
    benchmark_mode: bool = False  # `interlude_script` passes (else a 400)
    max_body_bytes: int = 4 * 1024 * 1024
    # New sessions get a 429 when every engine that could take one has this many requests
    # waiting per slot (`gateway.placement`); 0 = never shed.
    shed_queue: float = 0.0
    fallbacks: int = 2  # endpoints listed after the chosen one, for the proxy's retries
    gateway_token: str = ""  # sent to the engines beside the tenant (`api.engine.tenant_of`)
    host: str = "0.0.0.0"
    port: int = 9002  # gRPC: ext_proc and grpc.health.v1
    metrics_port: int = 9090  # HTTP /metrics; 0 = none
    health_interval_s: float = 2.0  # how often each engine's load is read
    health_failures: int = 2  # consecutive failed reads that take an engine out of the pool
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        check_engines(self.engines, self.engine_service)
        if self.auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}, got {self.auth!r}")
        if self.auth == "keys" and not self.api_keys_file:
            raise ValueError("auth is keys: give --api-keys-file (or --tenant-header, --no-auth)")
        if self.auth == "header" and not _HEADER.match(self.tenant_header):
            raise ValueError(
                f"tenant_header must be a lower-case header name, got {self.tenant_header!r}"
            )
        if self.tenant_header.startswith("x-interlude-"):
            # The picker removes every x-interlude-* header a client sends: one named here
            # could never arrive from the cluster gateway, and one it did not remove could be
            # forged by the caller.
            raise ValueError(
                f"tenant_header may not be an x-interlude-* header: {self.tenant_header}"
            )
        parse_tools(self.tools_by_default)
        if self.default_sessions < 0 or self.default_tool_calls < 0:
            raise ValueError("default_sessions and default_tool_calls must be >= 0 (0: no cap)")
        if not 0 <= self.shed_queue < float("inf"):
            raise ValueError(f"shed_queue must be >= 0 (0: never shed), got {self.shed_queue}")
        if self.fallbacks < 0:
            raise ValueError(f"fallbacks must be >= 0, got {self.fallbacks}")
        for name, port in (("port", self.port), ("metrics_port", self.metrics_port)):
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} must be a port (0-65535), got {port}")
        positive = {
            "max_body_bytes": self.max_body_bytes,
            "health_interval_s": self.health_interval_s,
            "health_failures": self.health_failures,
            "connect_timeout_s": self.connect_timeout_s,
        }
        check_positive(positive)

    @property
    def tools_by_default(self) -> str:
        """`default_tools`, or when None: none with keys or a tenant header, all without."""
        if self.default_tools is not None:
            return self.default_tools
        return "*" if self.auth == "none" else ""
