"""ToolCallCodec: tool calls as real models write them, read and answered with vLLM's own parsers.

A chat session is one vLLM streaming-input request. A turn is generated with the end-of-call
marker as its stop token, so it pauses exactly when a call is complete. vLLM keeps in the context
only computed tokens, not the turn's last sampled one (that stop token); so the continuation for
the tool results starts with the marker again, then what the chat template renders after it: the
end of the assistant turn, the tool messages and the next generation prompt, taken as the
difference between two renderings of the conversation, never from hard-coded ChatML.

Formats (`TOOL_PARSERS`), each read by the vLLM tool parser of the same name:
- `hermes`: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes, Qwen2.5/3).
- `qwen3_coder`: `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n
  </tool_call>` (Qwen3-Coder, Qwen3.5). Chosen because it too closes each call with a one-token
  marker, so the same stop-token pause applies; it is XML, so nothing here may assume JSON; and
  xgrammar can force it (`qwen_xml`). `llama3_json`, `mistral`, `pythonic` and the like end a
  call at end-of-sequence, which cannot tell a call from an answer until the turn is over.

Forcing a call (`tool_choice`) uses an xgrammar structural tag: the opening marker as a token id,
then the call's text, ending just before the closing marker, which the stop token then emits.
vLLM 0.32 facts this relies on (tested on the CPU build):
- A complete grammar allows only the request's stop ids (stop tokens plus EOS), and a stop id can
  never be part of a grammar; `forced_logit_bias` keeps EOS from ending a forced turn instead.
- vLLM keeps a session's FIRST turn's grammar and drops later turns' `structured_outputs`; our
  scheduler gives each turn its own instead (`enginecore/turn_grammar.py`), so a resumed turn
  may follow the continuation's `response_format` and a turn without one is free.
- `CompletionOutput.stop_reason` is not reset between a session's turns: use `ends_call`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from interlude.api.names import TOOL_NAME, new_call_id

if TYPE_CHECKING:
    from vllm.sampling_params import StructuredOutputsParams


@dataclass(frozen=True)
class ToolCallRequest:
    """One call the model made."""

    id: str  # "call_<hex>", unique; tool results refer to it
    name: str
    arguments: str  # JSON text of the arguments object (as in OpenAI's API)


@dataclass(frozen=True)
class ParsedTurn:
    """One generated turn, split into text and calls."""

    content: str  # assistant text outside tool calls ("" if none)
    calls: tuple[ToolCallRequest, ...]  # empty: the turn is a final answer


@dataclass(frozen=True)
class _Format:
    """What the codec needs to know about a format beyond what vLLM's parser does."""

    head: str  # text from the opening marker to the arguments; "{name}" is the tool's name
    tail: str  # text from the arguments to the closing marker
    args_style: str  # xgrammar JSONSchemaFormat style of the arguments
    # Text each complete call contains, where the parser accepts a truncated call (None: the
    # parser itself rejects one, as hermes does with incomplete JSON).
    call_close: str | None
    start: str = "<tool_call>"  # opening marker; one token
    end: str = "</tool_call>"  # closing marker; one token, the stop token of a call turn


_FORMATS = {
    "hermes": _Format('\n{"name": "{name}", "arguments": ', "}\n", "json", None),
    "qwen3_coder": _Format("\n<function={name}>\n", "\n</function>\n", "qwen_xml", "</function>"),
}
TOOL_PARSERS: tuple[str, ...] = tuple(_FORMATS)


