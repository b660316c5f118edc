"""The gateway's FastAPI routes: models, probes and metrics (chat completions are served
before FastAPI, by `chat_route`)."""

# No `from __future__ import annotations`: FastAPI must see `Depends(guard)` (a local) at
# definition time, not as a string it would look up in the module.
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from interlude import telemetry
from interlude.api.openai import ChatCompletionRequest, ModelCard, ModelList, Unsupported
from interlude.gateway import metrics
from interlude.gateway.guard import Caller, Guard
from interlude.gateway.roster import EngineRoster, summary


def observe_pool(pool: EngineRoster) -> None:
    """Set the gauges read off the pool: engines by readiness, paused sessions by strategy."""
    states = list(pool.engines.values())
    metrics.ENGINES.labels("true").set(sum(e.ready for e in states))
    metrics.ENGINES.labels("false").set(sum(not e.ready for e in states))
    paused: dict[str, float] = {}
    for e in pool.ready():
        for strategy, n in (e.load.get("paused") or {}).items():
            paused[strategy] = paused.get(strategy, 0) + float(n)
    for strategy, n in paused.items():
        metrics.PAUSED.labels(strategy).set(n)


def make_router(
    pool: EngineRoster, guard: Guard, introspection: bool, metrics_route: bool = True
) -> APIRouter:
    """The routes but chat completions (`chat_route`); `introspection`: /ready names each
    engine's address and score; `metrics_route`: /metrics on this port (off when it has a
    port of its own)."""
    router = APIRouter()

    @router.get("/v1/models", response_model=ModelList)
    async def models(_: Annotated[Caller, Depends(guard)]) -> ModelList:
        now = int(time.time())
        return ModelList(data=[ModelCard(id=m, created=now) for m in pool.models()])

    @router.get("/v1/models/{model:path}", response_model=ModelCard)
    async def model(model: str, _: Annotated[Caller, Depends(guard)]) -> ModelCard:
        if model not in pool.models():
            raise Unsupported("model", f"the model {model!r} does not exist")
        return ModelCard(id=model, created=int(time.time()))

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/ready")
    async def ready() -> Response:
        engines = summary(list(pool.engines.values()), introspection)
        status = 200 if pool.ready() else 503
        return JSONResponse({"ready": status == 200, "engines": engines}, status_code=status)

    async def prometheus(request: Request) -> Response:
        observe_pool(pool)
        body, media_type = telemetry.exposition(request.headers.get("accept"))
        return Response(body, media_type=media_type)

    if metrics_route:
        router.add_api_route("/metrics", prometheus, methods=["GET"])
    return router


def chat_schemas() -> dict[str, Any]:
    """`ChatCompletionRequest` and the models it uses, as OpenAPI component schemas."""
    schema = ChatCompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {**defs, "ChatCompletionRequest": schema}


def chat_operation() -> dict[str, Any]:
    """The OpenAPI operation of `POST /v1/chat/completions`, which FastAPI does not serve and
    so would not list: its body is documented (the engine parses it); its answer is the
    engine's, relayed (JSON, or SSE when `stream` is true)."""
    return {
        "summary": "Chat Completions",
        "operationId": "chat_completions_v1_chat_completions_post",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}
                }
            },
        },
        "responses": {
            "200": {
                "description": "Successful Response",
                "content": {"application/json": {"schema": {}}},
            }
        },
    }
