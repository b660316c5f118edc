"""Scripted sessions: the InferCept harness's way of making a random-weight model intercept.

A session is a prompt and segments: generate exactly N tokens, then call tool T, which returns K
tokens after D seconds. On our engine the session is one streaming-input request that parks at
each call; on stock vLLM (`resubmit=True`) every call ends the request and the continuation is
submitted again with the whole context, as today's servers do.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    """One segment: `gen_tokens` generated, then (unless last) a call of `tool`."""

    gen_tokens: int
    tool: str | None = None  # None: the session ends after this segment
    delay_s: float = 0.0  # how long the tool takes
    return_tokens: int = 0  # tokens the tool's answer adds to the context
    # Chat-template tokens that come with the answer (the call's markup, the answer's
    # markers): in the context like the answer, but not output (`bench engine --markup`).
    markup_tokens: int = 0

    def __post_init__(self) -> None:
        if self.gen_tokens < 1:
            raise ValueError("Step.gen_tokens must be >= 1")
        if min(self.delay_s, self.return_tokens, self.markup_tokens) < 0:
            raise ValueError("Step.delay_s, return_tokens and markup_tokens must be >= 0")
        if self.tool is not None and self.return_tokens < 1:
            raise ValueError("a tool call must return at least one token (it is the next input)")


@dataclass(frozen=True)
class ScriptedSession:
    session_id: str
    prompt_token_ids: tuple[int, ...]
    steps: tuple[Step, ...]
    kind: str = "unknown"

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"session {self.session_id}: empty prompt")
        if not self.steps:
            raise ValueError(f"session {self.session_id}: no steps")
        if self.steps[-1].tool is not None:
            raise ValueError(f"session {self.session_id}: the last step must not call a tool")


def tool_tokens(session_id: str, call: int, n: int, vocab: int = 400, first: int = 16) -> list[int]:
    """Deterministic stand-in for a tool's answer: `n` ordinary token ids (no specials)."""
    seed = sum(map(ord, session_id)) * 31 + call * 7
    return [first + (seed + i * 13) % vocab for i in range(n)]


@dataclass
class SessionResult:
    """What one session saw (times are `time.monotonic()` seconds)."""

    session_id: str
    start: float
    first_token: float | None = None
    end: float | None = None
    turns: list[list[int]] = field(default_factory=list)  # generated token ids per segment
    tool_wait_s: float = 0.0
    error: str | None = None

    @property
    def generated(self) -> int:
        return sum(len(t) for t in self.turns)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None