class ToolCallCodec:
    """Renders prompts, parses turns and builds continuations for one tokenizer and format.

    `tokenizer` is what `AsyncLLM.get_tokenizer()` returns (a cached Hugging Face tokenizer with
    the model's chat template). No side effects beyond calling the tokenizer and vLLM's parser;
    safe to share between sessions (each parse builds its own parser instance).
    Invariant: `render_prompt(m) + turn tokens without the stop token + continuation(m, ...)`
    renders as `render_prompt(m + [assistant_message(turn)] + tool_messages(turn, results))`.
    """

    def __init__(self, tokenizer: Any, parser: str = "hermes", call_tag: str = "") -> None:
        """`call_tag`: this engine's `engine_tag`, written into every call id it issues."""
        if parser not in _FORMATS:
            raise ValueError(f"unknown tool parser {parser!r}; choose from {TOOL_PARSERS}")
        self.tokenizer = tokenizer
        self.parser = parser
        self.call_tag = call_tag
        self._fmt = _FORMATS[parser]
        self.start_marker, self.end_marker = self._fmt.start, self._fmt.end
        self._start_id = self._single_token(self.start_marker)
        self.stop_token_ids: tuple[int, ...] = (self._single_token(self.end_marker),)
        # Every special token but the markers: covers EOS and generation-config stop ids.
        markers = {self._start_id, *self.stop_token_ids}
        self.forced_logit_bias: dict[int, float] = {
            int(i): -100.0 for i in tokenizer.all_special_ids if int(i) not in markers
        }
        self._check_template()

    def _single_token(self, marker: str) -> int:
        ids = self.tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer has no single token for {marker!r} (got {ids})")
        return int(ids[0])

    def _check_template(self) -> None:
        """ValueError unless the chat template writes calls that this format's parser reads."""
        probe = ParsedTurn("", (ToolCallRequest("call_probe", "probe", '{"a": "b"}'),))
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
        text = self._render([*msgs, self.assistant_message(probe)], None, False)
        got = self.parse(text[len(self._render(msgs, None, True)) :], None).calls
        if [(c.name, json.loads(c.arguments)) for c in got] != [("probe", {"a": "b"})]:
            raise ValueError(f"the chat template does not render tool calls as {self.parser!r}")

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            _template_messages(messages), tools=tools, add_generation_prompt=gen, tokenize=False
        )
        return str(text)  # tokenize=False: always text

    def _encode(self, text: str) -> list[int]:
        # The template writes any BOS itself, as vLLM's chat path assumes.
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def turn_text(self, turn_ids: Sequence[int]) -> str:
        """A finished turn's text, markers included (what the parser reads). `ChatRunner` calls
        this once for each turn it parses: every turn of a scripted session, and a model's
        turn that ended at a call's closing marker."""
        return str(self.tokenizer.decode(list(turn_ids), skip_special_tokens=False))

    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """Token ids of OpenAI-style `messages` (and function `tools`) ready for generation."""
        return self._encode(self._render(messages, tools, True))

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
        """Split a detokenized turn (closing marker optional) with vLLM's parser.

        A malformed or truncated call gives no calls and the whole text as content.
        """
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        # The parsers read the tools (Qwen3's types arguments by their schema) from a request.
        request = ChatCompletionRequest.model_validate(
            {"model": "interlude", "messages": [], "tools": tools}
        )
        known: list[Any] = list(request.tools or [])
        parser = ToolParserManager.get_tool_parser(self.parser)(self.tokenizer, known)
        info = parser.extract_tool_calls(text, request)
        calls = tuple(
            ToolCallRequest(new_call_id(self.call_tag), c.function.name, c.function.arguments)
            for c in info.tool_calls
        )
        close = self._fmt.call_close
        if (
            not info.tools_called
            or not calls
            or not all(_is_object(c.arguments) for c in calls)
            or (close is not None and text.count(close) < len(calls))
        ):
            return ParsedTurn(content=text, calls=())
        return ParsedTurn(content=info.content or "", calls=calls)

    def ends_call(self, token_ids: Sequence[int]) -> bool:
        """Whether a finished turn's tokens end at a call's stop token."""
        return bool(token_ids) and int(token_ids[-1]) in self.stop_token_ids

    def assistant_message(self, turn: ParsedTurn) -> dict[str, Any]:
        """The turn as an OpenAI assistant message, for the conversation history."""
        if not turn.calls:
            return {"role": "assistant", "content": turn.content}
        return {
            "role": "assistant",
            "content": turn.content or None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in turn.calls
            ],
        }

    def tool_messages(
        self, turn: ParsedTurn, results: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """OpenAI tool messages for `results`, in their order; ValueError unless one per call."""
        ids = sorted(str(r.get("tool_call_id")) for r in results)
        if ids != sorted(c.id for c in turn.calls):
            raise ValueError(f"results answer {ids}, the calls are {[c.id for c in turn.calls]}")
        if not all(isinstance(r.get("content"), str) for r in results):
            raise ValueError("each tool result needs a text 'content'")
        return [
            {"role": "tool", "tool_call_id": r["tool_call_id"], "content": r["content"]}
            for r in results
        ]

    def continuation(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        turn: ParsedTurn,
        results: list[dict[str, Any]],
    ) -> list[int]:
        """Tokens to append to the parked session after `turn`, given `results` (one per call).

        `messages` is the conversation before the turn. The ids start with the stop token(s)
        vLLM dropped and end with the next generation prompt.
        """
        if not turn.calls:
            raise ValueError("continuation needs a turn with tool calls")
        said = [*messages, self.assistant_message(turn)]
        before = self._render(messages, tools, True)
        turn_text = self._render(said, tools, False)
        after = self._render([*said, *self.tool_messages(turn, results)], tools, True)
        if not (turn_text.startswith(before) and after.startswith(turn_text)):
            raise ValueError("the chat template does not render the conversation by appending")
        cut = turn_text.rfind(self.end_marker, len(before))
        if cut < 0:
            raise ValueError(f"the chat template renders the calls without {self.end_marker!r}")
        return self._encode(after[cut:])

    def scripted_continuation(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        turn: ParsedTurn,
        results: list[dict[str, Any]],
    ) -> list[int]:
        """Tokens after a scripted turn (`script.py`) whose text is `turn.content`: the call's
        markup as the template writes it, then what `continuation` appends. The caller puts
        the turn's last sampled token (which vLLM kept out of the context) before them.
        """
        said = [*messages, self.assistant_message(turn)]
        head = self._render(messages, tools, True) + turn.content
        after = self._render([*said, *self.tool_messages(turn, results)], tools, True)
        if not after.startswith(head):
            raise ValueError("the chat template does not render the turn's text as generated")
        return self._encode(after[len(head) :])

    def forced_call(self, tools: list[dict[str, Any]], tool_choice: str) -> StructuredOutputsParams:
        """`StructuredOutputsParams` making a turn one call: to any tool ("required") or the named.

        The grammar stops before the closing marker; pass `stop_token_ids` and
        `logit_bias=forced_logit_bias` with it.
        """
        return _structural(self._call(tools, tool_choice))

    def answer(
        self, schema: dict[str, Any], tools: list[dict[str, Any]] | None = None
    ) -> StructuredOutputsParams:
        """`StructuredOutputsParams` making a turn a JSON answer following `schema`, or, when
        `tools` are given, one call to any of them instead (`response_format` with tools on).

        Pass no `forced_logit_bias`: the answer ends at end-of-sequence, which the grammar
        allows only once the JSON is complete.
        """
        # One whitespace at most between tokens, as in a call's arguments.
        answer: dict[str, Any] = {"type": "json_schema", "json_schema": schema, "style": "json"}
        answer["max_whitespace_cnt"] = 1
        if not tools:
            return _structural(answer)
        return _structural({"type": "or", "elements": [self._call(tools, "required"), answer]})

    def _call(self, tools: list[dict[str, Any]], tool_choice: str) -> dict[str, Any]:
        """The structural-tag format of one call: the opening marker's token, then a body."""
        fns = [t.get("function") or {} for t in tools if t.get("type", "function") == "function"]
        if tool_choice != "required":
            fns = [f for f in fns if f.get("name") == tool_choice]
        if not fns:
            raise ValueError(f"tool_choice {tool_choice!r} names no tool of {len(tools)} given")
        bodies: list[dict[str, Any]] = []
        for f in fns:
            name = str(f.get("name", ""))
            if not TOOL_NAME.fullmatch(name):
                raise ValueError(f"tool name {name!r} is not a valid function name")
            schema = f.get("parameters") or {"type": "object", "properties": {}}
            head = {"type": "const_string", "value": self._fmt.head.replace("{name}", name)}
            # One whitespace at most between tokens: sampled JSON otherwise drifts into blank runs.
            args = {"type": "json_schema", "json_schema": schema, "style": self._fmt.args_style}
            args["max_whitespace_cnt"] = 1
            tail = {"type": "const_string", "value": self._fmt.tail}
            bodies.append({"type": "sequence", "elements": [head, args, tail]})
        body = bodies[0] if len(bodies) == 1 else {"type": "or", "elements": bodies}
        return {"type": "sequence", "elements": [{"type": "token", "token": self._start_id}, body]}

    def forced_turn(self, text: str) -> StructuredOutputsParams:
        """`StructuredOutputsParams` making a turn exactly `text`'s tokens, then the stop token.

        `text` is the turn up to the closing marker (one trailing marker is dropped). Pass
        `stop_token_ids` and `logit_bias=forced_logit_bias` with it.
        """
        if text.endswith(self.end_marker):
            text = text[: -len(self.end_marker)]
        ids = self._encode(text)
        if not ids or set(ids) & set(self.stop_token_ids):
            raise ValueError("a forced turn needs text before, and no, closing marker")
        tokens = [{"type": "token", "token": i} for i in ids]
        return _structural({"type": "sequence", "elements": tokens})


def _structural(fmt: dict[str, Any]) -> StructuredOutputsParams:
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(
        structural_tag=json.dumps({"type": "structural_tag", "format": fmt})
    )


def _is_object(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies with call arguments as objects: Hugging Face templates expect dicts, not JSON."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str) and _is_object(fn["arguments"]):
                    fn["arguments"] = json.loads(fn["arguments"])
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out
