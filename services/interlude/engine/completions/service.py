"""One chat completion on this engine: resume the paused session it continues, or start one.

`ChatService.open` decides how the request is served (`Leg.route`):

* **resume** — the conversation ends with tool results that answer, exactly, the calls of a
  session of the caller's tenant paused here for its client (found by the conversation's key,
  or by `x-session-id`): only the results are prefilled.
* **fallback** — such a session was expected but is not here (expired, this engine restarted,
  the gateway could not route it here, or the conversation changed): a new session recomputes
  the whole conversation. A paused session the client moved away from is cancelled so its KV
  is freed at once.
* **new** — anything else.

The leg's events then come straight from the session (no HTTP hop); `Leg.fold` keeps what the
response needs, and a leg that ends paused for the client is recorded so its continuation
finds it (`remember`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from interlude.api.engine import NO_CAPS, Caps
from interlude.api.messages import RequestError
from interlude.api.names import SEED_RANGE
from interlude.api.openai import (
    ChatCompletionRequest,
    NamedToolChoice,
    Unsupported,
    benchmark_only,
)
from interlude.api.script import ScriptedCall, parse_script
from interlude.engine.caps import TooManySessions
from interlude.engine.chat_state import AnswerFormat
from interlude.engine.completions import metrics
from interlude.engine.completions.conversation import (
    answers_exactly,
    conversation_key,
    engine_messages,
    tool_defs,
    tool_return,
)
from interlude.engine.completions.leg import Leg
from interlude.engine.completions.stops import StopScanner
from interlude.engine.completions.store import PausedSession, SessionStore
from interlude.engine.request import ChatRequest
from interlude.engine.sessions import SessionConflict, SessionManager, UnknownSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatConfig:
    """What one chat completion may ask of this engine."""

    max_messages: int = 1024
    max_tokens: int = 8192  # the most a request may ask to generate
    default_max_tokens: int = 512  # when a request names no limit
    client_deadline_s: float = 300.0  # how long a session paused for its client is kept
    # Take scripted tool calls (`interlude_script`, the session API's `script`), which make the
    # engine call any published tool with the client's arguments: for load generators only.
    benchmark_mode: bool = False
    # A new session's prompt shorter than this is prefilled here even when the gateway names a
    # prefill engine: the hop would cost more than the prefill it saves.
    remote_prefill_min_tokens: int = 64

    def __post_init__(self) -> None:
        for name in (
            "max_messages",
            "max_tokens",
            "default_max_tokens",
            "client_deadline_s",
            "remote_prefill_min_tokens",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"ChatConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.default_max_tokens > self.max_tokens:
            raise ValueError("ChatConfig.default_max_tokens must be <= max_tokens")


class ChatService:
    """Serves OpenAI chat completions from this engine's sessions.

    Side effects: sessions started, resumed and cancelled on `sessions`; records in `store`;
    metrics. Invariant: a paused session is resumed by at most one request (the store's take
    is atomic on the event loop), and only by its own tenant.
    """

    def __init__(self, config: ChatConfig, sessions: SessionManager, model: str) -> None:
        self.config = config
        self.sessions = sessions
        self.model = model
        self.store = SessionStore()

    async def open(
        self,
        req: ChatCompletionRequest,
        tenant: str,
        alias: str | None,
        trace: Mapping[str, str],
        allowed: frozenset[str] | None = None,
        caps: Caps = NO_CAPS,
        prefill_from: str | None = None,
    ) -> list[Leg]:
        """Serve `req` for `tenant`, whose key may run `allowed` server-side (None: every
        published tool) within `caps`, new sessions prefilled at `prefill_from` (a prefill
        engine's URL; None: here): one leg per choice (`n`). The first is resumed or new (a
        resumed session keeps what its first request was allowed); the others are new sessions
        sampling with `seed + i`. Raises Unsupported, RequestError (a 400 naming the field),
        SessionConflict or TooManySessions (429), with nothing left running."""
        t0 = time.perf_counter()
        max_tokens = self._check(req)
        messages, tools = engine_messages(req), tool_defs(req)
        script = _parsed_script(req, tools, max_tokens)
        leg, fallback = await self._resume(req, tenant, messages, tools, alias, max_tokens)
        legs = [] if leg is None else [leg]
        try:
            # No await from this check to the last submit: two requests cannot both pass it.
            new = (req.n or 1) - len(legs)
            if caps.sessions and new and self.sessions.live(tenant) + new > caps.sessions:
                raise TooManySessions(caps.sessions)
            for i in range(len(legs), req.n or 1):
                route = "fallback" if fallback and i == 0 else "new"
                chat = self._chat_request(
                    req, messages, tools, max_tokens, script, trace, i, allowed, tenant, caps
                )
                if prefill_from is not None:
                    chat = dataclasses.replace(chat, prefill_from=prefill_from)
                events = self.sessions.submit(chat)
                metrics.ROUTES.labels(route).inc()
                sid = chat.session_id
                named = (alias if i == 0 else None) or sid
                leg = Leg(req, tenant, sid, named, route, events, messages, tools, index=i)
                leg.stops, leg.session_logprobs = StopScanner(req.stops()), chat.logprobs
                legs.append(leg)
        except BaseException:
            for opened in legs:
                await self.cancel(opened)
            raise
        ids = [leg.session_id for leg in legs]
        for leg in legs:
            leg.open_s = time.perf_counter() - t0
            leg.siblings = tuple(i for i in ids if i != leg.session_id)
        return legs

    def remember(self, leg: Leg) -> None:
        """Record a leg that ended paused for the client, so its continuation resumes it."""
        if leg.finish_reason != "tool_calls" or not leg.tool_calls:
            return
        key = conversation_key(self.model, leg.tools, [*leg.messages, leg.assistant_message()])
        deadline = leg.deadline_s or self.config.client_deadline_s
        prompt, completion, tool = leg.totals
        record = PausedSession(
            tenant=leg.tenant,
            session_id=leg.session_id,
            key=key,
            call_ids=tuple(c["id"] for c in leg.tool_calls),
            model=self.model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            tool_tokens=tool,
            expires_at=time.time() + deadline,
            logprobs=leg.session_logprobs,
            siblings=leg.siblings,
        )
        self.store.put(record, leg.alias)

    async def cancel(self, leg: Leg) -> None:
        """Free the session of a leg nobody will read (stop string, disconnect)."""
        with contextlib.suppress(UnknownSession):
            await self.sessions.cancel(leg.session_id)

    def _check(self, req: ChatCompletionRequest) -> int:
        """The request's token limit, after the checks the models cannot express."""
        req.check_supported()
        if req.interlude_script is not None and not self.config.benchmark_mode:
            raise benchmark_only("interlude_script", "engine")
        if req.model != self.model:
            raise Unsupported("model", f"the model {req.model!r} does not exist")
        if len(req.messages) > self.config.max_messages:
            raise Unsupported("messages", f"at most {self.config.max_messages} messages")
        _check_tool_schemas(req)
        _check_answer_schema(req)
        max_tokens = req.max_completion_tokens or req.max_tokens or self.config.default_max_tokens
        if max_tokens > self.config.max_tokens:
            param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
            raise Unsupported(param, f"{param} must be <= {self.config.max_tokens}")
        return max_tokens

    async def _resume(
        self,
        req: ChatCompletionRequest,
        tenant: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        alias: str | None,
        max_tokens: int,
    ) -> tuple[Leg | None, bool]:
        """The resumed leg, or (None, whether a resume was expected)."""
        ret = tool_return(messages)
        key = conversation_key(self.model, tools, messages[: ret.prefix_len]) if ret else None
        record = self.store.take_alias(tenant, alias) if alias else None
        if record is None and key is not None:
            record = self.store.take(tenant, key)
        if record is None:
            if ret is not None:  # tool results for a session this engine does not hold
                metrics.FALLBACKS.labels("not_found").inc()
            return None, ret is not None
        # The client went on with this choice: the request's other choices are over.
        for sibling in record.siblings:
            with contextlib.suppress(UnknownSession):
                await self.sessions.cancel(sibling)
        if ret is None or record.key != key or not answers_exactly(ret, record.call_ids):
            reason = "conversation_changed"
        elif not _logprobs_fit(req.logprobs_k(), record.logprobs):
            # vLLM fixes a session's logprobs at its first input: a new session asks anew.
            reason = "logprobs"
        else:
            results = [{"tool_call_id": c, "content": t} for c, t in ret.results]
            choice = _choice(req)
            answer = AnswerFormat(req.answer_schema())
            try:
                events = self.sessions.resume(
                    record.session_id, results, max_tokens, req.interlude_script, choice, answer
                )
            except (UnknownSession, SessionConflict):
                reason = "session_gone"
            except RequestError as exc:  # its response_format: the session stays paused
                self.store.put(record, alias or record.session_id)
                raise Unsupported(exc.param or "response_format", str(exc)) from None
            else:
                metrics.ROUTES.labels("resume").inc()
                base = (record.prompt_tokens, record.completion_tokens, record.tool_tokens)
                sid = record.session_id
                leg = Leg(req, tenant, sid, alias or sid, "resume", events, messages, tools)
                leg.base = base
                leg.stops, leg.client_call_ids = StopScanner(req.stops()), set(record.call_ids)
                leg.session_logprobs = record.logprobs
                return leg, False
        metrics.FALLBACKS.labels(reason).inc()
        log.info("session %s: %s, recomputing", record.session_id, reason)
        # The client moved away from the paused session: free its KV at once.
        with contextlib.suppress(UnknownSession):
            await self.sessions.cancel(record.session_id)
        return None, True

    def _chat_request(
        self,
        req: ChatCompletionRequest,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        max_tokens: int,
        script: tuple[ScriptedCall, ...] | None,
        trace: Mapping[str, str],
        choice: int,
        allowed: frozenset[str] | None,
        tenant: str,
        caps: Caps,
    ) -> ChatRequest:
        """Choice `choice`'s session for `tenant`: another seed per choice, so seeded choices
        differ."""
        seed = None if req.seed is None else _wrapped(req.seed + choice)
        return ChatRequest(
            session_id=f"sess-{uuid.uuid4().hex}",
            messages=tuple(messages),
            tools=tuple(tools),
            tool_choice=_choice(req) or "auto",
            max_tokens=max_tokens,
            # OpenAI's default temperature is 1.
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=seed,
            ignore_eos=bool(req.ignore_eos),
            max_tool_calls=16 if script is None else max(16, len(script)),
            kind=req.interlude_kind or "unknown",
            answer_schema=req.answer_schema(),
            logprobs=req.logprobs_k(),
            script=script,
            trace=dict(trace),
            allowed_tools=allowed,
            tenant=tenant,
            tool_calls_cap=caps.tool_calls,
        )


