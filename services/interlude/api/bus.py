"""The tool bus wire protocol: stream names, groups and the two messages, defined once.

Engines XADD `ToolCall`s to one request stream (`CALL_STREAM`) read by the tool workers'
consumer group (`TOOL_GROUP`); a worker XADDs the `ToolResult` to the calling engine's own
result stream (`result_stream(engine_id)`), read by that engine's group (`ENGINE_GROUP`).

Every stream entry has exactly two fields: `v` (the protocol version, a decimal string) and
`body` (the message as one JSON object). Decoding checks the version first, so a mixed fleet
fails loudly on the first message instead of misreading fields. Unknown keys in a body are
ignored: a newer peer may add optional keys without a version bump; removing or changing the
meaning of one needs `PROTOCOL_VERSION + 1`.

The streams and the done keys live in one Redis (not a cluster): the worker's post-and-ack is one
Lua script touching the call stream, a result stream and a done key together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

T = TypeVar("T")

PROTOCOL_VERSION = 1

CALL_STREAM = "interlude:tool-calls"
RESULT_STREAM_PREFIX = "interlude:tool-results:"
DONE_KEY_PREFIX = "interlude:tool-done:"
SUBMITTED_KEY_PREFIX = "interlude:tool-submitted:"
# Calls that crashed their workers too often: kept here for a person to look at, and answered
# to their engines with an error result.
DEAD_LETTER_STREAM = "interlude:tool-calls-dead"
TOOL_GROUP = "tools"
ENGINE_GROUP = "engine"

# The kinds a failed result's `error` starts with ("kind" or "kind: message").
ERROR_KINDS = ("timeout", "tool_error", "unknown_tool", "bad_arguments")
# The most a tool result may hold (UTF-8 bytes): results go into a Redis stream and then into a
# model's context, so one runaway tool must not fill either. Workers cap what their tools return
# and engines what any worker posts: a worker run with a larger cap, or one not of ours, is
# still held to the engine's.
MAX_RESULT_BYTES = 1 << 20


def result_stream(engine_id: str) -> str:
    """The stream an engine reads its results from: one per engine, so none reads another's."""
    if not engine_id:
        raise ValueError("engine_id must be a non-empty string")
    return f"{RESULT_STREAM_PREFIX}{engine_id}"


def done_key(call_id: str) -> str:
    """The key a worker sets (NX, with a TTL) when it posts `call_id`'s result: posted once."""
    return f"{DONE_KEY_PREFIX}{call_id}"


def submitted_key(call_id: str) -> str:
    """The key an engine sets (NX, with a TTL) when it queues `call_id`: queued once, however
    often a submit whose reply was lost is retried."""
    return f"{SUBMITTED_KEY_PREFIX}{call_id}"


class ProtocolError(ValueError):
    """A stream entry is not a message of this protocol version; the text names what is wrong."""


def _check_str(kind: str, name: str, value: object, *, empty: bool = False) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{kind}.{name} must be a string, got {type(value).__name__}")
    if not empty and not value:
        raise ValueError(f"{kind}.{name} must not be empty")


def _check_time(kind: str, name: str, value: object) -> None:
    # bool is an int subclass; a True timestamp is a bug, not 1970-01-01T00:00:01.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{kind}.{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{kind}.{name} must be finite and >= 0, got {value!r}")


def _check_trace(kind: str, trace: object) -> None:
    if not isinstance(trace, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in trace.items()
    ):
        raise ValueError(f"{kind}.trace must be a dict of str to str")


