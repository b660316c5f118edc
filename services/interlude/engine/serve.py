"""`interlude engine`: the service config from flags and `INTERLUDE_*` (`service_config`), and
uvicorn serving it (`serve`)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from interlude.env import load_env

if TYPE_CHECKING:  # it imports vLLM, which waits until the command runs
    from interlude.engine.server import ServiceConfig


def stable_engine_id(port: int) -> str:
    """The engine's name on the tool bus when none is given: the same after a restart, so the
    restarted engine reads the results that arrived for it meanwhile (a process id would
    orphan them). In Kubernetes the host name is the pod's name (the chart also sets
    INTERLUDE_ENGINE_ID to it); the port tells engines on one host apart."""
    return f"{socket.gethostname()}-{port}"


def service_config(
    *,
    model: str,
    policy: str | None,
    profile: str,
    blocks: int | None,
    host_blocks: int,
    settings: Mapping[str, Any],
    tool_parser: str,
    port: int,
    redis_url: str | None,
    engine_id: str | None,
    client_deadline_s: float,
    served_model_name: str = "",
    max_tokens: int = 8192,
    max_messages: int = 1024,
    benchmark_mode: bool | None = None,
    remote_prefill_min_tokens: int = 64,
    role: str = "mixed",
) -> ServiceConfig:
    """The engine's config from its flags; flags win over the environment (`INTERLUDE_*`).
    `model="tiny"` builds the tiny random-weight model first (offline, cached). `settings` are
    `EngineConfig` fields (vLLM's batch, context, dtype and GPU settings); a bad one is a
    ValueError. `benchmark_mode` None: INTERLUDE_BENCHMARK_MODE's."""
    from interlude.engine.completions.service import ChatConfig
    from interlude.engine.config import EngineConfig, prepare_process_env
    from interlude.engine.server import ServiceConfig
    from interlude.engine.tiny_model import build_tiny_model

    env = load_env()
    prepare_process_env()
    if model == "tiny":
        model = str(build_tiny_model())
    return ServiceConfig(
        engine=EngineConfig(
            model=model,
            policy=policy,
            profile=profile,
            num_gpu_blocks=blocks,
            host_blocks=host_blocks if policy else 0,
            **settings,
        ),
        tool_parser=tool_parser,
        redis_url=env.redis_url if redis_url is None else redis_url,
        engine_id=engine_id or env.engine_id or stable_engine_id(port),
        tool_deadline_s=env.tool_deadline_s,
        client_deadline_s=client_deadline_s,
        otlp_endpoint=env.otlp_endpoint,
        served_model_name=served_model_name,
        gateway_token=env.gateway_token,
        role=role,
        chat=ChatConfig(
            max_messages=max_messages,
            max_tokens=max_tokens,
            default_max_tokens=min(512, max_tokens),
            client_deadline_s=client_deadline_s,
            benchmark_mode=env.benchmark_mode if benchmark_mode is None else benchmark_mode,
            remote_prefill_min_tokens=remote_prefill_min_tokens,
        ),
    )


def serve(config: ServiceConfig, host: str, port: int) -> None:
    """Serve the engine on `host:port` until interrupted."""
    import uvicorn

    from interlude.api.wire import SERVER_KEEP_ALIVE_S
    from interlude.engine.server import make_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        make_app(config),
        host=host,
        port=port,
        log_level="info",
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
    )