def _check_tool_schemas(req: ChatCompletionRequest) -> None:
    """`Unsupported` naming the tool whose `parameters` is not a valid JSON Schema: the model
    is told the schema, a forced call's grammar is built from it, and tool pods check
    arguments against it, so a broken one would fail later and less clearly."""
    for i, tool in enumerate(req.tools or ()):
        if tool.function.parameters is not None:
            _check_schema(tool.function.parameters, f"tools[{i}].function.parameters")


def _check_schema(schema: Mapping[str, Any], where: str) -> None:
    """`Unsupported` naming `where` when `schema` is not a valid JSON Schema."""
    problem = _schema_problem(json.dumps(schema, sort_keys=True))
    if problem is not None:
        raise Unsupported(where, f"{where} is not a valid JSON Schema: {problem}")


@functools.lru_cache(maxsize=1024)
def _schema_problem(schema: str) -> str | None:
    """Why the JSON Schema `schema` (its JSON text) is not valid; None if it is. Cached: an
    agent sends the same tools with every turn, and checking one against the metaschema costs
    more than the rest of the request's checks together."""
    try:
        Draft202012Validator.check_schema(json.loads(schema))
    except SchemaError as exc:
        return exc.message
    return None


def _wrapped(seed: int) -> int:
    """`seed` kept within the signed 64-bit range vLLM takes."""
    low, high = SEED_RANGE
    return low + (seed - low) % (high - low + 1)


