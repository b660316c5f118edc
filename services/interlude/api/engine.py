"""The engine's internal HTTP API: request bodies and the one error envelope.

Only the gateway talks to this API. Message and tool shapes are OpenAI's, so the gateway
passes them through; everything else is ours. Errors always use OpenAI's envelope
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from interlude.api.messages import RequestError
from interlude.api.names import SEED_RANGE
from interlude.api.wire import SSE_DONE, error_body, sse


class SubmitBody(BaseModel):
    """POST /v1/sessions: start a session; the response streams its first leg (SSE)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(None, description="unique id; generated when absent")
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    ignore_eos: bool = Field(False, description="generate past end-of-sequence (vLLM's)")
    max_tool_calls: int = Field(16, ge=0)
    kind: str = "unknown"
    script: list[dict[str, Any]] | None = Field(
        None, description="scripted tool calls (`interlude.api.script`); null: not scripted"
    )

    def choice(self) -> str:
        """tool_choice as a string: OpenAI's named form {"type": "function", ...} -> the name."""
        if isinstance(self.tool_choice, str):
            return self.tool_choice
        fn = self.tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestError(
                "tool_choice object must be {'type': 'function', 'function': {'name'}}",
                "tool_choice",
            )
        return name


class ToolResultBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1)
    content: str


class ResumeBody(BaseModel):
    """POST /v1/sessions/{id}/resume: the client's results; the response streams the next leg."""

    model_config = ConfigDict(extra="forbid")

    results: list[ToolResultBody] = Field(min_length=1)
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="tokens the session may generate from here on (default: what "
        "its first request allowed, minus what it generated)",
    )
    script: list[dict[str, Any]] | None = Field(
        None, description="a scripted session's calls from here on (null: keep the rest)"
    )
    tool_choice: Literal["auto", "none"] | None = Field(
        None,
        description="whether the model's calls are parsed from here on (null: as before); "
        "a forced choice binds a session's first turn only, so it is not taken here",
    )


ErrorType = Literal[
    "invalid_request_error", "not_found_error", "conflict_error", "server_error", "unavailable"
]

__all__ = ["SSE_DONE", "ErrorType", "ResumeBody", "SubmitBody", "error_body", "sse"]
