"""The engine process's HTTP service (`interlude engine`): router and start-up.

Routes (all errors in the OpenAI envelope, `interlude.api.wire.error_body`):

* ``POST /v1/chat/completions``: OpenAI's chat completions, streaming or not, with tools;
  a conversation that answers the calls of a session paused here resumes it
  (`engine/completions/`). What users and the gateway call.
* ``WS /v1/mux``: the gateway's multiplexed link (`engine/mux.py`): many requests over one
  WebSocket, each served by these same routes, their answers' frames sent together.
* ``POST /v1/sessions``: start a chat session; streams its first leg as SSE events.
* ``POST /v1/sessions/{id}/resume``: post the client's tool results; streams the next leg.
  Either takes a `script` only in benchmark mode (`ChatConfig.benchmark_mode`), as the chat
  route takes `interlude_script`.
* ``DELETE /v1/sessions/{id}``: cancel (the request is aborted and its KV freed).
* ``GET /v1/sessions/{id}``: a live session's state. The four session routes
  (`engine/session_api.py`) answer 403 to a caller without the gateway token, when one is set.
* ``POST /v1/prefill``: engine to engine, prefill tokens and keep their KV for a decode engine
  on this host (`engine/prefill.py`); 403 without the gateway token (when one is set), 409 on
  an engine started without the host link (`--kv-link`).
* ``PUT /v1/role``: ``{"role": "mixed" | "prefill" | "decode"}``, the role `/v1/load` reports
  and the gateway routes by (a flip; no restart); 403 without the gateway token, 400 for a
  prefill or decode role on an engine without the host link.
* ``GET /health``: the process answers (200) unless the engine died (503).
* ``GET /ready``: 200 once the engine is up, whether or not its tool bus is reachable;
  ``{"status": "ready", "engine_id", "server_tools": [names the workers publish], "tool_bus":
  "connected" | "disconnected" | "none"}``.
* ``GET /metrics``: Prometheus text: vLLM's ``vllm:*`` and our ``interlude:*``.
* ``GET /v1/load``: JSON the gateway routes on, cheap (`engine/load.py`): ``engine_id``,
  ``model``, ``ready``, ``max_model_len``, ``kv_usage`` (0..1), ``waiting``, ``running``,
  ``max_num_seqs``, ``sessions`` by state, ``paused`` and ``resumes`` by strategy,
  ``contended_waste`` (recent rate, 0..1 of the pool), ``role``, ``queued_prefill_tokens``, and
  totals ``resumed_context_tokens``,
  ``recompute_tokens`` (and ``recompute_tokens_by_reason``), ``waste_gb_s``,
  ``waste_contended_gb_s``.

A session route's SSE frame is ``data: <event JSON>`` (`interlude.api.events`) and a blank
line; a leg ends with ``data: [DONE]``.
The engine starts in a thread after the server is up, so probes answer during the ~20 s load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from interlude import telemetry
from interlude.api.engine import ENGINE_ROLES, RoleBody, from_gateway
from interlude.api.load import RecentRate
from interlude.api.names import engine_tag
from interlude.engine.chat import ChatRunner
from interlude.engine.completions.routes import chat_router
from interlude.engine.completions.service import ChatConfig, ChatService
from interlude.engine.config import EngineConfig
from interlude.engine.http_errors import Unavailable, error_response, install_error_handlers
from interlude.engine.load import load_report
from interlude.engine.metrics import ROLE, ROLE_CHANGES, SESSIONS
from interlude.engine.mux import mux_router
from interlude.engine.prefill import PrefillClient, prefill_router
from interlude.engine.request import RequestError
from interlude.engine.session_api import Forbidden, session_router
from interlude.engine.sessions import SessionManager
from interlude.engine.toolcalls import TOOL_PARSERS, ToolCallCodec
from interlude.engine.tools import ServerTools

log = logging.getLogger(__name__)


def role_problem(role: str, engine: EngineConfig) -> str | None:
    """Why `engine` cannot take `role` (None: it can): a prefill or decode engine hands KV over,
    so it needs the KV link."""
    if role != "mixed" and not engine.kv_link:
        return f"role {role!r} needs the KV link (--kv-link, EngineConfig.kv_link)"
    return None


@dataclass(frozen=True)
class ServiceConfig:
    """One engine process: the engine, its tool parser, the bus and the deadlines."""

    engine: EngineConfig
    tool_parser: str = "hermes"
    redis_url: str = ""  # the tool bus; empty = no server-side tools (all calls go to clients)
    engine_id: str = ""  # empty = host name and process id (`interlude engine` passes a stable one)
    tool_deadline_s: float = 300.0  # a server-side call is answered "timeout" after this
    client_deadline_s: float = 300.0  # a client-paused session fails after this
    otlp_endpoint: str = ""
    served_model_name: str = ""  # the model's name in the API; empty = the model dir's name
    # The gateway's shared secret (`api.engine.tenant_of`); "" = trust the tenant header.
    gateway_token: str = ""
    chat: ChatConfig = field(default_factory=ChatConfig)  # what a chat completion may ask
    role: str = "mixed"  # at start (`api.engine.ENGINE_ROLES`); `PUT /v1/role` changes it

    def __post_init__(self) -> None:
        if self.role not in ENGINE_ROLES:
            raise ValueError(f"role must be one of {ENGINE_ROLES}, got {self.role!r}")
        if (problem := role_problem(self.role, self.engine)) is not None:
            raise ValueError(problem)
        if self.tool_parser not in TOOL_PARSERS:
            raise ValueError(f"tool_parser must be one of {TOOL_PARSERS}, got {self.tool_parser!r}")
        if self.tool_deadline_s <= 0 or self.client_deadline_s <= 0:
            raise ValueError("tool_deadline_s and client_deadline_s must be > 0")

    @property
    def model_name(self) -> str:
        return self.served_model_name or os.path.basename(self.engine.model.rstrip("/"))

    @property
    def resolved_engine_id(self) -> str:
        return self.engine_id or f"{socket.gethostname()}-{os.getpid()}"


class Service:
    """The engine, its sessions and the bus, once started (`ready`)."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.engine: Any = None
        self.sessions: SessionManager | None = None
        self.tools: ServerTools | None = None
        self.chat: ChatService | None = None
        self.error: BaseException | None = None
        self.role = config.role
        self.prefill = (
            PrefillClient(config.gateway_token, config.chat.remote_prefill_min_tokens)
            if config.engine.kv_link
            else None
        )

    async def start(self) -> None:
        from interlude.engine.vllm_engine import VllmEngine

        try:
            self.engine = await asyncio.to_thread(VllmEngine, self.config.engine)
            if self.config.redis_url:
                from interlude.bus.engine_side import EngineBus

                self.tools = ServerTools(
                    EngineBus(self.config.redis_url, self.config.resolved_engine_id)
                )
                await self.tools.start()
            codec = ToolCallCodec(
                self.engine.llm.get_tokenizer(),
                self.config.tool_parser,
                call_tag=engine_tag(self.config.resolved_engine_id),
            )
            runner = ChatRunner(
                self.engine.llm,
                codec,
                self.engine.llm.model_config.max_model_len,
                server=self.tools,
                tool_deadline_s=self.config.tool_deadline_s,
                client_deadline_s=self.config.client_deadline_s,
                turn_starts=self.engine.turn_start,
                prefill=self.prefill,
            )
            self.sessions = SessionManager(runner)
            self.chat = ChatService(self.config.chat, self.sessions, self.config.model_name)
            log.info("engine %s ready", self.config.resolved_engine_id)
        except Exception as exc:  # reported by /health and /ready; the process stays up to say so
            log.exception("engine start failed")
            self.error = exc

    @property
    def ready(self) -> bool:
        """Serving: the engine is up. The tool bus is not part of it (server-side calls made
        while it is away wait for it, or time out into a result the model sees)."""
        return self.sessions is not None and not self.engine.llm.errored

    @property
    def bus_state(self) -> str:
        if self.tools is None:
            return "none"
        return "connected" if self.tools.connected else "disconnected"

    async def stop(self) -> None:
        if self.sessions is not None:
            await self.sessions.close()
        if self.tools is not None:
            await self.tools.close()
        if self.prefill is not None:
            await self.prefill.close()
        if self.engine is not None:
            self.engine.shutdown()


