"""The engine's session API (`/v1/sessions`): start a session, resume it with tool results,
read its state, cancel it, by id. What benchmarks and tests drive, below the OpenAI route; its
events stream as SSE, one `interlude.api.events` event a frame.

Sessions are named by id alone here, whoever started them: with a gateway token configured,
only callers carrying it may use these routes (403 otherwise), and scripted calls need
benchmark mode.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from interlude.api.engine import GATEWAY_TOKEN_HEADER, ResumeBody, SubmitBody, from_gateway
from interlude.api.events import Event
from interlude.api.openai import benchmark_only
from interlude.api.script import parse_script
from interlude.api.wire import SSE_DONE, sse
from interlude.engine.request import ChatRequest
from interlude.engine.sessions import SessionManager


class Forbidden(RuntimeError):
    """The caller may not use this route (HTTP 403)."""


def _stream(leg: AsyncIterator[Event]) -> StreamingResponse:
    async def frames() -> AsyncIterator[bytes]:
        async for ev in leg:
            yield sse(ev.to_json())
        yield SSE_DONE

    return StreamingResponse(frames(), media_type="text/event-stream")


def _chat_request(body: SubmitBody, request: Request) -> ChatRequest:
    """The session a submit asks for (RequestError naming a bad field)."""
    return ChatRequest(
        session_id=body.session_id or f"sess-{uuid.uuid4().hex}",
        messages=tuple(body.messages),
        tools=tuple(body.tools),
        tool_choice=body.choice(),
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        max_tool_calls=body.max_tool_calls,
        kind=body.kind,
        script=None
        if body.script is None
        else parse_script(body.script, body.tools, body.max_tokens),
        trace={k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")},
    )


def session_router(
    sessions: Callable[[], SessionManager], gateway_token: str, benchmark_mode: bool
) -> APIRouter:
    """The routes; `sessions()` is the ready engine's manager (or raises its 503)."""
    router = APIRouter()

    def scripts_allowed(script: Any) -> None:
        if script is not None and not benchmark_mode:
            raise benchmark_only("script", "engine")

    def trusted(request: Request) -> None:
        """The session API names sessions by id alone, whoever started them: with a gateway
        token configured, only callers carrying it (the deployment's own) may use it."""
        if not from_gateway(request.headers, gateway_token):
            raise Forbidden(
                "the session API takes only callers with the gateway token "
                f"({GATEWAY_TOKEN_HEADER}); use /v1/chat/completions through the gateway"
            )

    @router.post("/v1/sessions", dependencies=[Depends(trusted)])
    async def submit(body: SubmitBody, request: Request) -> Response:
        scripts_allowed(body.script)
        manager = sessions()
        return _stream(manager.submit(_chat_request(body, request)))

    @router.post("/v1/sessions/{session_id}/resume", dependencies=[Depends(trusted)])
    async def resume(session_id: str, body: ResumeBody) -> Response:
        scripts_allowed(body.script)
        results = [r.model_dump() for r in body.results]
        return _stream(
            sessions().resume(session_id, results, body.max_tokens, body.script, body.tool_choice)
        )

    @router.delete("/v1/sessions/{session_id}", dependencies=[Depends(trusted)])
    async def cancel(session_id: str) -> dict[str, Any]:
        await sessions().cancel(session_id)
        return {"id": session_id, "cancelled": True}

    @router.get("/v1/sessions/{session_id}", dependencies=[Depends(trusted)])
    async def state(session_id: str) -> dict[str, Any]:
        live = sessions().get(session_id)
        state = live.state.name.lower()
        return {
            "id": session_id,
            "state": state,
            "awaiting": live.awaiting,
            "kind": live.request.kind,
        }

    return router
