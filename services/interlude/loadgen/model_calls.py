"""One conversation whose calls the model writes itself (`--calls model`): real mode.

With a real model the scripts of `client.py` replay the trace's lengths exactly (`ignore_eos`,
`interlude_script`), but the calls are the client's words, not the model's. Here the model
decides: every request declares the tools and lets it write a call (or answer), and the trace
supplies only what a call costs. Each turn that ends in calls gets the trace's next call:
the client waits its delay once (the calls run side by side), then answers every call with a
text of that call's return tokens. Both client modes work the same way: `resubmit` sends the
whole conversation back (any OpenAI-compatible server with a tool parser), `resume` sends the
same conversation to Interlude, whose gateway finds the parked session.

Each request carries `max_tokens` = the trace's segment tokens plus `CALL_TOKENS`, room for
the call's markup; no `ignore_eos`. Before the trace's last call the tool choice is the run's:
`auto` for real models; `named` (the trace's next tool, by name) or `required` make even a
random-weight model write a call, through the server's own constrained decoding and tool
parser. (Stock vLLM 0.32's `required` with the Hermes parser does not hold a random model's
arguments to the schema, so its turns may run to the token cap; `named` ends them.) After the
trace's last call the choice is `none`, since the trace ends there. A turn counts as a call
when the answer carries tool calls and did not stop at its token cap (OpenAI's finish reason
is `stop`, not `tool_calls`, for a named choice). How far the model followed the trace is
counted: calls answered, conversations that ended early (an answer while the trace had calls
left) and calls written past the trace's last (not run; the conversation ends there).
Interlude can force only a session's first turn: a continuation that forces a call is served
by recompute (docs/gateway.md), so against Interlude a forced choice measures that path, and
`auto` (real models) the resumes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from interlude.loadgen.client import (
    ConversationResult,
    Target,
    opening,
    took,
    tool_defs,
    tool_name,
)
from interlude.loadgen.plan import Conversation
from interlude.loadgen.stream import ServerError, chat
from interlude.loadgen.text import TextMaker

# Room for a call's markup and arguments beyond the segment's tokens (the tiny model's forced
# call takes about 40 tokens on Interlude, up to about 90 on stock vLLM).
CALL_TOKENS = 128


def request_body(
    target: Target, conv: Conversation, messages: list[dict[str, Any]], segment: int
) -> dict[str, Any]:
    """The request for `segment` of `conv`: tools declared, the model free to call."""
    step = conv.steps[segment]
    choice: str | dict[str, Any] = target.tool_choice if step.tool is not None else "none"
    if choice == "named":
        assert step.tool is not None
        choice = {"type": "function", "function": {"name": tool_name(step.tool)}}
    body: dict[str, Any] = {
        "model": target.model,
        "temperature": target.temperature,
        "messages": messages,
        "max_tokens": step.gen_tokens + CALL_TOKENS,
        "tools": tool_defs(conv),
        "tool_choice": choice,
    }
    if target.mode == "resume":
        body["interlude_kind"] = tool_name(conv.kind)
    return body


async def run_model_conversation(
    http: httpx.AsyncClient,
    target: Target,
    conv: Conversation,
    texts: TextMaker,
    result: ConversationResult,
) -> None:
    """Run `conv` with model-written calls, filling `result` (a run cut at its horizon keeps
    what it saw). `target.calls` must be "model"."""
    seed, messages = opening(conv, texts)
    result.scripted = False
    try:
        for i, step in enumerate(conv.steps):
            if i > 0:
                result.resume_sent = time.monotonic()
                result.answers_sent += 1
            answer = await chat(
                http, target.url, request_body(target, conv, messages, i), result.first_seen
            )
            result.resume_sent = None
            took(result, answer)
            calls = answer.tool_calls if answer.finish_reason != "length" else []
            if not calls:
                result.ended_early = step.tool is not None
                break
            if step.tool is None:
                result.calls_past_trace = len(calls)
                break
            started = time.monotonic()
            await asyncio.sleep(step.delay_s)
            result.tool_wait_s += time.monotonic() - started
            # The assistant message as the server returned it, so Interlude finds its session.
            messages.append(
                {"role": "assistant", "content": answer.content or None, "tool_calls": calls}
            )
            for k, call in enumerate(calls):
                reply = texts.text(step.return_tokens, seed + 97 * (i + 1) + k)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": reply})
                result.returned_tokens += step.return_tokens
            result.calls_answered += len(calls)
        result.end = time.monotonic()
    except (ServerError, httpx.HTTPError, ValueError, KeyError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
