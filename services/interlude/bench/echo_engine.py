"""An engine stand-in for `bench gateway`: the engine's routes, answered at once.

A real engine on this 2-core CPU serves a few new sessions per second, so at 200 requests/s the
gateway would only measure the engine's queue. This process speaks the routes the gateway
uses (`/v1/load`, `/ready`, `POST /v1/chat/completions` and the link `WS /v1/mux` that carries
it) with no model behind them, so the benchmark loads the gateway itself. A request answers
`max_tokens` tokens: at once as JSON, or, with `stream`, as SSE chunks one decode step
(`STEP_S`) apart, as an engine streams them. It is a benchmark instrument only; every
functional test runs against real engines.

Run: `python -m interlude.bench.echo_engine PORT`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from interlude.engine.mux import mux_router

app = FastAPI()
app.include_router(mux_router(""))  # the gateway's link, as a real engine serves it
LOAD = {"engine_id": "echo", "model": "tiny", "ready": True, "kv_usage": 0.0, "waiting": 0}
STEP_S = 0.005  # between streamed tokens: a decode step of a small model on a GPU
SSE = "text/event-stream"


@app.get("/v1/load")
async def load() -> dict[str, Any]:
    return LOAD


@app.get("/ready")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


@app.post("/v1/chat/completions", response_model=None)
async def chat(request: Request) -> dict[str, Any] | Response:
    body = await request.json()
    tokens = int(body.get("max_tokens") or 1)
    if body.get("stream"):
        return StreamingResponse(_chunks(body.get("model", "tiny"), tokens), 200, None, SSE)
    return {
        "id": "chatcmpl-echo",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "tiny"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * tokens, "refusal": None},
                "finish_reason": "length",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens},
    }


async def _chunks(model: str, tokens: int) -> AsyncIterator[bytes]:
    """`tokens` chat.completion.chunk frames, `STEP_S` apart, then `[DONE]`."""
    for i in range(tokens):
        delta = {"content": "x"} if i else {"role": "assistant", "content": "x"}
        frame = {
            "id": "chatcmpl-echo",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}],
        }
        yield b"data: " + json.dumps(frame).encode() + b"\n\n"
        await asyncio.sleep(STEP_S)
    yield b"data: [DONE]\n\n"


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
