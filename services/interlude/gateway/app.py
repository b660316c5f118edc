"""The gateway's ASGI app: wiring, the one error envelope, body limits and request logs.

Every error answers OpenAI's envelope ``{"error": {"message", "type", "param", "code"}}``:
400 for a request we cannot serve (the parameter is named), 401/429 from the guard, 404 for an
unknown model, 413 for a body over the limit, 503 when no engine can answer, 500 (with an id
to find in the log, never internals) for our own bugs. Everything about the request past its
model (a bad field, a failed session) the engine answers, in the same envelope, relayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from interlude import telemetry
from interlude.api.engine import Caps
from interlude.api.wire import error_body
from interlude.gateway.asgi import BodyTooLarge, ClientLeft, header_map, log_request
from interlude.gateway.asgi import read_body as read_whole_body
from interlude.gateway.auth import KeyStore, parse_tools
from interlude.gateway.chat_route import PATH as CHAT_PATH
from interlude.gateway.chat_route import ChatRoute, Front
from interlude.gateway.config import GatewayConfig
from interlude.gateway.guard import Guard
from interlude.gateway.mux import MuxUpstream
from interlude.gateway.ratelimit import RateLimiter
from interlude.gateway.refusals import REFUSED, refusal_of
from interlude.gateway.relay import Relay
from interlude.gateway.roster import Discovery, EngineRoster, discover
from interlude.gateway.routes import chat_operation, chat_schemas, make_router, observe_pool
from interlude.gateway.upstream import Upstream

log = logging.getLogger("interlude.gateway")


def _error(status: int, message: str, type_: str, param: str | None = None, **kw: Any) -> Response:
    headers = kw.pop("headers", None)
    return JSONResponse(error_body(message, type_, param, **kw), status, headers=headers)


def make_app(config: GatewayConfig, discovery: Discovery | None = None) -> Front:
    """The gateway app: chat completions on a bare route (`chat_route`), the rest on FastAPI;
    engines are polled and stores opened when it starts (FastAPI's lifespan)."""
    telemetry.setup_tracing("interlude-gateway", config.otlp_endpoint)
    upstream = (
        MuxUpstream(config.connect_timeout_s, config.request_timeout_s, config.gateway_token)
        if config.upstream == "mux"
        else Upstream(config.connect_timeout_s, config.request_timeout_s)
    )
    pool = EngineRoster(
        discovery
        or discover(config.engines, config.engine_service, config.engine_port, config.engines_file),
        upstream,
        config.health_interval_s,
        config.health_failures,
    )
    keys = KeyStore(config.api_keys_file) if config.auth else None
    limiter = RateLimiter(config.rate_limit, config.redis_url) if config.rate_limit else None
    relay = Relay(pool, upstream, config.gateway_token, config.benchmark_mode, config.shed_queue)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        await pool.wait_polled(config.health_interval_s + 1.0)
        async with _metrics_port(config, pool):
            yield
        await pool.close()
        await upstream.close()
        if limiter is not None:
            await limiter.close()

    hidden = not config.introspection
    app = FastAPI(
        title="Interlude gateway",
        version="0.1.0",
        description="OpenAI-compatible chat completions with paused tool-calling sessions.",
        lifespan=lifespan,
        docs_url=None if hidden else "/docs",
        redoc_url=None if hidden else "/redoc",
        openapi_url=None if hidden else "/openapi.json",
    )
    app.state.pool = pool
    caps = Caps(config.default_sessions, config.default_tool_calls)
    guard = Guard(
        keys, limiter, default_tools=parse_tools(config.tools_by_default), default_caps=caps
    )
    routes = make_router(pool, guard, config.introspection, not config.metrics_port)
    app.include_router(routes)
    _document_chat_body(app)
    _handlers(app)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    # No spans per ASGI message: they cost more than the request's own work here.
    FastAPIInstrumentor.instrument_app(
        app, excluded_urls="health,ready,metrics", exclude_spans=["receive", "send"]
    )
    return Front(app, ChatRoute(relay, guard, config.max_body_bytes))


@contextlib.asynccontextmanager
async def _metrics_port(config: GatewayConfig, pool: EngineRoster) -> AsyncIterator[None]:
    """With `metrics_port`, /metrics there (a thread) and the pool's gauges kept fresh from
    the event loop, which owns the pool, as each poll of the engines lands."""
    if not config.metrics_port:
        yield
        return
    server = telemetry.serve_metrics(config.metrics_port)

    async def refresh() -> None:
        while True:
            observe_pool(pool)
            await asyncio.sleep(config.health_interval_s)

    task = asyncio.create_task(refresh())
    try:
        yield
    finally:
        task.cancel()
        server.shutdown()
        server.server_close()


def _document_chat_body(app: FastAPI) -> None:
    """Put the chat route and its request's schema in `/openapi.json`: FastAPI does not serve
    the route, and the gateway does not parse the body (the engine does)."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = plain()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(chat_schemas())
            schema.setdefault("paths", {})[CHAT_PATH] = {"post": chat_operation()}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _handlers(app: FastAPI) -> None:
    def invalid(_: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        first = errors[0] if errors else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
        message = f"{where or 'body'}: {first.get('msg', 'invalid request')}"
        return _error(400, message, "invalid_request_error", where)

    def refused(_: Request, exc: Exception) -> Response:
        r = refusal_of(exc)
        return JSONResponse(r.body(), r.status, headers=r.headers or None)

    def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, str(exc.detail), "invalid_request_error")

    def crashed(_: Request, exc: Exception) -> Response:
        ref = uuid.uuid4().hex[:12]
        log.error("internal error %s", ref, exc_info=exc)
        return _error(500, f"internal error {ref}; see the gateway log", "server_error")

    for exc_type, handler in (
        (RequestValidationError, invalid),
        *((exc_type, refused) for exc_type in REFUSED),
        (HTTPException, http_error),
        (Exception, crashed),
    ):
        app.add_exception_handler(exc_type, handler)


class BodyLimit:
    """Refuses a request body over `max_bytes` with a 413, before the app parses it, and logs
    each request (a plain ASGI middleware: Starlette's BaseHTTPMiddleware costs ~0.3 ms).

    The body is read here (the app reads JSON bodies whole anyway) and handed on in one piece;
    later messages (the client's disconnect) pass through untouched.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # The request's start, for the gateway's own time in `server-timing` (`routes.py`).
        started = time.perf_counter()
        scope.setdefault("state", {})["started"] = started
        status = 500

        async def logged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._limited(scope, receive, logged)
        finally:
            log_request(scope["method"], scope["path"], status, started)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] in ("GET", "HEAD", "DELETE"):
            return await self.app(scope, receive, send)
        try:
            body = await read_whole_body(receive, header_map(scope), self.max_bytes)
        except BodyTooLarge:
            return await self._refuse(scope, receive, send)
        except ClientLeft:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = _error(413, f"request body over {self.max_bytes} bytes", "invalid_request_error")
        await response(scope, receive, send)
