"""One scripted conversation against an OpenAI-compatible server, in one of three modes.

* `resubmit` — any OpenAI-compatible server (stock vLLM): what users do today. Each segment is a
  request with `max_tokens` = the segment's tokens and vLLM's `ignore_eos`; the client then
  sleeps the tool's delay itself, appends the assistant message (with the call, as a client
  would record it) and the tool's answer, and resubmits the whole conversation. The tool is
  declared with `tool_choice: "none"`, so the prompt carries the same tool block as in
  `resume` mode while the server parses no calls.
* `resume` — Interlude with client-side tools: each segment's request carries
  `interlude_script` (docs/gateway.md), so the engine ends the turn after exactly that many
  tokens with a call of the client-side tool named after the trace's call type (`tool_name`);
  the session stays parked on its engine,
  and the client's next request (the conversation with the tool's answer) resumes it.
* `server-tools` — Interlude with server-side tools: one request scripts every call, of the
  tools-svc `scripted` tool (it sleeps `delay_s` and returns `tokens` tokens); the client waits
  for one answer.

Every request streams (`stream_options.include_usage`), so the first token's time is seen.
A segment's generated tokens come from the server's `usage`, never from the script.
Here the script places the calls; with `Target.calls == "model"` the model writes them
(`model_calls.py`).
"""

from __future__ import annotations

import asyncio
import re
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from interlude.loadgen.markup import declare
from interlude.loadgen.plan import Conversation
from interlude.loadgen.stream import Answer, ServerError, chat
from interlude.loadgen.text import TextMaker

MODES = ("resubmit", "resume", "server-tools")
# Who writes the calls: the script (the client says where they are; any model follows it) or
# the model itself (`model_calls.py`: a real model, or a random one under tool_choice required).
CALLS = ("script", "model")
# A model-call run's tool_choice before the trace's last call; "named" names the trace's tool.
TOOL_CHOICES = ("auto", "required", "named")
SERVER_TOOL = "scripted"  # tools-svc's sleep-and-return tool


def tool_name(kind: str) -> str:
    """The client-side tool a trace's call type becomes ("toolbench:api" -> "toolbench_api"):
    the engine's policy learns tool durations by name, as it does from a real model's calls."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", kind)[:64]
    return name or "tool"


def tool_defs(conv: Conversation) -> list[dict[str, Any]]:
    """One function per tool the conversation calls, declared the same way in every mode."""
    names = sorted({tool_name(s.tool) for s in conv.steps if s.tool is not None}) or ["tool"]
    return declare(names)


def _server_tool_def(name: str) -> dict[str, Any]:
    """A server-side tool taking `scripted`'s arguments: sleep delay_s, return tokens words."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "sleep delay_s, then return tokens words",
            "parameters": {
                "type": "object",
                "properties": {"delay_s": {"type": "number"}, "tokens": {"type": "integer"}},
            },
        },
    }


@dataclass
class ConversationResult:
    """What one conversation saw (times are `time.monotonic()` seconds)."""

    conv_id: str
    start: float
    first_token: float | None = None
    end: float | None = None
    segment_tokens: list[int] = field(default_factory=list)  # generated, per segment (usage)
    returned_tokens: int = 0  # tool-answer tokens appended so far (counted as output)
    tool_wait_s: float = 0.0
    routes: list[str] = field(default_factory=list)
    error: str | None = None
    # Each continuation's wait: from sending the tool's answer to the continuation's first
    # token (the time a call costs beyond the tool itself: Interlude resumes the parked KV,
    # a plain server prefills the resubmitted conversation). `resume_sent` is the pending one;
    # an answer that ends without showing any text gives no wait.
    resume_waits: list[float] = field(default_factory=list)
    resume_sent: float | None = None
    answers_sent: int = 0  # tool answers sent back (continuations asked for)
    # Model-written calls only (`model_calls.py`): the model decides, so these say how far
    # it followed the trace. `scripted` False leaves the segment counts unchecked.
    scripted: bool = True
    calls_answered: int = 0  # calls the model wrote that the client ran
    ended_early: bool = False  # answered without a call while the trace had calls left
    calls_past_trace: int = 0  # calls written after the trace's last one (not run)

    @property
    def generated(self) -> int:
        return sum(self.segment_tokens)

    def first_seen(self, t: float) -> None:
        if self.first_token is None:
            self.first_token = t
        if self.resume_sent is not None:
            self.resume_waits.append(t - self.resume_sent)
            self.resume_sent = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None


@dataclass(frozen=True)
class Target:
    """Where and how to send: the server's /v1 URL, its model name and the mode."""

    url: str
    model: str
    mode: str
    temperature: float = 0.0
    calls: str = "script"  # CALLS
    tool_choice: str = "auto"  # TOOL_CHOICES; model-written calls only
    # server-tools mode: the tool each call runs (one taking `scripted`'s arguments).
    server_tool: str = SERVER_TOOL

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.calls not in CALLS:
            raise ValueError(f"calls must be one of {CALLS}, got {self.calls!r}")
        if self.tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {TOOL_CHOICES}, got {self.tool_choice!r}")
        if self.calls == "model" and self.mode == "server-tools":
            raise ValueError(
                "model-written calls run on the client: use mode resubmit or resume, "
                "not server-tools (its calls are scripted inside one request)"
            )


