"""The "retrieval" tool: knowledge QA over a passage store, answered as numbered passages.

The model asks a question in words and gets back the few passages that best match it, each
with the title it came from, so it can quote and cite them. Where the passages come from is a
`SearchBackend` (`interlude_tools.tools.retrieval_backends`): BM25 over local documents (the
default, over the small corpus shipped in `interlude_tools/corpus/`) or a remote search service.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from interlude_tools.context import ToolEnv
from interlude_tools.registry import Tool, ToolArgumentError
from interlude_tools.tools.retrieval_backends import (
    DEFAULT_CORPUS_DIR,
    Bm25Backend,
    Corpus,
    HttpBackend,
    Passage,
    SearchBackend,
)

__all__ = [
    "Bm25Backend",
    "Corpus",
    "HttpBackend",
    "Passage",
    "Retrieval",
    "RetrievalConfig",
    "SearchBackend",
]


@dataclass(frozen=True)
class RetrievalConfig:
    """Which backend the tool asks, and how much of what it finds goes into the answer."""

    # The search service's URL (`HttpBackend`); None: BM25 over `corpus_dir`.
    url: str | None = None
    timeout_s: float = 5.0
    # Documents for BM25; None: the corpus shipped with the package. Relative paths are read
    # from the config file's directory (`ToolEnv.base_dir`).
    corpus_dir: Path | None = None
    # The answer goes into the model's context: both caps keep one call from flooding it.
    max_passage_chars: int = 600
    max_answer_chars: int = 4000

    def __post_init__(self) -> None:
        if self.url is not None and self.corpus_dir is not None:
            raise ValueError("give url (a search service) or corpus_dir (local BM25), not both")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, got {self.url!r}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be finite and > 0, got {self.timeout_s}")
        if self.max_passage_chars < 40:
            raise ValueError(f"max_passage_chars must be >= 40, got {self.max_passage_chars}")
        if self.max_answer_chars < self.max_passage_chars:
            raise ValueError("max_answer_chars must be >= max_passage_chars")

    def backend(self, base_dir: Path = Path()) -> SearchBackend:
        """The backend this config names; BM25 builds its index here (file reads, CPU)."""
        if self.url is not None:
            return HttpBackend(self.url, self.timeout_s)
        directory = DEFAULT_CORPUS_DIR if self.corpus_dir is None else base_dir / self.corpus_dir
        return Bm25Backend(Corpus.from_directory(directory, self.max_passage_chars))


class Retrieval(Tool):
    """Knowledge QA: {"query": "...", "k": 3} -> the k best passages, numbered, with titles.

    Reads only (its backend's index or service): safe to run twice for one call.
    """

    name = "retrieval"
    description = (
        "search a knowledge base for passages answering a question; answers the best matches, "
        "numbered, each with the title of the document it comes from"
    )
    MAX_QUERY_CHARS = 1000
    MAX_K = 10
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_QUERY_CHARS,
                "pattern": "\\S",
                "description": "the question or keywords to search for",
            },
            "k": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_K,
                "default": 3,
                "description": "how many passages to return",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(
        self, backend: SearchBackend | None = None, config: RetrievalConfig | None = None
    ) -> None:
        """`backend` if given, else the one `config` names (default: BM25, shipped corpus)."""
        self.config = config or RetrievalConfig()
        self.backend = backend if backend is not None else self.config.backend()

    @classmethod
    def from_env(cls, env: ToolEnv, config: RetrievalConfig | None = None) -> Retrieval:
        """For tool factories: a relative `corpus_dir` is read from `env.base_dir`."""
        config = config or RetrievalConfig()
        return cls(config.backend(env.base_dir), config)

    async def run(self, arguments: dict[str, Any]) -> str:
        query = arguments.get("query")
        k = arguments.get("k", 3)
        if not isinstance(query, str) or not query.strip():
            raise ToolArgumentError(f"argument 'query' must be a non-blank string, got {query!r}")
        if len(query) > self.MAX_QUERY_CHARS:
            raise ToolArgumentError(f"argument 'query' is longer than {self.MAX_QUERY_CHARS}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.MAX_K:
            raise ToolArgumentError(f"argument 'k' must be an integer in [1, {self.MAX_K}]")
        passages = [p for p in (await self.backend.search(query, k))[:k] if p.score > 0]
        return self.answer(query, passages)

    def answer(self, query: str, passages: list[Passage]) -> str:
        """The passages as numbered, titled paragraphs within the config's caps."""
        if not passages:
            return f"No passage matches the query {query!r}."
        cap = self.config.max_passage_chars
        parts = []
        for number, p in enumerate(passages, 1):
            text = p.text if len(p.text) <= cap else p.text[: cap - 1] + "…"
            parts.append(f"[{number}] {p.title} (score {p.score:.2f})\n{text}")
        answer = "\n\n".join(parts)
        limit = self.config.max_answer_chars
        return answer if len(answer) <= limit else answer[: limit - 1] + "…"
