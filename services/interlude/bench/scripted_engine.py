"""A `VllmEngine` that runs scripted sessions (`scripted.py`) through the serving loop.

`run_scripted` drives a `ScriptedSession` with the engine service's own `ChatRunner`, as a
scripted chat request (`api/script.py`): each turn generates exactly its step's tokens, then
the runner makes the step's call, parks the session and waits for the "client" (here: a sleep
of the step's delay) to answer. So a benchmark or a test measures the loop that serves users,
not a copy of it. With `resubmit=True` every segment is a fresh request carrying the whole
context (stock vLLM's handling of a tool call), through the same loop.

The one thing scripted runs need that a chat does not is token-exact answers: `ScriptCodec`
gives each call's answer as the step's token ids (`tool_tokens`) rather than a rendered chat
message, and records each finished turn's token ids into the session's result.
A tool that does not answer within `tool_deadline_s` ends the session with the runner's own
timeout error.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import Sequence
from typing import Any

from interlude.api.events import TextDelta, ToolResultEvent
from interlude.api.script import ScriptedCall
from interlude.bench.scripted import ScriptedSession, SessionResult, Step, tool_tokens
from interlude.engine.chat import ChatRunner
from interlude.engine.chat_state import ClientAnswer, ClientTimeout, client_timeout
from interlude.engine.config import EngineConfig
from interlude.engine.request import ChatRequest
from interlude.engine.toolcalls import ParsedTurn, ToolCallCodec, ToolCallRequest
from interlude.engine.vllm_engine import VllmEngine

# What a scripted session's chat request says (`ChatRequest` wants one message; the runner
# takes the prompt's token ids as given and never renders it).
_MESSAGES = ({"role": "user", "content": "scripted"},)


class ScriptCodec(ToolCallCodec):
    """The engine's codec for one scripted session: each call's answer is its step's token
    ids, and each finished turn's token ids go into the session's result (`turns[-1]`).

    Side effects: writes `result.turns`. Invariant: `ChatRunner` parses every turn of a
    scripted session once, in order, through `turn_text`, and asks for one continuation per
    call, in order; so turn k's ids land in the turn list opened for it, and call k answers
    with step k's tokens."""

    def bind(self, session: ScriptedSession, result: SessionResult, first_call: int) -> None:
        self.session, self.result, self.call = session, result, first_call

    def turn_text(self, turn_ids: Sequence[int]) -> str:
        self.result.turns[-1][:] = turn_ids
        return ""  # nothing reads a scripted turn's text but the history, which is not rendered

    def scripted_continuation(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        turn: ParsedTurn,
        results: list[dict[str, Any]],
    ) -> list[int]:
        step = self.session.steps[self.call]
        answer = tool_tokens(self.session.session_id, self.call, _answer_tokens(step))
        self.call += 1
        return answer


def _answer_tokens(step: Step) -> int:
    return step.return_tokens + step.markup_tokens


class ScriptedEngine(VllmEngine):
    """`VllmEngine` plus `run_scripted`; any number of sessions may run at once."""

    def __init__(self, config: EngineConfig, tool_deadline_s: float = 300.0) -> None:
        super().__init__(config)
        self.tool_deadline_s = tool_deadline_s
        self._ids = itertools.count()
        # Checked once (the template renders calls as the parser reads them); each session
        # gets a shallow copy bound to it.
        self._codec = ScriptCodec(self.llm.get_tokenizer())
        self._max_len = int(self.llm.model_config.max_model_len)

    async def run_scripted(
        self, s: ScriptedSession, resubmit: bool = False, result: SessionResult | None = None
    ) -> SessionResult:
        """Run `s`; pass `result` to see what a session did even if its task is cancelled.

        `result.turns` holds a list per turn, opened when the call before it has returned; a
        turn still running holds -1 for each token generated so far, and its ids once it ends.
        """
        result = result or SessionResult(s.session_id, start=time.monotonic())
        try:
            if resubmit:
                await self._resubmit(s, result)
            else:
                await self._session(s, list(s.prompt_token_ids), s.steps, 0, result)
            result.end = time.monotonic()
        except ClientTimeout as e:
            result.error = str(e)
        return result

    async def _session(
        self,
        s: ScriptedSession,
        prompt: list[int],
        steps: Sequence[Step],
        first_call: int,
        result: SessionResult,
    ) -> None:
        """One scripted chat session of `steps` (the last without a call) from `prompt`."""
        codec = copy.copy(self._codec)
        codec.bind(s, result, first_call)
        runner = ChatRunner(self.llm, codec, self._max_len, client_deadline_s=self.tool_deadline_s)
        runner.client_wait = lambda _sid, calls: self._tool(s, codec.call, calls, result)
        req = ChatRequest(
            session_id=f"{s.session_id}-{next(self._ids)}",
            messages=_MESSAGES,
            max_tokens=sum(st.gen_tokens for st in steps),
            ignore_eos=True,
            max_tool_calls=len(steps) - 1,
            kind=s.kind,
            script=tuple(ScriptedCall(st.tool, st.gen_tokens) for st in steps if st.tool),
        )
        result.turns.append([])
        events = runner.run(req, prompt)
        try:
            async for ev in events:
                if isinstance(ev, TextDelta):
                    if result.first_token is None:
                        result.first_token = time.monotonic()
                    result.turns[-1] += [-1] * ev.tokens
                elif isinstance(ev, ToolResultEvent):
                    result.turns.append([])
        finally:
            await events.aclose()

    async def _tool(
        self, s: ScriptedSession, call: int, calls: Sequence[ToolCallRequest], result: SessionResult
    ) -> ClientAnswer:
        """The scripted tool's answer after its delay (the runner gives up at the deadline)."""
        waited = time.monotonic()
        await asyncio.sleep(s.steps[call].delay_s)
        result.tool_wait_s += time.monotonic() - waited
        return ClientAnswer([ToolResultEvent(c.id, True, "") for c in calls])

    async def _resubmit(self, s: ScriptedSession, result: SessionResult) -> None:
        context = list(s.prompt_token_ids)
        for i, step in enumerate(s.steps):
            await self._session(s, context, (Step(step.gen_tokens),), i, result)
            if step.tool is None:
                return
            waited = time.monotonic()
            try:  # the deadline as the runner keeps it for a streamed session's calls
                await asyncio.wait_for(asyncio.sleep(step.delay_s), self.tool_deadline_s)
            except TimeoutError:
                raise client_timeout(s.session_id, [step.tool], self.tool_deadline_s) from None
            result.tool_wait_s += time.monotonic() - waited
            context += result.turns[-1] + tool_tokens(s.session_id, i, _answer_tokens(step))
