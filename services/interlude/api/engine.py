"""The engine's HTTP API beyond OpenAI's: the session routes' bodies, and the headers the
gateway and the engines agree on.

The session routes (`/v1/sessions...`) are the engine's native API (benchmarks and tests use
them); users reach `/v1/chat/completions` (`interlude.api.openai`). Message and tool shapes
are OpenAI's; everything else is ours. Errors always use OpenAI's envelope
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from interlude.api.messages import RequestError
from interlude.api.names import SEED_RANGE

# The caller's tenant, as the gateway authenticated it (its API key's name).
TENANT_HEADER = "x-interlude-tenant"
# The gateway's shared secret: an engine believes TENANT_HEADER only beside it, when it has one.
GATEWAY_TOKEN_HEADER = "x-interlude-gateway-token"
# The server-side tools the caller's key may run, comma-separated ("" none); absent: every
# published tool. Believed, as TENANT_HEADER, only from the gateway.
TOOLS_HEADER = "x-interlude-tools"
# The caller's caps on one engine (`Caps.header`, "sessions=N,tool_calls=M"); absent: none.
# Believed, as TENANT_HEADER, only from the gateway.
CAPS_HEADER = "x-interlude-caps"
# The base URL of the prefill engine the gateway chose for a new session (roles prefill and
# decode): the decode engine has the prompt prefilled there and takes its KV (`POST
# /v1/prefill`). Believed, as TENANT_HEADER, only from the gateway: anyone else could point the
# engine at any URL.
PREFILL_HEADER = "x-interlude-prefill"


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
        None,
        description="scripted tool calls (`interlude.api.script`), only on an engine in "
        "benchmark mode; null: not scripted",
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


# An engine's role (TetriInfer's instances; llm-d's and Dynamo's prefill and decode workers):
# a routing property, reported in `/v1/load`. "mixed" takes whole sessions (the default);
# "decode" takes new sessions and has their prompts prefilled by a "prefill" engine, which
# takes no session of its own. Any engine with the host link can hold any role.
ENGINE_ROLES = ("mixed", "prefill", "decode")


class RoleBody(BaseModel):
    """PUT /v1/role: change the engine's role (a flip; no restart)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["mixed", "prefill", "decode"]


class PrefillBody(BaseModel):
    """POST /v1/prefill (engine to engine): prefill these tokens and keep their KV for a decode
    engine on this host; the answer is `PrefillAnswer`."""

    model_config = ConfigDict(extra="forbid")

    prompt_token_ids: list[int] = Field(min_length=1)


class PrefillAnswer(BaseModel):
    """What the decode engine passes to vLLM as the session's `kv_transfer_params`."""

    kv_transfer_params: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int = Field(description="tokens the prefill engine found in its own cache")


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
        None,
        description="a scripted session's calls from here on (null: keep the rest); only in "
        "benchmark mode",
    )
    tool_choice: Literal["auto", "none"] | None = Field(
        None,
        description="whether the model's calls are parsed from here on (null: as before); "
        "a forced choice binds a session's first turn only, so it is not taken here",
    )


ErrorType = Literal[
    "invalid_request_error",
    "not_found_error",
    "conflict_error",
    "rate_limit_error",
    "server_error",
    "unavailable",
]


@dataclass(frozen=True)
class Caps:
    """What one tenant may hold at once on one engine (0: no cap): `sessions`, its live
    sessions (generating, waiting for a server-side tool, or parked for its client's tool
    results), and `tool_calls`, its server-side tool calls in flight. Each engine counts its
    own: the gateway routes without shared per-request state."""

    sessions: int = 0
    tool_calls: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 0 or self.tool_calls < 0:
            raise ValueError(f"caps must be >= 0 (0: no cap), got {self}")

    @property
    def capped(self) -> bool:
        return bool(self.sessions or self.tool_calls)

    def header(self) -> str:
        """The value of CAPS_HEADER (only the caps that are set)."""
        named = (("sessions", self.sessions), ("tool_calls", self.tool_calls))
        return ",".join(f"{name}={n}" for name, n in named if n)

    @classmethod
    def parse(cls, text: str) -> Caps:
        """CAPS_HEADER's value; names this engine does not know are skipped (a newer
        gateway), a malformed one is a RequestError naming the header."""
        caps: dict[str, int] = {}
        for item in (x.strip() for x in text.split(",")):
            name, _, value = item.partition("=")
            if not item or name not in ("sessions", "tool_calls"):
                continue
            if not value.isdigit():
                raise RequestError(f"{CAPS_HEADER}: {item!r} is not name=count", CAPS_HEADER)
            caps[name] = int(value)
        return cls(**caps)


NO_CAPS = Caps()


def from_gateway(headers: Mapping[str, str], gateway_token: str) -> bool:
    """Whether the gateway's headers count: it carries the token, or none is configured (then
    the engine port must be reachable from the gateway alone: the chart's NetworkPolicy)."""
    if not gateway_token:
        return True
    presented = headers.get(GATEWAY_TOKEN_HEADER, "").encode()
    return hmac.compare_digest(presented, gateway_token.encode())


def tools_of(headers: Mapping[str, str], gateway_token: str) -> frozenset[str] | None:
    """The server-side tools the caller may run: those the gateway names, or None (every
    published one) when it names none. With a `gateway_token` configured, a request without
    it (a caller inside the cluster, straight to the engine, past the gateway's keys) may run
    none; without a token the engine port is the gateway's alone (the NetworkPolicy)."""
    if not from_gateway(headers, gateway_token):
        return frozenset()
    named = headers.get(TOOLS_HEADER)
    return None if named is None else tool_list(named)


def caps_of(headers: Mapping[str, str], gateway_token: str) -> Caps:
    """The caller's caps, as the gateway names them; none for a request that is not the
    gateway's (a caller inside the cluster, straight to the engine)."""
    named = headers.get(CAPS_HEADER)
    if named is None or not from_gateway(headers, gateway_token):
        return NO_CAPS
    return Caps.parse(named)


def prefill_of(headers: Mapping[str, str], gateway_token: str) -> str | None:
    """The prefill engine the gateway chose for this request, or None (prefill here)."""
    named = headers.get(PREFILL_HEADER, "").strip()
    return named if named and from_gateway(headers, gateway_token) else None


def tool_list(named: str) -> frozenset[str]:
    """The names of a comma-separated tools list (blanks around names ignored; "" none)."""
    return frozenset(t for t in (x.strip() for x in named.split(",")) if t)


def tenant_of(headers: Mapping[str, str], gateway_token: str) -> str:
    """Whose request this is: the tenant the gateway names, or "" (a caller straight to the
    engine). With a `gateway_token` configured, the name counts only if the request carries
    that token; without one, the engine port must be reachable from the gateway alone (the
    chart's NetworkPolicy), and the header is taken as given."""
    return headers.get(TENANT_HEADER, "") if from_gateway(headers, gateway_token) else ""
