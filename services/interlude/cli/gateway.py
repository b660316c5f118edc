"""The gateway's commands: `interlude gateway` and `interlude keys create`.

Kept apart from `root.py` so the command line starts without importing FastAPI.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from interlude.env import load_env

keys = typer.Typer(help="API keys for the gateway.", no_args_is_help=True)

# Options the gateway and the endpoint picker (`cli/picker.py`) share, with one meaning each.
EngineUrls = Annotated[list[str] | None, typer.Option(help="engine base URL (repeat for several)")]
EngineService = Annotated[
    str | None, typer.Option(help="Kubernetes 'namespace/service' of the engines")
]
EnginePort = Annotated[int, typer.Option(help="engine port on discovered pods")]
EnginesFile = Annotated[
    str | None,
    typer.Option(
        help='a roster file of engines ({"engines": [URL], "draining": [URL]}), re-read '
        "every poll (`interlude up --min-engines` writes one)"
    ),
]
DefaultSessions = Annotated[
    int,
    typer.Option(
        min=0, help="live sessions of keys without their own cap, on each engine; 0 = no cap"
    ),
]
DefaultToolCalls = Annotated[
    int,
    typer.Option(
        min=0,
        help="server-side tool calls in flight of keys without their own cap, on each "
        "engine; 0 = no cap",
    ),
]
BenchmarkMode = Annotated[
    bool | None,
    typer.Option(
        "--benchmark-mode/--no-benchmark-mode",
        help="take interlude_script (scripted tool calls, for load generators); "
        "default INTERLUDE_BENCHMARK_MODE, off",
    ),
]
MaxBodyBytes = Annotated[int, typer.Option(help="request body limit")]
ShedQueue = Annotated[
    float,
    typer.Option(
        min=0,
        help="429 for new sessions when every engine has this many requests waiting per "
        "slot; 0 = never shed",
    ),
]
LogLevel = Annotated[str, typer.Option(help="debug, info, warning or error")]


def gateway(
    engine: EngineUrls = None,
    engine_service: EngineService = None,
    engine_port: EnginePort = 8100,
    engines_file: EnginesFile = None,
    redis_url: Annotated[
        str | None, typer.Option(help="paused sessions + rate limits (default INTERLUDE_REDIS_URL)")
    ] = None,
    api_keys_file: Annotated[
        str | None, typer.Option(help="hashed API keys (`interlude keys create`)")
    ] = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="serve without API keys (one trusted machine)")
    ] = False,
    rate_limit: Annotated[
        str | None, typer.Option(help="per key, e.g. '600/minute'; '' = none")
    ] = None,
    default_tools: Annotated[
        str | None,
        typer.Option(
            help="server-side tools of keys without their own list: a,b; '*' all; '' none "
            "(default: none with keys, all with --no-auth)"
        ),
    ] = None,
    default_sessions: DefaultSessions = 0,
    default_tool_calls: DefaultToolCalls = 0,
    benchmark_mode: BenchmarkMode = None,
    max_body_bytes: MaxBodyBytes = 4 * 1024 * 1024,
    shed_queue: ShedQueue = 0.0,
    request_timeout: Annotated[float, typer.Option(help="s a leg may take")] = 600.0,
    upstream: Annotated[
        str | None,
        typer.Option(
            help="mux: each engine's requests over one WebSocket (api/mux.py); http: a "
            "connection each (default INTERLUDE_GATEWAY_UPSTREAM, mux)"
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="listen address")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="listen port")] = 8000,
    log_level: LogLevel = "info",
    introspection: Annotated[
        bool, typer.Option(help="serve /docs, /openapi.json and the engines' addresses on /ready")
    ] = False,
    metrics_port: Annotated[
        int,
        typer.Option(min=0, help="serve /metrics on this port, not the API's; 0 = the API's"),
    ] = 0,
) -> None:
    """Serve the OpenAI-compatible API in front of the engines."""
    import uvicorn

    from interlude.api.wire import SERVER_KEEP_ALIVE_S
    from interlude.gateway.app import make_app
    from interlude.gateway.config import GatewayConfig

    env = load_env()
    engines = tuple(engine or [u for u in env.gateway_engines.split(",") if u])
    try:
        config = GatewayConfig(
            engines=engines,
            engine_service=env.gateway_engine_service if engine_service is None else engine_service,
            engine_port=engine_port,
            engines_file=env.gateway_engines_file if engines_file is None else engines_file,
            redis_url=env.redis_url if redis_url is None else redis_url,
            auth=not no_auth,
            api_keys_file=env.api_keys_file if api_keys_file is None else api_keys_file,
            rate_limit=env.rate_limit if rate_limit is None else rate_limit,
            default_tools=default_tools,  # None: none with keys, all without
            default_sessions=default_sessions,
            default_tool_calls=default_tool_calls,
            benchmark_mode=env.benchmark_mode if benchmark_mode is None else benchmark_mode,
            max_body_bytes=max_body_bytes,
            shed_queue=shed_queue,
            gateway_token=env.gateway_token,
            request_timeout_s=request_timeout,
            upstream=env.gateway_upstream if upstream is None else upstream,
            otlp_endpoint=env.otlp_endpoint,
            introspection=introspection,
            metrics_port=metrics_port,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        make_app(config),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
    )


@keys.command("create")
def create(
    name: Annotated[str, typer.Argument(help="who the key is for")],
    file: Annotated[Path, typer.Option(help="keys file to append the hashed key to")],
    tools: Annotated[
        str | None,
        typer.Option(
            help="server-side tools it may run: a,b; '*' all; '' none (default: the gateway's)"
        ),
    ] = None,
    sessions: Annotated[
        int | None,
        typer.Option(
            min=0, help="its live sessions on each engine; 0 = no cap (default: the gateway's)"
        ),
    ] = None,
    tool_calls: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="its server-side tool calls in flight on each engine; 0 = no cap "
            "(default: the gateway's)",
        ),
    ] = None,
) -> None:
    """Make a key: its hash goes into FILE, the key itself is printed once."""
    from interlude.gateway.auth import create_key, parse_tools

    try:
        allowed = None if tools is None else parse_tools(tools)
        key, line = create_key(name, allowed, sessions, tool_calls)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    file.parent.mkdir(parents=True, exist_ok=True)
    with file.open("a") as f:
        f.write(line + "\n")
    file.chmod(0o600)
    typer.echo(key)