@dataclass(frozen=True)
class ToolCall:
    """One tool call an engine asks for; `call_id` is unique across the fleet.

    Frozen so that a call logged, submitted and kept for expiry is the same call everywhere.
    `arguments` and `trace` are dicts (JSON objects on the wire): frozen stops rebinding them,
    not mutating them, so treat them as read-only; a `ToolCall` is not hashable for that reason.
    """

    call_id: str
    session_id: str  # the paused request the result resumes
    engine_id: str  # whose result stream the result goes to
    tool: str
    arguments: dict[str, Any]  # JSON object: the tool's own argument schema
    # Unix seconds; past it the result is a "timeout" failure. Engines and workers compare it
    # with their own clocks, so those must be NTP-synced (skew eats into the tool's time).
    deadline: float
    # W3C trace context (e.g. {"traceparent": ..., "tracestate": ...}), carried unchanged so one
    # trace follows the request through engine -> tool pod -> resume.
    trace: dict[str, str] = field(default_factory=dict)
    issued_at: float = 0.0  # unix seconds, when the engine paused the request

    def __post_init__(self) -> None:
        for name in ("call_id", "session_id", "engine_id", "tool"):
            _check_str("ToolCall", name, getattr(self, name))
        if not isinstance(self.arguments, dict) or not all(
            isinstance(k, str) for k in self.arguments
        ):
            raise ValueError("ToolCall.arguments must be a dict with string keys")
        _check_time("ToolCall", "deadline", self.deadline)
        _check_time("ToolCall", "issued_at", self.issued_at)
        if self.deadline < self.issued_at:
            raise ValueError(
                f"ToolCall.deadline {self.deadline} is before issued_at {self.issued_at}"
            )
        _check_trace("ToolCall", self.trace)

    def encode(self) -> dict[str, str]:
        """Stream fields for XADD; ValueError if `arguments` is not JSON-serializable."""
        return _encode(_top_level(self))  # the field names are the wire keys

    @classmethod
    def decode(cls, fields: Mapping[Any, Any]) -> ToolCall:
        """The call in a stream entry's fields (str or bytes); ProtocolError if it is not one."""
        body = _decode_body("ToolCall", fields)
        return _build(
            "ToolCall",
            lambda: cls(
                call_id=_get(body, "ToolCall", "call_id", str),
                session_id=_get(body, "ToolCall", "session_id", str),
                engine_id=_get(body, "ToolCall", "engine_id", str),
                tool=_get(body, "ToolCall", "tool", str),
                arguments=_get(body, "ToolCall", "arguments", dict),
                deadline=_get_float(body, "ToolCall", "deadline"),
                trace=_get(body, "ToolCall", "trace", dict),
                issued_at=_get_float(body, "ToolCall", "issued_at"),
            ),
        )


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer to one call, or why there is none; what the model sees on resume.

    Invariant (checked): `ok` iff `error == ""`; a failure's `error` is "kind" or "kind: message"
    with kind in `ERROR_KINDS`, so the engine can branch on the kind and show the message.
    """

    call_id: str
    session_id: str
    engine_id: str
    ok: bool
    content: str  # the tool's output ("" on failure)
    error: str  # "" when ok; else e.g. "timeout: tool 'sleep' passed its deadline"
    finished_at: float  # unix seconds
    trace: dict[str, str] = field(default_factory=dict)  # the call's trace context, unchanged

    def __post_init__(self) -> None:
        for name in ("call_id", "session_id", "engine_id"):
            _check_str("ToolResult", name, getattr(self, name))
        if not isinstance(self.ok, bool):
            raise ValueError(f"ToolResult.ok must be a bool, got {type(self.ok).__name__}")
        _check_str("ToolResult", "content", self.content, empty=True)
        _check_str("ToolResult", "error", self.error, empty=True)
        if self.ok and self.error:
            raise ValueError("ToolResult.error must be empty when ok")
        if not self.ok and self.error_kind not in ERROR_KINDS:
            raise ValueError(
                f"ToolResult.error must start with one of {ERROR_KINDS}, got {self.error!r}"
            )
        _check_time("ToolResult", "finished_at", self.finished_at)
        _check_trace("ToolResult", self.trace)

    @property
    def error_kind(self) -> str:
        """The error's kind ("" when ok)."""
        return self.error.split(":", 1)[0].strip()

    @classmethod
    def success(cls, call: ToolCall, content: str, finished_at: float) -> ToolResult:
        return cls(
            call.call_id,
            call.session_id,
            call.engine_id,
            True,
            content,
            "",
            finished_at,
            call.trace,
        )

    @classmethod
    def failure(cls, call: ToolCall, kind: str, message: str, finished_at: float) -> ToolResult:
        error = f"{kind}: {message}" if message else kind
        return cls(
            call.call_id, call.session_id, call.engine_id, False, "", error, finished_at, call.trace
        )

    def within(self, max_bytes: int, source: str = "") -> ToolResult:
        """This result, or in its place a `tool_error` ("result too large", no content) when its
        content passes `max_bytes` in UTF-8; `source` says who returned it, for the message."""
        # A character is at most 4 bytes: most results need no encoding to be known small.
        if len(self.content) * 4 <= max_bytes:
            return self
        if (size := len(self.content.encode())) <= max_bytes:
            return self
        who = f"{source} returned " if source else ""
        error = f"tool_error: result too large: {who}{size} bytes (cap {max_bytes})"
        return replace(self, ok=False, content="", error=error)

    def encode(self) -> dict[str, str]:
        """Stream fields for XADD."""
        return _encode(_top_level(self))

    @classmethod
    def decode(cls, fields: Mapping[Any, Any]) -> ToolResult:
        """The result in a stream entry's fields (str or bytes); ProtocolError if it is not one."""
        body = _decode_body("ToolResult", fields)
        return _build(
            "ToolResult",
            lambda: cls(
                call_id=_get(body, "ToolResult", "call_id", str),
                session_id=_get(body, "ToolResult", "session_id", str),
                engine_id=_get(body, "ToolResult", "engine_id", str),
                ok=_get(body, "ToolResult", "ok", bool),
                content=_get(body, "ToolResult", "content", str),
                error=_get(body, "ToolResult", "error", str),
                finished_at=_get_float(body, "ToolResult", "finished_at"),
                trace=_get(body, "ToolResult", "trace", dict),
            ),
        )


