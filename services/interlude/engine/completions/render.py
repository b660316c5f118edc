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


def usage(legs: Sequence[Leg]) -> dict[str, int]:
    """The request's usage: its prompt once, every choice's completion."""
    prompt = legs[0].usage[0]
    completion = sum(leg.usage[1] for leg in legs)
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


def completion(legs: Sequence[Leg], completion_id: str) -> dict[str, Any]:
    """The JSON answer: one choice per leg (`n`); the extension is the first choice's, plus
    every choice's session id when there are several."""
    ext = extension(legs[0], with_events=True)
    if len(legs) > 1:
        ext["session_ids"] = [leg.alias for leg in legs]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": legs[0].request.model,
        "choices": [_choice(leg) for leg in legs],
        "usage": usage(legs),
        "system_fingerprint": None,
        "interlude": ext,
    }


def _choice(leg: Leg) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": leg.content, "refusal": None}
    if leg.tool_calls:
        message["tool_calls"] = leg.tool_calls
        message["content"] = leg.content or None
    return {
        "index": leg.index,
        "message": message,
        "finish_reason": leg.finish_reason or "stop",
        "logprobs": logprobs(leg, leg.logprobs),
    }


class Chunks:
    """Builds the SSE chunks of one streamed completion (one id and `created` for all its
    choices; each choice's chunks carry its index)."""

    def __init__(self, legs: Sequence[Leg]) -> None:
        self.legs = legs
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.legs[0].request.model,
                "choices": choices,
                **extra,
            }
        )

    def delta(
        self,
        leg: Leg,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        entries: Sequence[TokenLogprob] | None = None,
    ) -> bytes:
        """A chunk of `delta`; `entries`: the logprobs of its text (None: no logprobs)."""
        lp = None if entries is None else logprobs(leg, entries)
        choice = {"index": leg.index, "delta": delta, "finish_reason": finish_reason}
        return self._chunk([choice | {"logprobs": lp}])

    def first(self, leg: Leg) -> bytes:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": leg.index, "delta": delta, "finish_reason": None, "logprobs": None}
        return self._chunk([choice], interlude=extension(leg, with_events=False))

    def tool_calls(self, leg: Leg) -> bytes:
        calls = [{"index": i, **c} for i, c in enumerate(leg.tool_calls)]
        return self.delta(leg, {"tool_calls": calls})

    def event(self, ev: Event) -> bytes:
        """A server-side tool call or result, as an extension chunk with no choices."""
        return self._chunk([], interlude={"event": ev.to_json()})

    def usage(self) -> bytes:
        return self._chunk([], usage=usage(self.legs))
