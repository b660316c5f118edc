"""One streamed chat completion against an OpenAI-compatible server, folded into an `Answer`.

Every request streams with `stream_options.include_usage`, so the first token's time is seen
and the generated tokens come from the server's `usage`. The SSE body is read to its end
(`interlude.api.wire.sse_data`), so the connection is kept for the next request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from interlude.api.wire import sse_data


class ServerError(RuntimeError):
    """The server answered an error (status and message) or broke the stream."""


@dataclass
class Answer:
    """One streamed chat completion, folded."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    route: str | None = None  # Interlude's `interlude.route`
    first_token: float | None = None


async def chat(
    http: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    on_first: Callable[[float], None] | None = None,
) -> Answer:
    """POST `body` to `url`/chat/completions as a stream; ServerError on any failure.
    `on_first(t)` is called at the first content token (a run cut mid-answer still has it)."""
    answer = Answer()
    calls: dict[int, dict[str, Any]] = {}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", url.rstrip("/") + "/chat/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            raise ServerError(f"HTTP {r.status_code}: {text[:300]}")
        async for data in sse_data(r.aiter_bytes()):
            chunk = json.loads(data)
            if "error" in chunk:
                raise ServerError(f"stream error: {json.dumps(chunk['error'])[:300]}")
            ext = chunk.get("interlude") or {}
            answer.route = ext.get("route", answer.route)
            if chunk.get("usage"):
                answer.completion_tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    if answer.first_token is None:
                        answer.first_token = time.monotonic()
                        if on_first is not None:
                            on_first(answer.first_token)
                    answer.content += delta["content"]
                for tc in delta.get("tool_calls") or ():
                    slot = calls.setdefault(int(tc.get("index", 0)), {"arguments": ""})
                    fn = tc.get("function") or {}
                    slot["id"] = tc.get("id") or slot.get("id")
                    slot["name"] = fn.get("name") or slot.get("name")
                    slot["arguments"] += fn.get("arguments") or ""
                answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
    answer.tool_calls = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": c["arguments"]},
        }
        for _, c in sorted(calls.items())
    ]
    if answer.completion_tokens is None:
        raise ServerError("the stream ended without usage")
    return answer
