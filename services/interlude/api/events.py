"""The events of a session's leg: what an engine streams to its callers, typed on both sides
(the engine encodes them with `to_json`; a reader of the session API, `decode`).

A *leg* is what one HTTP call streams: a submit or a resume streams events until the session
pauses for the client (`Paused`) or ends (`Done` or `Failed`). Events are frozen so one object
can be queued, logged and serialized without copies; `to_json()` is the wire form (its `type`
names the event), and clients see it too (`interlude.server_tool_events`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    type: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's log-probability and its most likely alternatives (`top`, best
    first, as many as the session asked for). vLLM's `-inf` is sent as `LOGPROB_FLOOR`, which
    JSON can carry, as vLLM's own server does."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class TextDelta(Event):
    """New assistant text (tool-call markup is held back: it becomes `ToolCallEvent`s)."""

    type: ClassVar[str] = "text"
    text: str
    tokens: int  # tokens generated since the previous text event (held-back markup included)
    # Of the tokens this text came from, when the session samples with logprobs ("" markup
    # tokens that were held back are not included).
    logprobs: tuple[TokenLogprob, ...] = ()


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
class TurnStart(Event):
    """A resumed turn was scheduled: how its KV came back (`kv`: "preserve", "swap",
    "prefix-cache" or "recompute") and how long it waited from the resume to its first step
    (`queue_s`). Only engines on Interlude's scheduler report it."""

    type: ClassVar[str] = "turn_start"
    session_id: str
    kv: str
    queue_s: float


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

EVENTS: dict[str, type[Event]] = {
    c.type: c for c in (TextDelta, ToolCallEvent, ToolResultEvent, TurnStart, Paused, Done, Failed)
}
# A field's annotation (a string: annotations are postponed) -> the JSON values it takes.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "tuple[str, ...]": (list, tuple),
    "tuple[TokenLogprob, ...]": (list, tuple),
}


def decode(payload: Mapping[str, Any]) -> Event | None:
    """The typed event of one wire frame.

    None for a `type` this side does not know (a newer engine's event: skipped, as the bus
    skips unknown fields); fields it does not know are ignored. ValueError naming the field
    when a known event lacks a field without a default or has one of the wrong JSON type.
    """
    cls = EVENTS.get(str(payload.get("type")))
    if cls is None:
        return None
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in payload:
            continue  # a default fills it, or the constructor below names it
        kwargs[f.name] = _checked(cls, f.name, str(f.type), payload[f.name])
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ValueError(f"{cls.type} event: {exc}") from None


def _checked(cls: type[Event], name: str, annotation: str, value: Any) -> Any:
    """`value` as field `name` of `cls` takes it; ValueError naming the field otherwise."""
    ok = _JSON_TYPES[annotation]
    if not isinstance(value, ok) or (isinstance(value, bool) and bool not in ok):
        raise ValueError(f"{cls.type} event: {name} must be {annotation}, got {value!r}")
    if isinstance(value, list | tuple) and annotation == "tuple[TokenLogprob, ...]":
        return tuple(_token_logprob(cls, name, v) for v in value)
    if isinstance(value, list | tuple):
        if not all(isinstance(v, str) for v in value):
            raise ValueError(f"{cls.type} event: {name} must hold strings")
        return tuple(value)
    return value


def _token_logprob(cls: type[Event], name: str, value: Any) -> TokenLogprob:
    try:
        pairs: list[Any] = list(value.get("top", ()))
        top = tuple((str(t), float(lp)) for t, lp in pairs)
        return TokenLogprob(str(value["token"]), float(value["logprob"]), top)
    except (AttributeError, KeyError, TypeError, ValueError):
        raise ValueError(f"{cls.type} event: {name} holds a malformed entry {value!r}") from None