def _top_level(message: Any) -> dict[str, Any]:
    """A message's fields by name, values as they are: json.dumps walks the nested ones, so
    `asdict`'s deep copy (most of an encode's time) buys nothing here."""
    return {f.name: getattr(message, f.name) for f in fields(message)}


def _encode(body: dict[str, Any]) -> dict[str, str]:
    try:
        text = json.dumps(body, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"message is not JSON-serializable: {exc}") from exc
    return {"v": str(PROTOCOL_VERSION), "body": text}


def _text(value: object) -> str:
    # redis-py returns bytes unless the client was made with decode_responses=True.
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode_body(kind: str, fields: Mapping[Any, Any]) -> dict[str, Any]:
    if not isinstance(fields, Mapping):
        raise ProtocolError(f"{kind}: stream entry has no fields (deleted or not a message)")
    flat = {_text(k): v for k, v in fields.items()}
    if "v" not in flat:
        raise ProtocolError(f"{kind}: missing field 'v' (protocol version)")
    version = _text(flat["v"])
    if version != str(PROTOCOL_VERSION):
        raise ProtocolError(
            f"{kind}: protocol version {version!r} in field 'v' is not supported "
            f"(this side speaks {PROTOCOL_VERSION})"
        )
    if "body" not in flat:
        raise ProtocolError(f"{kind}: missing field 'body'")
    try:
        body = json.loads(_text(flat["body"]))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{kind}: field 'body' is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ProtocolError(f"{kind}: field 'body' must be a JSON object")
    return body


def _get(body: dict[str, Any], kind: str, name: str, typ: type[T]) -> T:
    if name not in body:
        raise ProtocolError(f"{kind}: body is missing field {name!r}")
    value = body[name]
    if not isinstance(value, typ):
        raise ProtocolError(
            f"{kind}: field {name!r} must be {typ.__name__}, got {type(value).__name__}"
        )
    return value


def _get_float(body: dict[str, Any], kind: str, name: str) -> float:
    if name not in body:
        raise ProtocolError(f"{kind}: body is missing field {name!r}")
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"{kind}: field {name!r} must be a number, got {value!r}")
    return float(value)


def _build(kind: str, make: Callable[[], T]) -> T:
    # Field access raises ProtocolError itself; __post_init__'s ValueErrors become one here.
    try:
        return make()
    except ProtocolError:
        raise
    except ValueError as exc:
        raise ProtocolError(f"{kind}: {exc}") from exc