def _router(service: Service) -> APIRouter:
    """All the engine's routes: chat completions, sessions and prefill (each failing with
    Unavailable until the engine is ready), then the control and probe routes."""
    router = APIRouter()

    def sessions() -> SessionManager:
        if service.sessions is None or not service.ready:
            raise Unavailable(
                "the engine is not ready" + (f": {service.error}" if service.error else "")
            )
        return service.sessions

    def chat() -> ChatService:
        sessions()  # ready, or Unavailable
        assert service.chat is not None
        return service.chat

    router.include_router(chat_router(chat, service.config.gateway_token))
    router.include_router(mux_router(service.config.gateway_token))

    router.include_router(
        session_router(sessions, service.config.gateway_token, service.config.chat.benchmark_mode)
    )

    def llm() -> Any:
        sessions()  # ready, or Unavailable
        return service.engine.llm

    router.include_router(prefill_router(llm, service.config.gateway_token))
    router.include_router(_control_router(service))
    router.include_router(_probe_router(service))
    return router


def _control_router(service: Service) -> APIRouter:
    """The routes the gateway and the operator steer by: `GET /v1/load` (it keeps the recent
    contended-waste and busy rates between calls) and `PUT /v1/role` (changes `service.role`,
    logs and counts a change)."""
    router = APIRouter()
    contended, busy = RecentRate(), RecentRate()

    @router.get("/v1/load")
    async def load() -> dict[str, Any]:
        engine = service.engine
        return load_report(
            engine.stats() if engine is not None else {},
            contended,
            busy,
            engine_id=service.config.resolved_engine_id,
            model=service.config.model_name,
            ready=service.ready,
            max_model_len=engine.llm.model_config.max_model_len if engine is not None else 0,
            max_num_seqs=(
                engine.llm.vllm_config.scheduler_config.max_num_seqs if engine is not None else 0
            ),
            sessions=service.sessions.states() if service.sessions else {},
            role=service.role,
        )

    @router.put("/v1/role")
    async def set_role(body: RoleBody, request: Request) -> dict[str, str]:
        if not from_gateway(request.headers, service.config.gateway_token):
            raise Forbidden("/v1/role takes only callers with the gateway token")
        if (problem := role_problem(body.role, service.config.engine)) is not None:
            raise RequestError(problem, "role")
        if body.role != service.role:
            log.info("role %s -> %s", service.role, body.role)
            ROLE_CHANGES.labels(body.role).inc()
        service.role = body.role
        return {"role": service.role}

    return router


