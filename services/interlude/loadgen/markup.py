"""The chat template's own tokens, so a scripted conversation's budget counts its whole context.

A trace counts the tokens of prompts, generations and tool answers. What reaches the model is
more: the chat template wraps every message in role markers, declares the tools in a system
block, and writes each call as markup (Hermes: `<tool_call>{"name": ..., "arguments": {}}
</tool_call>`, then `<tool_response>` around the answer). On the tiny model a call costs ~50
tokens of markup, so a conversation of 11 calls cut to a 416-token budget reached 865 tokens and
overflowed an 864-token context (an HTTP 400 that counted as unfinished work).

`measure` renders small conversations with the server's tokenizer and takes differences; the
plan (`plan.scaled`) then cuts each conversation so that content plus markup fits the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Re-encoding a generated text can take a few more tokens than were generated (the client's
# resubmitted assistant turn); kept per call on top of the measured markup.
RETOKENIZE_SLACK = 4


@dataclass(frozen=True)
class Markup:
    """Tokens the template adds: once per conversation, and per call (its answer included)."""

    base_tokens: int = 0  # one tool's declaration, the prompt's markers, the answer's header
    per_tool_tokens: int = 0  # each further tool the conversation declares
    per_call_tokens: int = 0  # the call's markup, its answer's markers, the next header
    # Of `base_tokens`, those before the prompt's own text (the system block declaring the
    # tool): every conversation declaring the same tools starts with the same ones, which a
    # prefix cache shares between them.
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        counts = (self.base_tokens, self.per_tool_tokens, self.per_call_tokens, self.prefix_tokens)
        if min(counts) < 0:
            raise ValueError("markup token counts must be >= 0")
        if self.prefix_tokens > self.base_tokens:
            raise ValueError("markup prefix_tokens must be <= base_tokens")

    def fixed(self, tools: int) -> int:
        """What a conversation declaring `tools` tools costs before its first call."""
        return self.base_tokens + self.per_tool_tokens * max(0, tools - 1)

    def shared(self, tools: int) -> int:
        """The first tokens of `fixed(tools)` that conversations declaring the same tools share
        (the system block with the declarations; 0 when not measured)."""
        if not self.prefix_tokens:
            return 0
        return self.prefix_tokens + self.per_tool_tokens * max(0, tools - 1)


def declare(names: Sequence[str]) -> list[dict[str, Any]]:
    """The client's declaration of its tools (`client.tool_defs`), the same in every mode."""
    return [
        {
            "type": "function",
            "function": {"name": n, "description": f"{n} tool", "parameters": {"type": "object"}},
        }
        for n in names
    ]


def measure(tokenizer_dir: str, tool_names: Sequence[str]) -> Markup:
    """The markup of `tokenizer_dir`'s chat template, with the longest of `tool_names` declared
    and called (an upper bound for the others)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    longest = max(tool_names, key=len, default="tool")

    def ids_of(messages: list[dict[str, Any]], tools: int = 1) -> list[int]:
        declared: Any = declare([longest + "_" * i for i in range(tools)])
        ids: Any = tok.apply_chat_template(
            messages, tools=declared, add_generation_prompt=True, tokenize=True
        )
        if hasattr(ids, "keys"):  # a BatchEncoding on newer transformers
            ids = ids["input_ids"]
        return list(ids)

    def count(messages: list[dict[str, Any]], tools: int = 1) -> int:
        return len(ids_of(messages, tools))

    def call(i: int) -> list[dict[str, Any]]:
        cid = f"call_{i}"
        fn = {"name": longest, "arguments": "{}"}
        return [
            {"role": "assistant", "content": "", "tool_calls": [{"id": cid, "function": fn}]},
            {"role": "tool", "tool_call_id": cid, "content": ""},
        ]

    user = [{"role": "user", "content": ""}]
    base = count(user)
    prefix = _common_prefix(ids_of(user), ids_of([{"role": "user", "content": " two words"}]))
    one, two = count(user + call(0)), count(user + call(0) + call(1))
    per_call = max(one - base, two - one) + RETOKENIZE_SLACK
    per_tool = count(user, tools=2) - base
    return Markup(
        base_tokens=base, per_tool_tokens=per_tool, per_call_tokens=per_call, prefix_tokens=prefix
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
