"""What a chat session reports while it runs: its state and the events of each leg.

A session's life is one ordered enum; `state.finished` is a comparison. A *leg* is what one
HTTP call streams: a submit or a resume streams events until the session pauses for the client
(`Paused`) or ends (`Done` or `Failed`). Events are frozen so one object can be queued, logged
and serialized without copies; `to_json()` is the wire form (its `type` names the event).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any, ClassVar


class SessionState(IntEnum):
    """A session's life in order; every state from FINISHED on is terminal."""

    QUEUED = 0  # accepted, not yet scheduled
    GENERATING = 1  # a turn is being generated
    AWAITING_TOOL = 2  # parked: a server-side tool runs on the bus
    AWAITING_CLIENT = 3  # parked: the client must post tool results (`resume`)
    FINISHED = 4  # ended normally (final answer, or a token/context/tool-call limit)
    FAILED = 5  # ended by an error (engine error, client deadline)
    CANCELLED = 6  # ended by `cancel` or a client that went away mid-leg

    @property
    def finished(self) -> bool:
        return self >= SessionState.FINISHED


@dataclass(frozen=True)
class Event:
    type: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class TextDelta(Event):
    """New assistant text (tool-call markup is held back: it becomes `ToolCallEvent`s)."""

    type: ClassVar[str] = "text"
    text: str
    tokens: int  # tokens generated since the previous text event (held-back markup included)


@dataclass(frozen=True)
class ToolCallEvent(Event):
    """The model called a tool; `side` says who runs it: "server" (the bus) or "client"."""

    type: ClassVar[str] = "tool_call"
    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (the parser normalizes it)
    side: str


@dataclass(frozen=True)
class ToolResultEvent(Event):
    """A tool's answer as the model will see it; `ok=False` carries the error text."""

    type: ClassVar[str] = "tool_result"
    call_id: str
    ok: bool
    content: str
    error: str = ""

    @property
    def model_text(self) -> str:
        """What the model reads: the content, or the error (tools fail visibly, not silently)."""
        return self.content if self.ok else f"error: {self.error}"


@dataclass(frozen=True)
class Paused(Event):
    """The session waits for the client's results for `call_ids` (its KV stays parked)."""

    type: ClassVar[str] = "paused"
    session_id: str
    call_ids: tuple[str, ...]
    deadline_s: float  # seconds the engine waits for `resume` before failing the session
    # The session's counters so far (as in `Done`), so a caller can bill each leg.
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_tokens: int = 0


@dataclass(frozen=True)
class Done(Event):
    """The session ended; `finish_reason` is OpenAI's ("stop" or "length")."""

    type: ClassVar[str] = "done"
    session_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    tool_tokens: int  # tokens appended for tool results (prefilled, not generated)
    tool_calls: int
    turns: int


@dataclass(frozen=True)
class Failed(Event):
    """The session ended by an error; `code` is an OpenAI-style error type."""

    type: ClassVar[str] = "error"
    session_id: str
    code: str
    message: str


LEG_END = (Paused, Done, Failed)
