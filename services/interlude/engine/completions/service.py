"""One chat completion: resume the paused session it continues, or start one, and read its leg.

`ChatService.open` decides where the request goes (`Leg.route`):

* **resume** — the conversation ends with tool results that answer, exactly, the calls of a
  session paused for its client (found by the conversation's key, or by `x-session-id`), and
  the engine holding it is in the pool: the results go to that engine, which prefills only them.
* **fallback** — such a session was expected but is gone (expired, its engine restarted or left
  the pool, or the conversation changed): a new session recomputes the whole conversation. A
  paused session the client moved away from is cancelled so its KV is freed at once.
* **new** — anything else: a new session on the engine the pool chooses.

`Leg.events` then yields the engine's events; `Leg.fold` keeps what the response needs, and
when the leg ends paused for the client it records the session so the next request finds it.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from redis.exceptions import RedisError

from interlude import telemetry
from interlude.api.engine import ResumeBody, SubmitBody, ToolResultBody
from interlude.api.events import (
    Done,
    Event,
    Failed,
    Paused,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)
from interlude.api.messages import RequestError
from interlude.api.openai import ChatCompletionRequest, NamedToolChoice, Unsupported
from interlude.api.script import parse_script
from interlude.gateway import metrics
from interlude.gateway.config import GatewayConfig
from interlude.gateway.conversation import (
    answers_exactly,
    conversation_key,
    engine_messages,
    tool_defs,
    tool_return,
)
from interlude.gateway.pool import EnginePool, EngineState, NoEngine
from interlude.gateway.sessions import PausedSession, SessionStore
from interlude.gateway.stops import StopScanner
from interlude.gateway.upstream import EngineError, Upstream

log = logging.getLogger(__name__)


@dataclass
class _Waits:
    """What opening a leg waited on, in seconds (for `server-timing`)."""

    engine_s: float = 0.0  # the engine's answer (its headers, for a stream)
    store_s: float = 0.0  # the paused-session store

    @contextlib.contextmanager
    def on(self, part: Literal["engine_s", "store_s"]) -> Iterator[None]:
        """Add the time spent in the block to `part`, whether it returns or raises."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, part, getattr(self, part) + time.perf_counter() - t0)


@dataclass
class Leg:
    """One engine leg being read for one request (mutable: filled by `fold`)."""

    request: ChatCompletionRequest
    engine: str
    session_id: str  # the engine's
    alias: str  # the id the client may send back as `x-session-id`
    route: str  # "new", "resume" or "fallback"
    events: AsyncIterator[Event]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    base: tuple[int, int, int] = (0, 0, 0)  # session counters before this leg
    started: float = field(default_factory=time.monotonic)
    # For `server-timing`: time spent waiting on the engine (a stream: for its headers, then
    # for its events) and on the session store.
    upstream_s: float = 0.0
    store_s: float = 0.0
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

    def fold(self, ev: Event) -> str:
        """Take one engine event; returns the text the client may see now ("" if none)."""
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


