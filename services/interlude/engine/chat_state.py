"""What a chat session carries from one turn to the next, and the decisions made between turns.

`ChatRunner.run` (engine/chat.py) keeps the per-token loop; everything here is per turn or per
session: what a client posts to a paused session (`ClientAnswer`), the session's counters
(`Progress`), and pure functions of them (which calls run server-side, the finish reason, what a
client's answer changes, the event that ends the session).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from interlude.api.events import Done, Failed, ToolResultEvent
from interlude.api.names import CHOICES
from interlude.api.script import ScriptedCall
from interlude.engine.request import ChatRequest
from interlude.engine.toolcalls import ParsedTurn, ToolCallRequest


@dataclass(frozen=True)
class ClientAnswer:
    """What a client posts to a paused session: its tool results and, optionally, how many
    tokens the session may generate from here on (a new chat-completion request's own limit)."""

    results: list[ToolResultEvent]
    max_tokens: int | None = None
    script: tuple[ScriptedCall, ...] | None = None  # a scripted session's calls from here on
    # A continuation's own `tool_choice` (None: as before): "auto" or "none", whether the
    # model's calls are parsed from here on; "required" or a tool's name, the next turn is a
    # call (to that tool).
    tool_choice: str | None = None
    answer_format: AnswerFormat | None = None  # the answer's format from here on (None: as before)


@dataclass(frozen=True)
class AnswerFormat:
    """A continuation's `response_format`: the JSON Schema its answer follows (None: free text)."""

    schema: Mapping[str, Any] | None


ClientWait = Callable[[str, Sequence[ToolCallRequest]], Awaitable[ClientAnswer]]


@dataclass
class Progress:
    """Counters of one running session (mutable, private to `ChatRunner.run`)."""

    prompt: int
    context: int
    limit: int  # the session may generate up to this many tokens in all
    generated: int = 0
    tool_tokens: int = 0
    calls: int = 0
    turns: int = 0
    script: list[ScriptedCall] = field(default_factory=list)  # scripted calls still to make
    # The model's calls are parsed (its call markers stop a turn, and are held back from the
    # client): the request's tools and tool choice, until a resume's own choice changes it.
    tools_on: bool = False
    answer_schema: Mapping[str, Any] | None = None  # what an answer turn must follow, if anything
    force: str | None = None  # "required" or a tool's name: the next turn is that call


def finish_of(req: ChatRequest, turn: ParsedTurn, finish_reason: str, p: Progress) -> str:
    """The session's finish reason should it end with this turn (pure): "length" when the
    turn's calls are past the limits (they go unanswered and the session ends)."""
    finish = finish_reason
    if turn.calls and req.scripted:
        finish = "stop"  # the scripted call ends the turn, not the token limit
    if turn.calls and (p.calls >= req.max_tool_calls or p.generated >= p.limit):
        finish = "length"  # a call the limits leave unanswered ends the session
    return finish


def done_event(req: ChatRequest, finish: str, p: Progress) -> Done:
    """The session's last event, with its counters."""
    return Done(req.session_id, finish, p.prompt, p.generated, p.tool_tokens, p.calls, p.turns)


def split_sides(
    req: ChatRequest, turn: ParsedTurn, published: AbstractSet[str]
) -> tuple[list[ToolCallRequest], list[ToolCallRequest]]:
    """A turn's calls split into those run server-side and those left to the client (pure)."""
    # Server-side: the request's own tools that a worker publishes. A published name the
    # caller did not declare (a model may write any name) is the client's to handle.
    declared = {t["function"]["name"] for t in req.tools}
    if req.allowed_tools is not None:  # and only what the caller's key may run
        declared &= req.allowed_tools
    server = [c for c in turn.calls if c.name in published and c.name in declared]
    client = [c for c in turn.calls if c not in server]
    return server, client


def take_answer(req: ChatRequest, answer: ClientAnswer, p: Progress) -> None:
    """What a client's answer changes for the turns after it: the token limit, the script,
    whether calls are parsed or forced, the answer's format (in `p`)."""
    if answer.max_tokens is not None:
        p.limit = p.generated + answer.max_tokens
    if answer.script is not None and req.scripted:
        p.script = list(answer.script)
    if answer.tool_choice is not None:
        p.tools_on = bool(req.tools) and answer.tool_choice != "none"
        p.force = forced_call(answer.tool_choice)
    if answer.answer_format is not None:
        p.answer_schema = answer.answer_format.schema


def forced_call(tool_choice: str) -> str | None:
    """The call a `tool_choice` forces ("required" or a tool's name), or None."""
    return None if tool_choice in CHOICES[:2] else tool_choice


def root_cause(exc: BaseException) -> str:
    """The first cause's text: vLLM wraps the grammar compiler's own words (which say what
    in the schema it cannot take) in validation errors of each backend it tried."""
    seen: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and at not in seen:
        seen.append(at)
        at = at.__cause__ or at.__context__
    text = str(seen[-1]).strip()
    # xgrammar prefixes "[time] /path/file.cc:line: "; the message is what follows.
    return text.rsplit(": ", 1)[-1] if text.startswith("[") else text


class ClientTimeout(RuntimeError):
    """The client did not post tool results before its deadline; the session fails."""


def client_timeout(session_id: str, names: Sequence[str], deadline_s: float) -> ClientTimeout:
    """The error of a session whose client posted no results for calls `names` in time."""
    return ClientTimeout(
        f"session {session_id}: no results for tool call(s) {', '.join(names)} within "
        f"{deadline_s:g} s"
    )


def failed(session_id: str, exc: BaseException) -> Failed:
    """The `Failed` event for an exception that ended a session."""
    code = "timeout" if isinstance(exc, ClientTimeout) else "engine_error"
    return Failed(session_id, code, str(exc) or type(exc).__name__)