def _probe_router(service: Service) -> APIRouter:
    """`GET /health`, `GET /ready` and `GET /metrics` (which mirrors the scheduler's counters
    and sets the session and role gauges before it writes the exposition)."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        dead = service.error is not None or (
            service.engine is not None and service.engine.llm.errored
        )
        if dead:
            return error_response(
                503, f"engine failed: {service.error or 'engine core died'}", "unavailable"
            )
        return JSONResponse({"status": "ok"})

    @router.get("/ready")
    async def ready() -> Response:
        if not service.ready:
            return error_response(503, "engine starting", "unavailable")
        # The tools this engine runs server-side now: the ones the deployment's workers publish.
        tools = sorted(await service.tools.published.names()) if service.tools else []
        return JSONResponse(
            {
                "status": "ready",
                "engine_id": service.config.resolved_engine_id,
                "server_tools": tools,
                "tool_bus": service.bus_state,
            }
        )

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        if service.engine is not None:
            service.engine.mirror_metrics()
        SESSIONS.clear()
        for name, n in (service.sessions.states() if service.sessions else {}).items():
            SESSIONS.labels(name).set(n)
        for role in ENGINE_ROLES:  # a dashboard plots the roles over time from this
            ROLE.labels(role).set(1 if role == service.role else 0)
        body, media_type = telemetry.exposition(request.headers.get("accept"))
        return Response(body, media_type=media_type)

    return router


def make_app(config: ServiceConfig, service: Service | None = None) -> FastAPI:
    """The ASGI app; the engine starts in the background when the app starts."""
    service = service or Service(config)
    telemetry.setup_tracing("interlude-engine", config.otlp_endpoint)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        starting = asyncio.create_task(service.start())
        yield
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await service.stop()

    app = FastAPI(title="Interlude engine", lifespan=lifespan)
    app.state.service = service
    app.include_router(_router(service))

    install_error_handlers(app, log)
    return app