class ChatService:
    """Routes chat completions to engines and remembers paused sessions.

    Side effects: engine calls (`Upstream`), records in the `SessionStore`, metrics.
    Invariant: a paused session is resumed by at most one request (the store's take is atomic).
    """

    def __init__(
        self, config: GatewayConfig, pool: EnginePool, upstream: Upstream, store: SessionStore
    ) -> None:
        self.config = config
        self.pool = pool
        self.upstream = upstream
        self.store = store

    async def open(
        self, req: ChatCompletionRequest, headers: Mapping[str, str], alias: str | None
    ) -> Leg:
        """Route `req` and open its leg. Raises Unsupported, NoEngine or EngineError."""
        req.check_supported()
        if len(req.messages) > self.config.max_messages:
            raise Unsupported("messages", f"at most {self.config.max_messages} messages")
        max_tokens = req.max_completion_tokens or req.max_tokens or self.config.default_max_tokens
        if max_tokens > self.config.max_tokens:
            param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
            raise Unsupported(param, f"{param} must be <= {self.config.max_tokens}")
        messages, tools = engine_messages(req), tool_defs(req)
        _check_script(req, tools, max_tokens)
        waits = _Waits()
        leg, fallback = await self._resume(req, messages, tools, headers, alias, max_tokens, waits)
        if leg is None:
            with waits.on("engine_s"):
                engine, events, sid = await self._submit(req, messages, tools, headers, max_tokens)
            route = "fallback" if fallback else "new"
            metrics.ROUTES.labels(route).inc()
            leg = Leg(req, engine.url, sid, alias or sid, route, events, messages, tools)
            leg.stops = StopScanner(req.stops())
        leg.upstream_s, leg.store_s = waits.engine_s, waits.store_s
        return leg

    async def remember(self, leg: Leg) -> None:
        """Record a leg that ended paused for the client, so its continuation resumes it."""
        if leg.finish_reason != "tool_calls" or not leg.tool_calls:
            return
        key = conversation_key(
            leg.request.model, leg.tools, [*leg.messages, leg.assistant_message()]
        )
        deadline = leg.deadline_s or self.config.request_timeout_s
        prompt, completion, tool = leg.totals
        record = PausedSession(
            engine=leg.engine,
            session_id=leg.session_id,
            key=key,
            call_ids=tuple(c["id"] for c in leg.tool_calls),
            model=leg.request.model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            tool_tokens=tool,
            expires_at=time.time() + deadline,
        )
        t0 = time.perf_counter()
        try:
            await self.store.put(record, leg.alias)
        except (RedisError, OSError) as exc:
            # The answer still goes out; its continuation will be served by recompute.
            log.warning("session store unreachable, %s not recorded: %s", leg.session_id, exc)
            metrics.STORE_ERRORS.inc()
        leg.store_s += time.perf_counter() - t0

    async def cancel(self, leg: Leg) -> None:
        """Free the engine session of a leg nobody will read (stop string, disconnect)."""
        await self.upstream.cancel(leg.engine, leg.session_id)

    async def _resume(
        self,
        req: ChatCompletionRequest,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        headers: Mapping[str, str],
        alias: str | None,
        max_tokens: int,
        waits: _Waits,
    ) -> tuple[Leg | None, bool]:
        ret = tool_return(messages)
        key = conversation_key(req.model, tools, messages[: ret.prefix_len]) if ret else None
        record = None
        if alias or key is not None:  # a new conversation has nothing to look up
            try:
                with waits.on("store_s"):
                    record = await self.store.take_alias(alias) if alias else None
                    if record is None and key is not None:
                        record = await self.store.take(key)
            except (RedisError, OSError) as exc:
                # The store is away: serve by recompute rather than fail the request.
                log.warning("session store unreachable, recomputing: %s", exc)
                metrics.STORE_ERRORS.inc()
                record = None
        if record is None:
            if ret is not None:  # tool results for a session we do not hold (any more)
                metrics.FALLBACKS.labels("not_found").inc()
            return None, ret is not None
        if ret is None or record.key != key or not answers_exactly(ret, record.call_ids):
            reason = "conversation_changed"
        elif req.tool_choice not in (None, "auto", "none"):
            # A forced call binds a session's first turn only: a new session forces it.
            reason = "forced_tool_choice"
        elif not self.pool.is_ready(record.engine):
            reason = "engine_gone"
        else:
            body = ResumeBody(
                results=[ToolResultBody(tool_call_id=c, content=t) for c, t in ret.results],
                max_tokens=max_tokens,
                script=req.interlude_script,
                # "auto" or "none" (forced choices fall back above): calls parsed or not
                tool_choice=req.tool_choice,
            )
            try:
                with waits.on("engine_s"):
                    events = await self.upstream.resume(
                        record.engine, record.session_id, body, headers
                    )
            except EngineError as exc:
                if not (exc.unreachable or exc.status in (404, 409)):
                    raise
                reason = "engine_gone" if exc.unreachable else "session_gone"
            else:
                metrics.ROUTES.labels("resume").inc()
                base = (record.prompt_tokens, record.completion_tokens, record.tool_tokens)
                leg = Leg(
                    req,
                    record.engine,
                    record.session_id,
                    alias or record.session_id,
                    "resume",
                    events,
                    messages,
                    tools,
                    base=base,
                )
                leg.stops, leg.client_call_ids = StopScanner(req.stops()), set(record.call_ids)
                return leg, False
        metrics.FALLBACKS.labels(reason).inc()
        log.info("session %s: %s, recomputing", record.session_id, reason)
        with waits.on("engine_s"):
            await self.upstream.cancel(record.engine, record.session_id)
        return None, True

    async def _submit(
        self,
        req: ChatCompletionRequest,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        headers: Mapping[str, str],
        max_tokens: int,
    ) -> tuple[EngineState, AsyncIterator[Event], str]:
        choice = req.tool_choice
        script = req.interlude_script
        body = SubmitBody(
            session_id=f"gw-{uuid.uuid4().hex}",
            messages=messages,
            tools=tools,
            tool_choice=choice.function["name"]
            if isinstance(choice, NamedToolChoice)
            else choice or "auto",
            max_tokens=max_tokens,
            # OpenAI's default temperature is 1.
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            ignore_eos=bool(req.ignore_eos),
            script=script,
            max_tool_calls=16 if script is None else max(16, len(script)),
            kind=req.interlude_kind or "unknown",
        )
        tried: set[str] = set()
        while True:
            engine = self.pool.choose(req.model)
            if engine.url in tried:
                raise NoEngine(f"no engine for {req.model!r} could be reached", True)
            tried.add(engine.url)
            try:
                return (
                    engine,
                    await self.upstream.submit(engine.url, body, headers),
                    str(body.session_id),
                )
            except EngineError as exc:
                if not exc.unreachable:
                    raise
                # Another engine may still take it; this one will leave the pool on its own.
                engine.ready = False
                log.warning("engine %s unreachable: %s", engine.url, exc)


def _check_script(req: ChatCompletionRequest, tools: list[dict[str, Any]], max_tokens: int) -> None:
    """`Unsupported` naming the field of a bad `interlude_script` (the engine checks it too)."""
    if req.interlude_script is None:
        return
    if req.tool_choice not in (None, "auto"):
        raise Unsupported("tool_choice", "a request with interlude_script takes tool_choice auto")
    try:
        parse_script(req.interlude_script, tools, max_tokens)
    except RequestError as exc:
        param = exc.param or "script"
        field = "max_tokens" if param == "max_tokens" else f"interlude_{param}"
        raise Unsupported(field, str(exc).replace("script", "interlude_script", 1)) from None
