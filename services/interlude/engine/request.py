"""What a chat session is asked to do: `ChatRequest`, validated once when it is built.

Messages and tools have OpenAI's chat shapes, as the chat route passes them on; a bad field
raises `RequestError` naming it (the service answers HTTP 400 in the error envelope); the shapes
are checked in `messages.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interlude.api.messages import RequestError, check_messages, check_tools
from interlude.api.names import CHOICES, SEED_RANGE, SESSION_ID
from interlude.api.openai import MAX_TOP_LOGPROBS
from interlude.api.script import ScriptedCall


@dataclass(frozen=True)
class ChatRequest:
    """One session as the chat route or the session API submits it (OpenAI chat shapes)."""

    session_id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    # "auto" | "none" | "required" | a tool's name. A forced choice constrains the first turn
    # only: later turns follow the tool results ("auto").
    tool_choice: str = "auto"
    max_tokens: int = 256  # generated tokens over the whole session
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # generate past end-of-sequence (vLLM's extension)
    max_tool_calls: int = 16
    kind: str = "unknown"  # augmentation kind, for the policy's predictions
    # The JSON Schema an answer turn must follow (`response_format`); None: free text.
    answer_schema: Mapping[str, Any] | None = None
    # Alternatives per sampled token's logprob, for every turn of the session (vLLM fixes
    # the count at a session's first input); None: no logprobs.
    logprobs: int | None = None
    # Scripted tool calls (`script.py`); None: the model's own calls are parsed, as usual.
    script: tuple[ScriptedCall, ...] | None = None
    trace: Mapping[str, str] = field(default_factory=dict)  # caller's W3C trace context
    # The server-side tools the caller's key may run (None: every published one); a call to
    # another published tool goes to the client, as a call to a tool no worker publishes does.
    allowed_tools: frozenset[str] | None = None
    tenant: str = ""  # whose session it is (the gateway's key name; "" straight to the engine)
    # The most server-side calls of `tenant` in flight on this engine at once (0: no cap).
    tool_calls_cap: int = 0
    # The prefill engine the gateway chose (its base URL, `api.engine.PREFILL_HEADER`): the
    # prompt is prefilled there and its KV taken here. None: prefilled here.
    prefill_from: str | None = None

    def __post_init__(self) -> None:
        if not SESSION_ID.fullmatch(self.session_id):
            raise RequestError("session_id must be 1-128 of A-Z a-z 0-9 _ . : -", "session_id")
        check_messages(self.messages)
        names = check_tools(self.tools)
        if self.tool_choice not in CHOICES and self.tool_choice not in names:
            raise RequestError(
                f"tool_choice {self.tool_choice!r} is not {CHOICES} or a tool name", "tool_choice"
            )
        if self.tool_choice != "auto" and self.tool_choice != "none" and not self.tools:
            raise RequestError(
                "tool_choice forces a tool call but no tools were given", "tool_choice"
            )
        if self.max_tokens < 1 or self.max_tool_calls < 0:
            raise RequestError("max_tokens must be >= 1 and max_tool_calls >= 0", "max_tokens")
        if self.tool_calls_cap < 0:
            raise RequestError("tool_calls_cap must be >= 0 (0: no cap)", "tool_calls_cap")
        if not 0.0 <= self.temperature <= 2.0:
            raise RequestError("temperature must be in [0, 2]", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError("top_p must be in (0, 1]", "top_p")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise RequestError("seed must fit in a signed 64-bit integer", "seed")
        if self.script is not None and self.tool_choice != "auto":
            raise RequestError("a scripted request takes tool_choice 'auto' only", "tool_choice")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]", "logprobs")
        if self.script is not None and self.answer_schema is not None:
            raise RequestError("a scripted request takes no answer schema", "response_format")
        if self.script is not None and len(self.script) > self.max_tool_calls:
            raise RequestError("the script has more calls than max_tool_calls", "script")

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def scripted(self) -> bool:
        return self.script is not None


__all__ = ["CHOICES", "ChatRequest", "RequestError"]
