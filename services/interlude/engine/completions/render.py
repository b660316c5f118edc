"""A leg as OpenAI's wire format: one `chat.completion`, or `chat.completion.chunk` SSE frames.

Both carry an `interlude` extension object (which clients ignore unless they look): the session
id to send back as `x-session-id`, the route the request took, and, in the JSON answer, the
server-side tool calls and results that ran inside the request. With
`stream_options.include_tool_events` those also stream as extension chunks with no `choices`
(a shape OpenAI's own usage chunk already has, so clients skip them).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from interlude.api.events import Event, TokenLogprob
from interlude.api.wire import SSE_DONE, error_body, sse
from interlude.engine.completions.leg import Leg

__all__ = ["SSE_DONE", "Chunks", "completion", "error_body", "sse"]


def usage(leg: Leg) -> dict[str, int]:
    prompt, completion = leg.usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def logprobs(leg: Leg, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
    """OpenAI's `choices[].logprobs`, the request's `top_logprobs` per token (None: not asked)."""
    if not leg.request.logprobs:
        return None
    k = leg.request.top_logprobs or 0
    return {
        "content": [
            {
                **_token(e.token, e.logprob),
                "top_logprobs": [_token(t, lp) for t, lp in e.top[:k]],
            }
            for e in entries
        ],
        "refusal": None,
    }


def _token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def extension(leg: Leg, with_events: bool) -> dict[str, Any]:
    ext: dict[str, Any] = {"session_id": leg.alias, "route": leg.route}
    if with_events:
        ext["server_tool_events"] = [ev.to_json() for ev in leg.server_events]
    return ext


def completion(leg: Leg, completion_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": leg.content, "refusal": None}
    if leg.tool_calls:
        message["tool_calls"] = leg.tool_calls
        message["content"] = leg.content or None
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": leg.request.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": leg.finish_reason or "stop",
                "logprobs": logprobs(leg, leg.logprobs),
            }
        ],
        "usage": usage(leg),
        "system_fingerprint": None,
        "interlude": extension(leg, with_events=True),
    }


class Chunks:
    """Builds the SSE chunks of one streamed completion (one id and `created` for all)."""

    def __init__(self, leg: Leg) -> None:
        self.leg = leg
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.leg.request.model,
                "choices": choices,
                **extra,
            }
        )

    def delta(
        self,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        entries: Sequence[TokenLogprob] | None = None,
    ) -> bytes:
        """A chunk of `delta`; `entries`: the logprobs of its text (None: no logprobs)."""
        lp = None if entries is None else logprobs(self.leg, entries)
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": lp}
        return self._chunk([choice])

    def first(self) -> bytes:
        return self._chunk(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "finish_reason": None,
                    "logprobs": None,
                }
            ],
            interlude=extension(self.leg, with_events=False),
        )

    def tool_calls(self) -> bytes:
        calls = [{"index": i, **c} for i, c in enumerate(self.leg.tool_calls)]
        return self.delta({"tool_calls": calls})

    def event(self, ev: Event) -> bytes:
        """A server-side tool call or result, as an extension chunk with no choices."""
        return self._chunk([], interlude={"event": ev.to_json()})

    def usage(self) -> bytes:
        return self._chunk([], usage=usage(self.leg))
