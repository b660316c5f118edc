"""An engine stand-in for `bench gateway`: the engine's routes, answered at once.

A real engine on this 2-core CPU serves a few new sessions per second, so at 200 requests/s the
gateway would only measure the engine's queue. This process speaks the routes the gateway
uses (`/v1/load`, `/ready`, `POST /v1/chat/completions` answering one token at once) with no
model behind them, so the benchmark loads the gateway itself. It is a benchmark instrument
only; every functional test runs against real engines.

Run: `python -m interlude.bench.echo_engine PORT`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from fastapi import FastAPI, Request

app = FastAPI()
LOAD = {"engine_id": "echo", "model": "tiny", "ready": True, "kv_usage": 0.0, "waiting": 0}


@app.get("/v1/load")
async def load() -> dict[str, Any]:
    return LOAD


@app.get("/ready")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


@app.post("/v1/chat/completions")
async def chat(request: Request) -> dict[str, Any]:
    body = await request.json()
    return {
        "id": "chatcmpl-echo",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "tiny"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x", "refusal": None},
                "finish_reason": "length",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