def _choice(req: ChatCompletionRequest) -> str | None:
    """The request's `tool_choice` as a session takes it: a mode, or the forced tool's name."""
    choice = req.tool_choice
    return str(choice.function["name"]) if isinstance(choice, NamedToolChoice) else choice


def _check_answer_schema(req: ChatCompletionRequest) -> None:
    """`Unsupported` naming `response_format` when its schema is not a valid JSON Schema."""
    schema = req.answer_schema()
    if schema is not None:
        _check_schema(schema, "response_format.json_schema.schema")


def _logprobs_fit(wanted: int | None, session: int | None) -> bool:
    """Whether a session sampling with `session` alternatives per token serves `wanted`."""
    return wanted is None or (session is not None and session >= wanted)


def _parsed_script(
    req: ChatCompletionRequest, tools: list[dict[str, Any]], max_tokens: int
) -> tuple[ScriptedCall, ...] | None:
    """The request's `interlude_script`, parsed once (None: not scripted); `Unsupported`
    naming the field of a bad one."""
    if req.interlude_script is None:
        return None
    if req.tool_choice not in (None, "auto"):
        raise Unsupported("tool_choice", "a request with interlude_script takes tool_choice auto")
    try:
        return parse_script(req.interlude_script, tools, max_tokens)
    except RequestError as exc:
        param = exc.param or "script"
        field = "max_tokens" if param == "max_tokens" else f"interlude_{param}"
        raise Unsupported(field, str(exc).replace("script", "interlude_script", 1)) from None
