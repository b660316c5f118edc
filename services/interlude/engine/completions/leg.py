"""One leg of a chat completion being read: the session's events folded into what the OpenAI
response needs (text past the stop scanner, the client's tool calls, server-side tool events,
usage), typed events in, no parsing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from interlude import telemetry
from interlude.api.events import (
    Done,
    Event,
    Failed,
    Paused,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
    ToolResultEvent,
    TurnStart,
)
from interlude.api.openai import ChatCompletionRequest
from interlude.engine.completions import metrics
from interlude.engine.completions.stops import StopScanner


@dataclass
class Leg:
    """One engine leg being read for one request (mutable: filled by `fold`)."""

    request: ChatCompletionRequest
    tenant: str
    session_id: str
    alias: str  # the id the client may send back as `x-session-id`
    route: str  # "new", "resume" or "fallback"
    events: AsyncIterator[Event]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    index: int = 0  # which choice of the request (`n`)
    siblings: tuple[str, ...] = ()  # the sessions of the request's other choices
    base: tuple[int, int, int] = (0, 0, 0)  # session counters before this leg
    started: float = field(default_factory=time.monotonic)
    open_s: float = 0.0  # finding the session and starting the leg (for `server-timing`)
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    server_events: list[ToolCallEvent | ToolResultEvent] = field(default_factory=list)
    finish_reason: str | None = None
    usage: tuple[int, int] = (0, 0)  # prompt, completion tokens of this leg
    first_token_at: float | None = None
    error: Failed | None = None
    stops: StopScanner = field(default_factory=lambda: StopScanner(()))
    totals: tuple[int, int, int] = (0, 0, 0)  # session counters after this leg
    deadline_s: float = 0.0  # how long the engine keeps a session paused for its client
    _generated: int = 0
    client_call_ids: set[str] = field(default_factory=set)  # calls the client answers
    session_logprobs: int | None = None  # alternatives per token the session samples
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the text, when asked
    last_logprobs: tuple[TokenLogprob, ...] = ()  # of the text `fold` returned last
    turn_start: TurnStart | None = None  # how this leg's resumed turn started, if reported

    def fold(self, ev: Event) -> str:
        """Take one engine event; returns the text the client may see now ("" if none)."""
        self.last_logprobs = ()
        match ev:
            case TextDelta():
                return self._text(ev)
            case ToolCallEvent(side="client"):
                self.client_call_ids.add(ev.call_id)
                self.tool_calls.append(
                    {
                        "id": ev.call_id,
                        "type": "function",
                        "function": {"name": ev.name, "arguments": ev.arguments},
                    }
                )
            case ToolCallEvent():
                self.server_events.append(ev)
            case TurnStart() if self.turn_start is None:
                self.turn_start = ev  # the leg's first turn: the one the client resumed
            case ToolResultEvent() if ev.call_id not in self.client_call_ids:
                # A resumed leg starts with the client's own results: not server events.
                self.server_events.append(ev)
            case Paused():
                self.finish_reason = "tool_calls"
                self.deadline_s = ev.deadline_s
                self._count(ev.prompt_tokens, ev.completion_tokens, ev.tool_tokens)
            case Done():
                self.finish_reason = "length" if ev.finish_reason == "length" else "stop"
                self._count(ev.prompt_tokens, ev.completion_tokens, ev.tool_tokens)
            case Failed():
                self.error = ev
        return ""

    def _text(self, ev: TextDelta) -> str:
        self._generated += ev.tokens
        if self.request.logprobs:
            self.last_logprobs = ev.logprobs
            self.logprobs += ev.logprobs
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
            ttft = self.first_token_at - self.started
            metrics.TTFT.observe(ttft, exemplar=telemetry.exemplar())
        shown = self.stops.feed(ev.text)
        self.content += shown
        if self.stops.stopped:
            self.finish_reason = "stop"
        return shown

    def flush(self) -> str:
        """Text held back by the stop scanner, once the leg ends without a stop."""
        tail = self.stops.flush()
        self.content += tail
        return tail

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def _count(self, prompt: int, completion: int, tool: int) -> None:
        b_completion = self.base[1]
        if prompt:
            # This leg's prompt is everything the session held when the leg began.
            leg_prompt = prompt + b_completion + tool if self.route == "resume" else prompt
            self.usage = (leg_prompt, completion - b_completion)
        else:  # an engine that does not count a paused leg: what we saw generated
            self.usage = (0, self._generated)
        self.totals = (prompt, completion, tool)
