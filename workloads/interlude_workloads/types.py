"""The shape of a workload: augmented requests as alternating generation and tool calls.

A request is a prompt followed by segments. Each segment generates `gen_tokens` tokens and then
either stops at a tool call (the request pauses for `duration_s`, then the tool's answer of
`return_tokens` tokens is appended to the context and generation resumes) or, for the last
segment only, ends the request. Everything downstream (simulator, real-engine load generator,
benchmarks) consumes these frozen objects, so they validate themselves on construction: a bad
workload fails where it is built, not minutes into a simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; a True where a count belongs is a bug, not the number 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_type(name: str, value: object, cls: type) -> None:
    # ValueError, not TypeError: callers handle one error type for every invalid workload.
    if isinstance(value, cls):
        return
    raise ValueError(f"{name} must be a {cls.__name__}, got {value!r}")


def _check_name(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class TraceCall:
    """One interception: the model stopped to call a tool and waits for its answer."""

    # Tool type, e.g. "math", "qa", "venv", "chat", "image", "tts", "toolbench:<api>". The
    # policy may learn per-tool duration estimates keyed on it.
    tool: str
    # Seconds the tool takes (>= 0). Zero is still a pause: the engine must stop, hand the call
    # out and append the answer, even if the answer is immediately there.
    duration_s: float
    # Tokens the tool's answer appends to the context (>= 0).
    return_tokens: int

    def __post_init__(self) -> None:
        _check_name("TraceCall.tool", self.tool)
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0:
            raise ValueError(f"TraceCall.duration_s must be a finite number >= 0, got {d!r}")
        _check_int("TraceCall.return_tokens", self.return_tokens, 0)


@dataclass(frozen=True)
class Segment:
    """Tokens generated before a tool call, or before the end of the request."""

    # >= 1: a segment that generates nothing would be a call immediately after another call,
    # which engines cannot express (a turn always samples at least one token).
    gen_tokens: int
    # The call that ends this segment; None only for the request's last segment.
    call: TraceCall | None

    def __post_init__(self) -> None:
        _check_int("Segment.gen_tokens", self.gen_tokens, 1)
        if self.call is not None:
            _check_type("Segment.call", self.call, TraceCall)


@dataclass(frozen=True)
class TraceRequest:
    """One augmented request: a prompt, then segments separated by tool calls."""

    request_id: str
    # Augmentation type of the whole request (same vocabulary as TraceCall.tool; "toolbench"
    # for the multi-API mix whose calls are "toolbench:<api>").
    kind: str
    # >= 1 tokens of initial prompt (prefilled before the first segment generates).
    prompt_tokens: int
    # >= 1 segments; every segment but the last ends in a call, the last one ends the request.
    segments: tuple[Segment, ...]
    # The first `shared_prefix_tokens` of the prompt are the same tokens in every request of
    # `prefix_group` (a system prompt, a tool catalog): an engine's prefix cache holds them
    # once for all of the group. 0 and "": the prompt is the request's own.
    shared_prefix_tokens: int = 0
    prefix_group: str = ""

    def __post_init__(self) -> None:
        _check_name("TraceRequest.request_id", self.request_id)
        _check_name(f"request {self.request_id!r}: kind", self.kind)
        _check_int(f"request {self.request_id!r}: prompt_tokens", self.prompt_tokens, 1)
        self._check_shared_prefix()
        _check_type(f"request {self.request_id!r}: segments", self.segments, tuple)
        if not self.segments:
            raise ValueError(f"request {self.request_id!r}: needs at least one segment")
        for i, seg in enumerate(self.segments):
            _check_type(f"request {self.request_id!r}: segment {i}", seg, Segment)
            last = i == len(self.segments) - 1
            if last and seg.call is not None:
                # Nothing is generated after such a call, so it cannot be served as a pause.
                raise ValueError(f"request {self.request_id!r}: the last segment has a call")
            if not last and seg.call is None:
                raise ValueError(f"request {self.request_id!r}: segment {i} has no call")

    def _check_shared_prefix(self) -> None:
        where = f"request {self.request_id!r}"
        _check_int(f"{where}: shared_prefix_tokens", self.shared_prefix_tokens, 0)
        if not isinstance(self.prefix_group, str):
            raise ValueError(f"{where}: prefix_group must be a string, got {self.prefix_group!r}")
        if self.shared_prefix_tokens > self.prompt_tokens:
            raise ValueError(
                f"{where}: shared_prefix_tokens {self.shared_prefix_tokens} exceeds the prompt's "
                f"{self.prompt_tokens} tokens"
            )
        if bool(self.shared_prefix_tokens) != bool(self.prefix_group):
            raise ValueError(f"{where}: shared_prefix_tokens and prefix_group go together")

    @property
    def calls(self) -> tuple[TraceCall, ...]:
        """The tool calls in order."""
        return tuple(s.call for s in self.segments if s.call is not None)

    @property
    def num_calls(self) -> int:
        return len(self.segments) - 1

    @property
    def total_gen_tokens(self) -> int:
        return sum(s.gen_tokens for s in self.segments)

    @property
    def total_return_tokens(self) -> int:
        return sum(c.return_tokens for c in self.calls)

    @property
    def total_tool_time(self) -> float:
        """Seconds spent in tool calls (excluded from InferCept's normalized latency)."""
        return sum(c.duration_s for c in self.calls)

    @property
    def max_context(self) -> int:
        """Context at the end: prompt + everything generated + every tool answer."""
        return self.prompt_tokens + self.total_gen_tokens + self.total_return_tokens

    @property
    def contexts_at_calls(self) -> tuple[int, ...]:
        """Context length when each call starts (the KV a paused request holds, in tokens).

        This is the "context at call" statistic of DESIGN section 4's table.
        """
        out: list[int] = []
        ctx = self.prompt_tokens
        for seg in self.segments:
            ctx += seg.gen_tokens
            if seg.call is not None:
                out.append(ctx)
                ctx += seg.call.return_tokens
        return tuple(out)


@dataclass(frozen=True)
class Arrival:
    """A request entering the system at `time_s` seconds after the start of the run."""

    time_s: float
    request: TraceRequest
    # Unique per arrival, since the same trace request may be sampled twice:
    # f"{index}:{request_id}".
    arrival_id: str

    def __post_init__(self) -> None:
        t = self.time_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"Arrival.time_s must be a finite number >= 0, got {t!r}")
        _check_type("Arrival.request", self.request, TraceRequest)
        _check_name("Arrival.arrival_id", self.arrival_id)
