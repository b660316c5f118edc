"""Text of an exact number of tokens, for prompts and tool answers of a scripted conversation.

A trace says "a prompt of 120 tokens", "the tool returned 60 tokens". With the server's
tokenizer at hand (`TextMaker.from_tokenizer`) we pick words that are one token each with a
leading space; byte-level BPE never merges across a space, so k such words are exactly k tokens
(checked on every text). Without one (`TextMaker.estimated`) text is 4 characters a token, the
InferCept trace reader's rule. Texts are drawn from a seeded generator per conversation, so two
conversations share no prefix (the prefix cache cannot help one with another's prompt).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

_FALLBACK_WORDS = ("data", "tool", "call", "time", "word", "text", "node", "page", "line", "item")


@dataclass(frozen=True)
class TextMaker:
    """`text(k, seed)`: k tokens of words; `count(text)`: tokens (None without a tokenizer)."""

    words: tuple[str, ...]  # each " word" is one token
    counter: Callable[[str], int] | None = None

    @classmethod
    def estimated(cls) -> TextMaker:
        return cls(tuple(f" {w}" for w in _FALLBACK_WORDS))

    @classmethod
    def from_tokenizer(cls, path: str, limit: int = 400) -> TextMaker:
        """Words of the tokenizer in `path` (a model directory) that encode to one token."""
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)

        def count(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=False))

        words: list[str] = []
        for piece in sorted(tok.get_vocab()):
            word = tok.convert_tokens_to_string([piece])
            if word.startswith(" ") and word[1:].isalpha() and len(word) >= 4 and count(word) == 1:
                words.append(word)
            if len(words) >= limit:
                break
        if len(words) < 10:
            raise ValueError(f"{path}: too few one-token words to write exact texts")
        return cls(tuple(words), count)

    def text(self, tokens: int, seed: int) -> str:
        rng = random.Random(seed)
        out = "".join(rng.choice(self.words) for _ in range(tokens))
        if self.counter is not None and self.counter(out) != tokens:
            raise ValueError(f"a text of {tokens} tokens came out as {self.counter(out)}")
        return out

    def count(self, text: str) -> int | None:
        return None if self.counter is None else self.counter(text)
