"""Replay a schedule of conversations against one server, and measure it like the simulator.

Arrivals stop at the plan's last arrival; the run stops at `horizon_s` or when every
conversation is done. Conversations still running at the horizon are cancelled (their HTTP
streams close, so the server frees them) and counted as unfinished, with their latency so far.

Metrics are the simulator's (`interlude.sim.metrics`, DESIGN section 4) and the row has the
keys `bench engine` writes, so `interlude.slo`'s SLO rules judge HTTP runs unchanged:
normalized latency = (end - start - tool time) / output tokens, tool-answer tokens counted as
output; throughput = conversations finished / (end - first arrival); TTFT is the first content
token of the first answer; tokens/s counts generated tokens only. The resume wait is the time
from sending a tool's answer to the continuation's first token (`client` modes that send
answers: `resume`, `resubmit`); one still waiting at the horizon counts with its wait so far.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from interlude.loadgen.client import (
    ConversationResult,
    Target,
    expected_tokens,
    run_conversation,
)
from interlude.loadgen.model_calls import run_model_conversation
from interlude.loadgen.plan import Conversation
from interlude.loadgen.text import TextMaker
from interlude.sim.metrics import mean, quantile, session_metrics

# Idle connections are given up after this: below the 5 s for which uvicorn, and so stock
# vLLM's server, keeps them by default. A request sent on a connection the server is closing
# fails (`interlude.api.wire.SERVER_KEEP_ALIVE_S` has the measurement).
KEEPALIVE_S = 4.0

Progress = Callable[[int, int, int], None]  # (arrived, finished, total)


async def replay(
    target: Target,
    plan: Sequence[Conversation],
    texts: TextMaker,
    horizon_s: float,
    progress: Progress | None = None,
    timeout_s: float = 600.0,
) -> tuple[list[tuple[Conversation, ConversationResult]], tuple[float, float]]:
    """Conversations that arrived before the run stopped, with what they did, and the run's
    (first arrival, end) in `time.monotonic()` seconds."""
    results: list[ConversationResult | None] = [None] * len(plan)
    limits = httpx.Limits(
        max_connections=4096, max_keepalive_connections=512, keepalive_expiry=KEEPALIVE_S
    )
    runner = run_model_conversation if target.calls == "model" else run_conversation
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as http:
        t0 = time.monotonic()

        async def one(i: int, conv: Conversation) -> None:
            await asyncio.sleep(max(0.0, t0 + conv.arrival_s - time.monotonic()))
            results[i] = r = ConversationResult(conv.conv_id, start=time.monotonic())
            await runner(http, target, conv, texts, r)

        pending = {asyncio.create_task(one(i, c)) for i, c in enumerate(plan)}
        while pending:
            left = t0 + horizon_s - time.monotonic()
            if left <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=min(0.5, left))
            if progress is not None:
                started = sum(1 for r in results if r is not None)
                done = sum(1 for r in results if r is not None and r.ok)
                progress(started, done, len(plan))
        end = min(time.monotonic(), t0 + horizon_s) if pending else time.monotonic()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    arrived = [(c, r) for c, r in zip(plan, results, strict=True) if r is not None]
    first = t0 + min((c.arrival_s for c in plan), default=0.0)
    return arrived, (first, end)


def summarize(
    arm: str,
    mode: str,
    runs: Sequence[tuple[Conversation, ConversationResult]],
    span: tuple[float, float],
) -> dict[str, Any]:
    """One run's row (the keys of `bench engine`'s rows, and more)."""
    first, end = span
    norm, ttft, e2e, waits = [], [], [], []
    answers = 0
    generated = mismatched = errors = 0
    answered = early = past = 0
    routes: dict[str, int] = {}
    for conv, r in runs:
        done = r.end if r.ok and r.end is not None else end
        output = r.generated + r.returned_tokens
        norm.append((done - r.start - r.tool_wait_s) / max(1, output))
        if r.first_token is not None:
            ttft.append(r.first_token - r.start)
        if r.ok and r.end is not None:
            e2e.append(r.end - r.start)
        waits += r.resume_waits
        answers += r.answers_sent
        if r.resume_sent is not None:  # cut at the horizon while waiting: a lower bound
            waits.append(end - r.resume_sent)
        generated += r.generated
        if r.scripted:
            want = list(expected_tokens(conv, mode))
            mismatched += r.segment_tokens != want[: len(r.segment_tokens)]
        answered += r.calls_answered
        early += r.ended_early
        past += r.calls_past_trace
        errors += r.error is not None
        for route in r.routes:
            routes[route] = routes.get(route, 0) + 1
    makespan = max(end - first, 1e-9)
    return {
        "arm": arm,
        "mode": mode,
        "sessions": len(runs),
        "finished": len(e2e),
        "unfinished": len(runs) - len(e2e),
        "errors": errors,
        **session_metrics(len(runs), norm, ttft, e2e, makespan),
        "tokens_per_s": generated / makespan,
        "generated": generated,
        "answers_sent": answers,
        "resumes": len(waits),  # continuations that showed text (or were cut waiting)
        "resume_wait_mean_s": mean(waits),
        "resume_wait_p99_s": quantile(waits, 0.99),
        "segments_off_script": mismatched,  # scripted calls only
        # Model-written calls (`--calls model`): how far the model followed the trace.
        "calls_answered": answered,
        "ended_early": early,
        "calls_past_trace": past,
        "routes": routes,
        "first_errors": [r.error for _, r in runs if r.error][:3],
    }
