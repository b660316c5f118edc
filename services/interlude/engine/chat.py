"""Chat sessions on a real model: one vLLM streaming-input request from first token to answer.

A turn is generated with the tool parser's end-of-call token as a stop token. When a turn stops
there, the frontend parses the call with vLLM's tool parser (`ToolCallCodec`), runs it (server
side on the bus, or by pausing for the client), and appends only the new tokens the chat
template renders for the result; meanwhile the scheduler parks the request and the policy
decides what happens to its KV. A turn that ends any other way is the answer.

`ChatRunner.run` is an async generator of `events`; `SessionManager` splits it into legs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from interlude import telemetry
from interlude.api.bus import ToolCall
from interlude.api.events import (
    Event,
    Paused,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
    ToolResultEvent,
    TurnStart,
)
from interlude.api.names import new_call_id
from interlude.engine.chat_state import (
    ClientAnswer,
    ClientWait,
    Progress,
    client_timeout,
    done_event,
    finish_of,
    forced_call,
    root_cause,
    split_sides,
    take_answer,
)
from interlude.engine.logprobs import token_logprobs
from interlude.engine.metrics import TOOL_WAIT
from interlude.engine.request import ChatRequest, RequestError
from interlude.engine.toolcalls import ParsedTurn, ToolCallCodec, ToolCallRequest
from interlude.engine.tools import ServerTools
from interlude.enginecore.views import RequestMeta

if TYPE_CHECKING:
    from interlude.engine.prefill import PrefillClient


@dataclass
class _Session:
    """What a session's turn ends need beside the turn: its request, vLLM request id, arrival,
    progress, messages so far (for the template's continuations) and vLLM's input queue."""

    req: ChatRequest
    rid: str
    arrival: float
    progress: Progress
    messages: list[dict[str, Any]] = field(init=False)
    inputs: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.messages = [dict(m) for m in self.req.messages]


class ChatRunner:
    """Drives chat sessions on one engine.

    Side effects: one vLLM request per session (aborted if the generator is closed early);
    server-side calls on the bus; `client_wait` blocks until the client posts results (it
    raises `TimeoutError` past the client deadline). Invariant: the context the engine holds
    is always `render_prompt(messages)` plus generated tokens plus continuations, so each
    resume prefills only the tool result's tokens.
    """

    def __init__(
        self,
        llm: Any,
        codec: ToolCallCodec,
        max_model_len: int,
        server: ServerTools | None = None,
        tool_deadline_s: float = 300.0,
        client_deadline_s: float = 300.0,
        turn_starts: Callable[[str], tuple[str, float] | None] | None = None,
        prefill: PrefillClient | None = None,
    ) -> None:
        """`turn_starts(request_id)`: how the request's latest resumed turn got its KV back and
        its wait, as the scheduler reported it (None: not yet); per turn in spans and events.
        `prefill`: how a session whose request names a prefill engine gets its prompt prefilled
        there (None: always here)."""
        self.llm = llm
        self.codec = codec
        self.tokenizer = codec.tokenizer
        self.max_model_len = max_model_len
        # Set by `SessionManager`: how a session waits for the client's tool results.
        self.client_wait: ClientWait | None = None
        self.server = server
        self.tool_deadline_s = tool_deadline_s
        self.client_deadline_s = client_deadline_s
        self.turn_starts = turn_starts
        self.prefill = prefill

    def prompt_tokens(self, req: ChatRequest) -> list[int]:
        """The rendered prompt, checked before the session starts: RequestError if the model's
        chat template refuses the conversation, the prompt leaves no room to generate, or vLLM
        would refuse the first turn's parameters (a forced call's grammar from a tool schema
        it cannot compile). Later, the stream has begun and an error is only an event."""
        from jinja2 import TemplateError

        try:
            ids = self.codec.render_prompt([dict(m) for m in req.messages], self._tools(req))
        except TemplateError as exc:  # templates `raise_exception` on shapes they do not take
            raise RequestError(f"the model's chat template refused the messages: {exc}") from exc
        if len(ids) >= self.max_model_len:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; this engine's context is "
                f"{self.max_model_len} tokens"
            )
        p = self._progress(req, len(ids))
        self._verify(req, self._params(req, p, time.time()))
        return ids

    def check_answer(self, req: ChatRequest, schema: Mapping[str, Any], tools_on: bool) -> None:
        """RequestError naming `response_format` if vLLM cannot build an answer grammar from
        `schema` (for a resumed session, whose first turn's checks are long past)."""
        p = Progress(0, 0, req.max_tokens, tools_on=tools_on, answer_schema=schema)
        self._verify(replace(req, tool_choice="auto"), self._params(req, p, time.time()))

    def _progress(self, req: ChatRequest, prompt: int) -> Progress:
        p = Progress(prompt, prompt, req.max_tokens, tools_on=req.uses_tools)
        p.script = list(req.script or ())
        p.answer_schema = req.answer_schema
        p.force = forced_call(req.tool_choice)
        return p

    def _verify(self, req: ChatRequest, params: Any) -> None:
        from vllm.exceptions import VLLMValidationError

        config = self.llm.vllm_config
        try:
            params.verify(
                config.model_config,
                config.speculative_config,
                config.structured_outputs_config,
                self.tokenizer,
            )
        except VLLMValidationError as exc:
            if params.structured_outputs is None:
                raise RequestError(f"vLLM refused the request: {exc}") from exc
            names = [t["function"]["name"] for t in req.tools]
            if req.tool_choice in names:
                param = f"tools[{names.index(req.tool_choice)}].function.parameters"
            else:
                param = "tools" if req.tool_choice == "required" else "response_format"
            raise RequestError(
                f"{param}: the grammar cannot be built from this schema ({root_cause(exc)})",
                param,
            ) from exc

    def _tools(self, req: ChatRequest) -> list[dict[str, Any]] | None:
        return [dict(t) for t in req.tools] or None

    def _turn_start(self, rid: str, span: Any) -> tuple[str, float] | None:
        start = self.turn_starts(rid) if self.turn_starts is not None else None
        if start is not None:
            span.set_attribute("interlude.kv_return", start[0])
            span.set_attribute("interlude.queue_wait_ms", start[1] * 1000)
        return start

    def _turn_params(self, req: ChatRequest, p: Progress, arrival: float, rid: str) -> Any:
        """The next turn's params; a forced call binds that turn only."""
        params = self._params(req, p, arrival, rid)
        p.force = None
        return params

    def _params(self, req: ChatRequest, p: Progress, arrival: float, rid: str = "") -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        forced = grammar = None
        if p.force is not None:
            forced = grammar = self.codec.forced_call(self._tools(req) or [], p.force)
        elif p.answer_schema is not None and not req.scripted:
            tools = self._tools(req) if p.tools_on else None
            grammar = self.codec.answer(dict(p.answer_schema), tools)
        room = min(p.limit - p.generated, self.max_model_len - p.context)
        if p.script:  # a scripted turn: exactly the script's count, then its call
            room = min(room, p.script[0].after_tokens)
        return SamplingParams(
            max_tokens=max(1, room),
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            ignore_eos=req.ignore_eos or req.scripted,
            # A scripted session's calls come from its script, never from the model's markers.
            stop_token_ids=list(self.codec.stop_token_ids)
            if p.tools_on and not req.scripted
            else None,
            # Tool parsers read the markers, which are special tokens in most tokenizers.
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=grammar,
            # The session's count on every turn: vLLM fixes it at the first, and a turn asking
            # for another would get wrong values.
            logprobs=req.logprobs,
            # A forced call must not end early: the grammar would allow EOS after the arguments.
            logit_bias=self.codec.forced_logit_bias if forced is not None else None,
            extra_args=RequestMeta(
                kind=req.kind,
                arrival=arrival,
                # A scripted turn names its call up front, so the scheduler parks the session
                # under the policy when the turn ends (a model's call ends at its stop token).
                tool=p.script[0].tool if p.script else None,
                calls_done=p.calls,
                caller_id=rid or None,
            ).to_extra_args(),
        )

    async def run(self, req: ChatRequest, prompt: list[int]) -> AsyncGenerator[Event, None]:
        """Events of the whole session; the last is `Done` or `Failed`.

        The per-output loop below runs for every token, so it stays in this frame on locals:
        only a turn's end (once per turn) calls out: `_end_turn`, `finish_of`, `_answer_calls`.
        """
        rid = f"{req.session_id}-{uuid.uuid4().hex[:8]}"
        s = _Session(req, rid, time.time(), self._progress(req, len(prompt)))
        p = s.progress
        params = self._turn_params(req, p, s.arrival, s.rid)
        await s.inputs.put(await self._first_input(req, prompt, params))
        tracer = telemetry.tracer()
        with tracer.start_as_current_span(
            "session", context=telemetry.context_of(req.trace)
        ) as span:
            span.set_attribute("interlude.session_id", req.session_id)
            turn_span = tracer.start_span("turn")
            turn_ids: list[int] = []
            text = shown = ""
            unshown = 0  # tokens generated since the last text event (markup is held back)
            pending: list[TokenLogprob] = []  # their logprobs
            finish = "stop"
            resumed = False  # a resumed turn whose start the scheduler has not reported yet
            async for out in self.llm.generate(_feed(s.inputs), params, s.rid):
                o = out.outputs[0]
                if resumed and (start := self._turn_start(s.rid, turn_span)) is not None:
                    resumed = False
                    yield TurnStart(req.session_id, *start)
                if req.logprobs is not None:
                    pending += token_logprobs(o.token_ids, o.logprobs, req.logprobs)
                turn_ids.extend(o.token_ids)
                p.generated += len(o.token_ids)
                text += o.text
                hide = p.tools_on and not req.scripted  # markup held back from the client
                visible = text.split(self.codec.start_marker, 1)[0] if hide else text
                unshown += len(o.token_ids)
                if len(visible) > len(shown):
                    yield TextDelta(visible[len(shown) :], unshown, tuple(pending))
                    shown, unshown, pending = visible, 0, []
                if o.finish_reason is None:
                    continue
                p.turns += 1
                if pending and not (p.tools_on and self.codec.ends_call(turn_ids)):
                    # The answer's last tokens made no text yet (a character's first bytes).
                    yield TextDelta("", unshown, tuple(pending))
                    unshown, pending = 0, []
                turn = self._end_turn(req, o.finish_reason, turn_ids, turn_span, p)
                finish = finish_of(req, turn, o.finish_reason, p)
                if not turn.calls or finish == "length":
                    await s.inputs.put(None)
                    continue
                async for ev in self._answer_calls(s, turn_ids, turn, span):
                    yield ev
                if p.context >= self.max_model_len:
                    return  # `_answer_calls` ended the session
                turn_ids, text, shown, unshown, pending = [], "", "", 0, []
                turn_span = tracer.start_span("turn")
                resumed = self.turn_starts is not None
            span.set_attribute("interlude.tool_calls", p.calls)
        yield done_event(req, finish, p)

    async def _answer_calls(
        self, s: _Session, turn_ids: list[int], turn: ParsedTurn, span: Any
    ) -> AsyncGenerator[Event, None]:
        """A turn's calls and their results (`_run_calls`), then the session's next input
        for vLLM: the continuation that carries the results, with the next turn's parameters;
        or, when that would pass the model's length, a `length` `Done` and the end of the
        inputs."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt

        req, p = s.req, s.progress
        results: list[ToolResultEvent] = []
        async for ev in self._run_calls(req, turn, span, p):
            if isinstance(ev, ToolResultEvent):
                results.append(ev)
            yield ev
        cont = self._continuation(req, s.messages, turn_ids, turn, results, p)
        if p.context >= self.max_model_len:
            yield done_event(req, "length", p)
            await s.inputs.put(None)
            return
        params = self._turn_params(req, p, s.arrival, s.rid)
        await s.inputs.put(StreamingInput(TokensPrompt(prompt_token_ids=cont), params))  # type: ignore[arg-type]

    async def _first_input(self, req: ChatRequest, prompt: list[int], params: Any) -> Any:
        """The session's first `StreamingInput`: the prompt with the first turn's `params`.
        When the request names a prefill engine, fetches the prompt's KV there (a network
        call) and, if it answers, puts its transfer parameters into `params`."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt

        if req.prefill_from is not None and self.prefill is not None:
            kv = await self.prefill.fetch(req.prefill_from, list(prompt))
            if kv is not None:  # vLLM takes the prefilled KV at the session's first turn
                params.extra_args["kv_transfer_params"] = kv
        # vLLM renders a TokensPrompt itself; its annotation names only pre-rendered inputs.
        return StreamingInput(TokensPrompt(prompt_token_ids=list(prompt)), params)  # type: ignore[arg-type]

    def _end_turn(
        self, req: ChatRequest, finish_reason: str, turn_ids: list[int], span: Any, p: Progress
    ) -> ParsedTurn:
        """A turn that finished: counts its tokens into the context, ends its span and parses
        its call (a scripted turn's takes it off the script)."""
        p.context += len(turn_ids) - 1  # vLLM drops the turn's last token from the context
        span.set_attribute("interlude.tokens", len(turn_ids))
        span.end()
        return self._parse(req, finish_reason, turn_ids, p)

    def _continuation(
        self,
        req: ChatRequest,
        messages: list[dict[str, Any]],
        turn_ids: list[int],
        turn: ParsedTurn,
        results: list[ToolResultEvent],
        p: Progress,
    ) -> list[int]:
        """The tokens that carry a turn's call results into the next turn (a scripted call's
        markup, never sampled, follows the turn). Appends the turn and its results to
        `messages` and counts the calls and the tokens in `p`."""
        p.calls += len(turn.calls)
        answers = [{"tool_call_id": r.call_id, "content": r.model_text} for r in results]
        if req.scripted:  # the call's markup was never sampled: it follows the turn
            cont = [turn_ids[-1]]
            cont += self.codec.scripted_continuation(messages, self._tools(req), turn, answers)
        else:
            cont = self.codec.continuation(messages, self._tools(req), turn, answers)
        messages.append(self.codec.assistant_message(turn))
        messages += [
            {"role": "tool", "tool_call_id": r.call_id, "content": r.model_text} for r in results
        ]
        p.context += len(cont)
        p.tool_tokens += len(cont)
        return cont

    def _parse(
        self, req: ChatRequest, finish_reason: str, turn_ids: list[int], p: Progress
    ) -> ParsedTurn:
        if req.scripted:
            return self._scripted_turn(finish_reason, turn_ids, p)
        # vLLM keeps a session's `stop_reason` from turn to turn, so look at the tokens.
        if not p.tools_on or finish_reason != "stop" or not self.codec.ends_call(turn_ids):
            return ParsedTurn(content="", calls=())
        return self.codec.parse(self.codec.turn_text(turn_ids), self._tools(req))

    def _scripted_turn(self, finish_reason: str, turn_ids: list[int], p: Progress) -> ParsedTurn:
        """The turn with its scripted call, when it generated exactly the script's count."""
        text = self.codec.turn_text(turn_ids)
        if not p.script or finish_reason != "length" or len(turn_ids) != p.script[0].after_tokens:
            return ParsedTurn(content=text, calls=())  # the answer, or cut short by a limit
        step = p.script.pop(0)
        call = ToolCallRequest(new_call_id(self.codec.call_tag), step.tool, step.arguments)
        return ParsedTurn(content=text, calls=(call,))

    async def _run_calls(
        self, req: ChatRequest, turn: ParsedTurn, span: Any, p: Progress
    ) -> AsyncGenerator[Event, None]:
        """A turn's calls, under a `pause` span whose length `TOOL_WAIT` observes: each call's
        event, then the server-side results (on the bus), then for client-side calls `Paused`,
        the wait for the client's answer (which may change `p`) and its results."""
        bus = self.server
        published = await bus.published.names() if bus is not None else frozenset()
        server, client = split_sides(req, turn, published)
        for c in turn.calls:
            yield ToolCallEvent(c.id, c.name, c.arguments, "server" if c in server else "client")
        started = time.monotonic()
        pause = telemetry.tracer().start_span("pause")
        pause.set_attribute("interlude.tools", ",".join(c.name for c in turn.calls))
        try:
            done = (
                await asyncio.gather(*(self._server_call(bus, req, c, pause) for c in server))
                if bus is not None
                else []
            )
            for ev in done:
                yield ev
            if client:
                if self.client_wait is None:
                    raise RuntimeError("client-side tool calls need a SessionManager")
                yield Paused(
                    req.session_id,
                    tuple(c.id for c in client),
                    self.client_deadline_s,
                    p.prompt,
                    p.generated,
                    p.tool_tokens,
                )
                answer = await self._client_answer(self.client_wait, req, client)
                take_answer(req, answer, p)
                for ev in answer.results:
                    yield ev
        finally:
            pause.end()
            TOOL_WAIT.observe(
                time.monotonic() - started, exemplar=telemetry.exemplar(telemetry.carrier_of(pause))
            )

    async def _client_answer(
        self, wait: ClientWait, req: ChatRequest, client: list[ToolCallRequest]
    ) -> ClientAnswer:
        """The client's answer to its calls, through `wait`; ClientTimeout past the client
        deadline."""
        try:
            return await asyncio.wait_for(wait(req.session_id, client), self.client_deadline_s)
        except TimeoutError:
            names = [c.name for c in client]
            raise client_timeout(req.session_id, names, self.client_deadline_s) from None

    async def _server_call(
        self, bus: ServerTools, req: ChatRequest, c: ToolCallRequest, pause: Any
    ) -> ToolResultEvent:
        try:
            arguments = json.loads(c.arguments or "{}")
        except json.JSONDecodeError as exc:
            return ToolResultEvent(c.id, False, "", f"bad_arguments: {exc}")
        if not isinstance(arguments, dict):
            return ToolResultEvent(c.id, False, "", "bad_arguments: not a JSON object")
        now = time.time()
        call = ToolCall(
            call_id=c.id,
            session_id=req.session_id,
            engine_id=bus.engine_id,
            tool=c.name,
            arguments=arguments,
            deadline=now + self.tool_deadline_s,
            trace=telemetry.carrier_of(pause),
            issued_at=now,
        )
        result = await bus.call(call, req.tenant, req.tool_calls_cap)
        # The result's own span, under the pause, linked to the worker's span it names.
        with telemetry.tracer().start_as_current_span(
            "tool result",
            context=trace.set_span_in_context(pause),
            links=telemetry.links_to(result.trace),
        ) as span:
            span.set_attribute("interlude.call_id", result.call_id)
            span.set_attribute("interlude.ok", result.ok)
        return ToolResultEvent(c.id, result.ok, result.content, result.error)


async def _feed(inputs: asyncio.Queue[Any]) -> AsyncGenerator[Any, None]:
    """A session's inputs for vLLM, as `ChatRunner.run` puts them, until it puts None."""
    while (item := await inputs.get()) is not None:
        yield item