def opening(conv: Conversation, texts: TextMaker) -> tuple[int, list[dict[str, Any]]]:
    """The conversation's text seed and its first message: its prompt, the same in every mode."""
    # A hash of the whole id: a sum of its characters gave half the conversations of a run the
    # opening of another (ids that are permutations of each other), which a prefix cache shared.
    seed = zlib.crc32(conv.conv_id.encode())
    return seed, [{"role": "user", "content": prompt_text(conv, texts, seed)}]


def prompt_text(conv: Conversation, texts: TextMaker, seed: int) -> str:
    """`conv`'s prompt: its group's shared head (the same text in every conversation of the
    group: one-token words, so the two parts add up to exactly `prompt_tokens`), then its own."""
    shared = conv.shared_prefix_tokens
    head = texts.text(shared, zlib.crc32(conv.prefix_group.encode())) if shared else ""
    return head + texts.text(conv.prompt_tokens - shared, seed)


async def run_conversation(
    http: httpx.AsyncClient,
    target: Target,
    conv: Conversation,
    texts: TextMaker,
    result: ConversationResult,
) -> None:
    """Run `conv`, filling `result` as it goes (a run cut at its horizon keeps what it saw)."""
    seed, messages = opening(conv, texts)
    base = {"model": target.model, "temperature": target.temperature, "ignore_eos": True}
    try:
        if target.mode == "server-tools":
            await _server_tools(http, target, conv, base, messages, result)
        else:
            await _per_segment(http, target, conv, texts, seed, base, messages, result)
        result.end = time.monotonic()
    except (ServerError, httpx.HTTPError, ValueError, KeyError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"


async def _per_segment(
    http: httpx.AsyncClient,
    target: Target,
    conv: Conversation,
    texts: TextMaker,
    seed: int,
    base: dict[str, Any],
    messages: list[dict[str, Any]],
    result: ConversationResult,
) -> None:
    for i, step in enumerate(conv.steps):
        # The same tool declared in both modes, so both prompts carry the same tool block;
        # `none` keeps a stock server from parsing (or needing a parser for) calls.
        body = {**base, "messages": messages, "max_tokens": step.gen_tokens}
        body |= {"tools": tool_defs(conv), "tool_choice": "none"}
        name = tool_name(step.tool) if step.tool else ""
        if target.mode == "resume":
            script = [{"tool": name, "after_tokens": step.gen_tokens}] if step.tool else []
            body |= {"tool_choice": "auto", "interlude_script": script}
            # The trace's kind, as `bench engine` gives it: the policy learns per kind.
            body["interlude_kind"] = tool_name(conv.kind)
            body["max_tokens"] = step.gen_tokens + (1 if step.tool else 0)
        if i > 0:
            result.resume_sent = time.monotonic()
            result.answers_sent += 1
        answer = await chat(http, target.url, body, result.first_seen)
        # An answer whose tokens all decoded to no text (a random model writes special and
        # partial tokens) showed no first token: its wait is unknown, not still running.
        result.resume_sent = None
        took(result, answer)
        if step.tool is None:
            return
        if target.mode == "resume":
            if answer.finish_reason != "tool_calls" or not answer.tool_calls:
                raise ServerError(f"segment {i}: expected a tool call, got {answer.finish_reason}")
            call = answer.tool_calls[0]
        else:  # the client decides the call itself and records it as a client would
            call = {
                "id": f"call_{conv.conv_id}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": "{}"},
            }
        started = time.monotonic()
        await asyncio.sleep(step.delay_s)
        result.tool_wait_s += time.monotonic() - started
        messages.append(
            {"role": "assistant", "content": answer.content or None, "tool_calls": [call]}
        )
        reply = texts.text(step.return_tokens, seed + i + 1)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": reply})
        result.returned_tokens += step.return_tokens


async def _server_tools(
    http: httpx.AsyncClient,
    target: Target,
    conv: Conversation,
    base: dict[str, Any],
    messages: list[dict[str, Any]],
    result: ConversationResult,
) -> None:
    script = [
        {
            "tool": target.server_tool,
            "after_tokens": s.gen_tokens,
            "arguments": {"delay_s": s.delay_s, "tokens": s.return_tokens},
        }
        for s in conv.steps[:-1]
    ]
    body = {
        **base,
        "messages": messages,
        "tools": [_server_tool_def(target.server_tool)],
        "interlude_script": script,
        "interlude_kind": tool_name(conv.kind),
        "max_tokens": sum(s.gen_tokens for s in conv.steps),
    }
    answer = await chat(http, target.url, body, result.first_seen)
    took(result, answer)
    # The tools ran inside the request: their time is the script's.
    result.tool_wait_s = sum(s.delay_s for s in conv.steps)
    result.returned_tokens = sum(s.return_tokens for s in conv.steps)


def took(result: ConversationResult, answer: Answer) -> None:
    """Count one answer's generated tokens and route into `result`."""
    assert answer.completion_tokens is not None
    result.segment_tokens.append(answer.completion_tokens)
    if answer.route is not None:
        result.routes.append(answer.route)


def expected_tokens(conv: Conversation, mode: str) -> Sequence[int]:
    """The generated tokens per answer the script asks for (`segment_tokens` should match)."""
    if mode == "server-tools":
        return [sum(s.gen_tokens for s in conv.steps)]
    return [s.gen_tokens for s in conv.steps]
