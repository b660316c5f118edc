"""`interlude picker`: the endpoint picker behind a Gateway API InferencePool.

Kept apart from `root.py` so the command line starts without importing gRPC.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from interlude.cli.gateway import (
    BenchmarkMode,
    DefaultSessions,
    DefaultToolCalls,
    EnginePort,
    EngineService,
    EngineUrls,
    LogLevel,
    MaxBodyBytes,
    ShedQueue,
)
from interlude.env import load_env


def picker(
    engine: EngineUrls = None,
    engine_service: EngineService = None,
    engine_port: EnginePort = 8100,
    api_keys_file: Annotated[
        str | None,
        typer.Option(help="hashed API keys (`interlude keys create`): the key names the tenant"),
    ] = None,
    tenant_header: Annotated[
        str | None,
        typer.Option(
            help="instead of keys: trust this request header, set by the cluster gateway after "
            "its own authentication, as the tenant"
        ),
    ] = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="no keys, no tenant header (one trusted network)")
    ] = False,
    default_tools: Annotated[
        str | None,
        typer.Option(
            help="server-side tools of callers without their own list: a,b; '*' all; '' none "
            "(default: none with keys or a tenant header, all with --no-auth)"
        ),
    ] = None,
    default_sessions: DefaultSessions = 0,
    default_tool_calls: DefaultToolCalls = 0,
    benchmark_mode: BenchmarkMode = None,
    max_body_bytes: MaxBodyBytes = 4 * 1024 * 1024,
    shed_queue: ShedQueue = 0.0,
    fallbacks: Annotated[
        int, typer.Option(min=0, help="endpoints listed after the chosen one")
    ] = 2,
    host: Annotated[str, typer.Option(help="listen address")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="gRPC port: ext_proc and grpc.health.v1")] = 9002,
    metrics_port: Annotated[int, typer.Option(min=0, help="HTTP /metrics port; 0 = none")] = 9090,
    log_level: LogLevel = "info",
) -> None:
    """Choose engines for a Gateway API InferencePool (Envoy ext_proc over gRPC)."""
    from interlude.picker.config import PickerConfig
    from interlude.picker.server import serve

    env = load_env()
    if sum((api_keys_file is not None, tenant_header is not None, no_auth)) > 1:
        raise typer.BadParameter("give one of --api-keys-file, --tenant-header, --no-auth")
    auth = "none" if no_auth else "header" if tenant_header is not None else "keys"
    try:
        config = PickerConfig(
            engines=tuple(engine or [u for u in env.gateway_engines.split(",") if u]),
            engine_service=env.gateway_engine_service if engine_service is None else engine_service,
            engine_port=engine_port,
            auth=auth,
            api_keys_file=env.api_keys_file if api_keys_file is None else api_keys_file,
            tenant_header=(tenant_header or "").lower(),
            default_tools=default_tools,
            default_sessions=default_sessions,
            default_tool_calls=default_tool_calls,
            benchmark_mode=env.benchmark_mode if benchmark_mode is None else benchmark_mode,
            max_body_bytes=max_body_bytes,
            shed_queue=shed_queue,
            fallbacks=fallbacks,
            gateway_token=env.gateway_token,
            host=host,
            port=port,
            metrics_port=metrics_port,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(serve(config))
