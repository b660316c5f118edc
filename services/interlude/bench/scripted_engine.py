"""A `VllmEngine` that runs scripted sessions, for benchmarks and tests (`scripted.py`).

`run_scripted` drives a `ScriptedSession`. On our engine the whole session is one streaming-input
request: each turn ends at `max_tokens` (with `ignore_eos`, so exactly N tokens), the request
parks with its KV, and the tool's tokens are the next input. With `resubmit=True` every segment
is a fresh request carrying the whole context (stock vLLM's handling of a tool call).
A tool that does not answer within `tool_deadline_s` ends the session with a clear error.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator
from typing import Any

from interlude.bench.scripted import ScriptedSession, SessionResult, Step, tool_tokens
from interlude.engine.config import EngineConfig
from interlude.engine.metrics import TOOL_WAIT
from interlude.engine.vllm_engine import VllmEngine
from interlude.enginecore.views import RequestMeta


class ToolTimeout(RuntimeError):
    """A tool did not answer before its deadline."""


class ScriptedEngine(VllmEngine):
    """`VllmEngine` plus `run_scripted`; any number of sessions may run at once."""

    def __init__(self, config: EngineConfig, tool_deadline_s: float = 300.0) -> None:
        super().__init__(config)
        self.tool_deadline_s = tool_deadline_s
        self._ids = itertools.count()

    def _params(self, step: Step, meta: RequestMeta) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=step.gen_tokens,
            temperature=0.0,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
            extra_args=meta.to_extra_args(),
        )

    async def _call_tool(self, s: ScriptedSession, i: int, step: Step) -> list[int]:
        if step.delay_s > self.tool_deadline_s:
            await asyncio.sleep(self.tool_deadline_s)
            raise ToolTimeout(
                f"session {s.session_id}: tool {step.tool!r} gave no answer within "
                f"{self.tool_deadline_s:g} s"
            )
        await asyncio.sleep(step.delay_s)
        return tool_tokens(s.session_id, i, step.return_tokens + step.markup_tokens)

    async def run_scripted(
        self, s: ScriptedSession, resubmit: bool = False, result: SessionResult | None = None
    ) -> SessionResult:
        """Run `s`; pass `result` to see what a session did even if its task is cancelled."""
        arrival = time.time()
        result = result or SessionResult(s.session_id, start=time.monotonic())
        try:
            if resubmit:
                await self._resubmit(s, arrival, result)
            else:
                await self._stream(s, arrival, result)
            result.end = time.monotonic()
        except ToolTimeout as e:
            result.error = str(e)
        return result

    def _meta(self, s: ScriptedSession, arrival: float, i: int) -> RequestMeta:
        return RequestMeta(kind=s.kind, arrival=arrival, tool=s.steps[i].tool, calls_done=i)

    async def _stream(self, s: ScriptedSession, arrival: float, result: SessionResult) -> None:
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt

        inputs: asyncio.Queue[Any] = asyncio.Queue()

        async def feed() -> AsyncGenerator[Any, None]:
            while (item := await inputs.get()) is not None:
                yield item

        params = self._params(s.steps[0], self._meta(s, arrival, 0))
        first = StreamingInput(
            # vLLM renders a TokensPrompt itself; its annotation names only pre-rendered inputs.
            TokensPrompt(prompt_token_ids=list(s.prompt_token_ids)),  # type: ignore[arg-type]
            params,
        )
        await inputs.put(first)
        turn = 0
        result.turns.append([])
        rid = f"{s.session_id}-{next(self._ids)}"
        async for out in self.llm.generate(feed(), params, rid):
            o = out.outputs[0]
            if o.token_ids and result.first_token is None:
                result.first_token = time.monotonic()
            result.turns[turn].extend(o.token_ids)
            if o.finish_reason is None:
                continue
            step = s.steps[turn]
            if step.tool is None:
                await inputs.put(None)
                continue
            waited = time.monotonic()
            try:
                answer = await self._call_tool(s, turn, step)
            except ToolTimeout:
                await inputs.put(None)
                raise
            result.tool_wait_s += time.monotonic() - waited
            TOOL_WAIT.observe(time.monotonic() - waited)
            turn += 1
            result.turns.append([])
            await inputs.put(
                StreamingInput(
                    TokensPrompt(prompt_token_ids=answer),  # type: ignore[arg-type]
                    self._params(s.steps[turn], self._meta(s, arrival, turn)),
                )
            )

    async def _resubmit(self, s: ScriptedSession, arrival: float, result: SessionResult) -> None:
        from vllm.inputs import TokensPrompt

        context = list(s.prompt_token_ids)
        for i, step in enumerate(s.steps):
            rid = f"{s.session_id}-{i}-{next(self._ids)}"
            tokens: list[int] = []
            prompt = TokensPrompt(prompt_token_ids=list(context))
            async for out in self.llm.generate(
                prompt, self._params(step, self._meta(s, arrival, i)), rid
            ):
                if out.outputs[0].token_ids and result.first_token is None:
                    result.first_token = time.monotonic()
                tokens.extend(out.outputs[0].token_ids)
            result.turns.append(tokens)
            if step.tool is None:
                break
            waited = time.monotonic()
            answer = await self._call_tool(s, i, step)
            result.tool_wait_s += time.monotonic() - waited
            context += tokens[:-1] + answer  # as a streaming session keeps it
