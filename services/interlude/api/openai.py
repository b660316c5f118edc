"""OpenAI's chat-completions wire shapes, as far as Interlude serves them (the engines' chat route
parses them; the gateway documents them).

Requests are parsed leniently where OpenAI's clients differ (content as a string or as a list of
text parts, `max_tokens` or `max_completion_tokens`, unknown extension fields ignored), strictly
where a value's meaning would be a guess (booleans are JSON booleans), and strictly where we
cannot serve what is asked (images, audio, sampling features the engine lacks): those fail with
a 400 naming the parameter (`Unsupported`), never silently. Structured outputs
(`response_format` `json_object` / `json_schema`) and `logprobs` / `top_logprobs` are served,
resumed sessions included (docs/gateway.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

ROLES = ("system", "developer", "user", "assistant", "tool")


class Unsupported(ValueError):
    """A request asks for something this server cannot do (HTTP 400 naming `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def benchmark_only(param: str, server: str) -> Unsupported:
    """The 400 for scripted tool calls (`interlude_script`, the session API's `script`) on a
    `server` ("gateway", "engine") not in benchmark mode: a script makes the engine call any
    published tool with arguments the client wrote verbatim, no model involved, which turns a
    deployment into a proxy for its tools. Load generators need it; users do not."""
    return Unsupported(
        param,
        f"{param}: scripted tool calls are for benchmarks, and benchmark mode is off on this "
        f"{server} (start it with --benchmark-mode)",
    )


class _Lenient(BaseModel):
    # Clients add fields over time (and `extra_body`); what we do not use we ignore.
    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Lenient):
    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON text, as the model wrote it")


class MessageToolCall(_Lenient):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    def text(self, where: str) -> str | None:
        """The content as text: text parts are joined; any other part is `Unsupported`."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        texts = []
        for j, part in enumerate(self.content):
            kind = part.get("type")
            if kind not in ("text", "input_text"):
                raise Unsupported(
                    f"{where}.content[{j}].type",
                    f"content parts of type {kind!r} are not supported (text only)",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise Unsupported(f"{where}.content[{j}].text", "a text part needs a string text")
            texts.append(text)
        return "".join(texts)


class FunctionDef(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolDef(_Lenient):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: dict[str, Any]


MAX_TOP_LOGPROBS = 20  # OpenAI's limit, and vLLM's default `max_logprobs`
MAX_CHOICES = 16  # `n`: each choice is a session of its own


class JsonSchemaFormat(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    # The field is called `schema` on the wire; pydantic reserves that name.
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Lenient):
    """`response_format`: free text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format type json_schema needs a json_schema object")
        return self

    def answer_schema(self) -> dict[str, Any] | None:
        if self.type == "json_object":
            return {"type": "object"}
        if self.type == "json_schema" and self.json_schema is not None:
            return self.json_schema.schema_ or {"type": "object"}
        return None


class StreamOptions(_Lenient):
    include_usage: StrictBool | None = None
    # Ours: also stream server-side tool calls and results as extension chunks (README).
    include_tool_events: StrictBool | None = None


class ChatCompletionRequest(_Lenient):
    """POST /v1/chat/completions."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(None, ge=1)
    # Strict: `"stream": "yes"` is a 400 naming `stream`, not a guess.
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    # vLLM's extension (`extra_body`): generate exactly max_tokens, past the end-of-sequence
    # token. Benchmarks and scripted random-weight models need it; stock vLLM takes it too.
    ignore_eos: StrictBool | None = None
    # Ours (`extra_body`): scripted tool calls for random-weight benchmarks (docs/gateway.md).
    interlude_script: list[dict[str, Any]] | None = None
    # Ours: the conversation's augmentation kind, which the engine's policy learns its
    # predictions by (tool times, segment lengths); without it every session is "unknown".
    interlude_kind: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$"
    )
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    # Accepted at their neutral values only (the engine does not implement them yet).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return v

    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON Schema the answer must follow (None: free text)."""
        return self.response_format.answer_schema() if self.response_format else None

    def logprobs_k(self) -> int | None:
        """How many alternatives each token's logprob comes with (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def check_supported(self) -> None:
        """`Unsupported` for anything asked that this server would otherwise ignore."""
        if self.n is not None and self.n > MAX_CHOICES:
            raise Unsupported("n", f"n must be <= {MAX_CHOICES}")
        if (self.n or 1) > 1 and self.interlude_script is not None:
            raise Unsupported("n", "a scripted request takes n=1")
        if self.top_logprobs and not self.logprobs:
            raise Unsupported("top_logprobs", "top_logprobs needs logprobs: true")
        neutral: dict[str, Any] = {
            "frequency_penalty": (None, 0, 0.0),
            "presence_penalty": (None, 0, 0.0),
            "logit_bias": (None, {}),
            "audio": (None,),
        }
        for name, allowed in neutral.items():
            if getattr(self, name) not in allowed:
                raise Unsupported(name, f"{name} is not supported by this server")
        if self.response_format is not None and self.interlude_script is not None:
            raise Unsupported("response_format", "a scripted request takes no response_format")
        if self.modalities and set(self.modalities) != {"text"}:
            raise Unsupported("modalities", "only the 'text' modality is supported")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise Unsupported("tool_choice", "tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            chosen = self.tool_choice.function.get("name")
            if chosen not in {t.function.name for t in self.tools or ()}:
                raise Unsupported("tool_choice", f"tool_choice names no given tool: {chosen!r}")


# --- responses ---------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "interlude"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
