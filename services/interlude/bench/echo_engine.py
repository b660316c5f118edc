"""An engine stand-in for `bench gateway`: the engine's internal API, answered at once.

A real engine on this 2-core CPU serves a few new sessions per second, so at 200 requests/s the
gateway would only measure the engine's queue. This process speaks the same routes
(`/v1/load`, `/ready`, `POST /v1/sessions` streaming one `text` event and `done`, `DELETE`)
with no model behind them, so the benchmark loads the gateway itself. It is a benchmark
instrument only; every functional test runs against real engines.

Run: `python -m interlude.bench.echo_engine PORT`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

app = FastAPI()
LOAD = {"engine_id": "echo", "model": "tiny", "ready": True, "kv_usage": 0.0, "waiting": 0}


@app.get("/v1/load")
async def load() -> dict[str, Any]:
    return LOAD


@app.get("/ready")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


@app.post("/v1/sessions")
async def submit(request: Request) -> StreamingResponse:
    body = await request.json()
    sid = body.get("session_id") or "echo"

    async def frames() -> AsyncIterator[bytes]:
        yield b'data: {"type":"text","text":"x","tokens":1}\n\n'
        done = {
            "type": "done", "session_id": sid, "finish_reason": "length", "prompt_tokens": 8,
            "completion_tokens": 1, "tool_tokens": 0, "tool_calls": 0, "turns": 1,
        }  # fmt: skip
        yield f"data: {json.dumps(done)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream")


@app.delete("/v1/sessions/{session_id}")
async def cancel(session_id: str) -> dict[str, Any]:
    return {"id": session_id, "cancelled": True}


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
