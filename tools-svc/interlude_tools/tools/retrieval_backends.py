"""Where the "retrieval" tool's passages come from: BM25 over local documents, or a service.

Apart from the tool (`interlude_tools.tools.retrieval`) so each stays small, and so another backend
(a vector store, say) is one more class with a `search` method, the tool unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import bm25s  # type: ignore[import-untyped]
import httpx

from interlude_tools.registry import RetriableToolError

# bm25s sets its own logger to DEBUG on import, which a worker's level does not override:
# every index build would print to the pod's log whatever --log-level says.
logging.getLogger("bm25s").setLevel(logging.WARNING)

# The documents shipped with the package, in its root folder (`interlude_tools/corpus/`; package
# data: `interlude_tools = ["corpus/*"]`).
DEFAULT_CORPUS_DIR = Path(__file__).parent.parent / "corpus"


@dataclass(frozen=True)
class Passage:
    """One piece of a document: what a search finds and the model reads."""

    doc_id: str  # the document it came from (a corpus file name, or the remote's id)
    title: str  # for citing: e.g. "outer-planets.md › Saturn" (file name and heading)
    text: str
    score: float = 0.0  # the backend's relevance (higher is better; 0: no match at all)


class SearchBackend(Protocol):
    """Where passages come from.

    Invariant: `search` returns at most `k` passages, best first, leaving out any that do not
    match the query at all (so an empty list means "nothing matches"). It has no side effects
    beyond reading its index or asking its service, so it may run concurrently with itself and
    may be run again for one call. A backend that fails in a way worth retrying (busy, briefly
    away) raises `RetriableToolError`; any other failure raises another exception.
    """

    async def search(self, query: str, k: int) -> list[Passage]: ...


@dataclass(frozen=True)
class Corpus:
    """Passages cut from local documents: what `Bm25Backend` indexes."""

    passages: tuple[Passage, ...]

    @classmethod
    def from_directory(cls, path: Path | str, max_passage_chars: int = 600) -> Corpus:
        """The `*.md` and `*.txt` files directly in `path`, cut at blank lines (paragraphs)
        and at markdown headings, each passage at most `max_passage_chars` long (longer
        paragraphs are cut between sentences). A passage's title is its file's name and the
        heading it sits under, so the model can cite it. ValueError if there are none."""
        if max_passage_chars < 40:
            raise ValueError(f"max_passage_chars must be >= 40, got {max_passage_chars}")
        directory = Path(path)
        files = sorted(p for p in directory.glob("*") if p.suffix in (".md", ".txt"))
        passages = tuple(
            passage
            for file in files
            for passage in _passages(file.name, file.read_text("utf-8"), max_passage_chars)
        )
        if not passages:
            raise ValueError(f"no passages in .md or .txt files in {directory}")
        return cls(passages)

    @classmethod
    def default(cls) -> Corpus:
        """The small general-knowledge corpus shipped with the package."""
        return cls.from_directory(DEFAULT_CORPUS_DIR)


def _passages(name: str, text: str, limit: int) -> list[Passage]:
    out: list[Passage] = []
    heading = ""
    for block in re.split(r"\n\s*\n", text):
        lines = []
        for line in block.strip().splitlines():
            if line.startswith("#"):  # a heading starts a new section (and ends a paragraph)
                heading = line.lstrip("#").strip()
            else:
                lines.append(line.strip())
        paragraph = " ".join(lines)
        title = f"{name} › {heading}" if heading else name
        out.extend(Passage(name, title, piece) for piece in _pieces(paragraph, limit))
    return out


def _pieces(paragraph: str, limit: int) -> list[str]:
    """`paragraph` in pieces of at most `limit` characters, cut between sentences if it can
    be, else between words (only a word longer than `limit` is cut)."""
    pieces: list[str] = []
    current = ""
    for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
        for word in sentence.split() if len(sentence) > limit else [sentence]:
            joined = f"{current} {word}".strip()
            if len(joined) <= limit:
                current = joined
                continue
            if current:
                pieces.append(current)
            current = word[:limit]
    if current:
        pieces.append(current)
    return pieces


def _stem(tokens: list[str]) -> list[str]:
    """Plural to singular, crudely ("moons" -> "moon"): so a question's words meet a text's.
    Applied to documents and queries alike, so its mistakes ("lens" -> "len") cancel out."""
    return [
        t[:-1] if len(t) > 3 and t.endswith("s") and not t.endswith("ss") else t for t in tokens
    ]


def _tokens(texts: list[str]) -> list[list[str]]:
    tokens: list[list[str]] = bm25s.tokenize(
        texts, stopwords="en", stemmer=_stem, return_ids=False, show_progress=False
    )
    return tokens


class Bm25Backend:
    """BM25 (the `bm25s` library) over a `Corpus`, indexed once when built.

    A search is CPU work (milliseconds for a small corpus); it runs on a thread so that the
    worker's event loop, which also keeps its calls claimed, never waits on it. The index is
    only read after it is built, so concurrent searches are safe.
    """

    def __init__(self, corpus: Corpus) -> None:
        self._passages = corpus.passages
        self._index: Any = bm25s.BM25()
        self._index.index(
            _tokens([f"{p.title}\n{p.text}" for p in corpus.passages]), show_progress=False
        )

    async def search(self, query: str, k: int) -> list[Passage]:
        return await asyncio.to_thread(self._search, query, k)

    def _search(self, query: str, k: int) -> list[Passage]:
        tokens = _tokens([query])
        if not tokens[0]:  # only stop words, or no words at all
            return []
        k = min(k, len(self._passages))  # bm25s refuses a k beyond the corpus
        found = self._index.retrieve(tokens, k=k, show_progress=False)
        return [
            replace(self._passages[int(i)], score=float(s))
            for i, s in zip(found.documents[0], found.scores[0], strict=True)
            if s > 0
        ]


class HttpBackend:
    """A remote search service: POST {"query", "k"} as JSON to `url`, which answers
    {"passages": [{"title", "text", "score", "id" (optional)}, ...]}, best first.

    Connection failures, timeouts (`timeout_s` for the whole request) and 5xx answers are
    worth retrying (`RetriableToolError`); a 4xx or an answer of another shape is a mistake
    that retrying will not fix (`RuntimeError`). One client per search: an `httpx` client is
    tied to the event loop it first ran on, and a search is rare next to a model's turn.
    """

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, got {url!r}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be finite and > 0, got {timeout_s}")
        self.url = url
        self.timeout_s = timeout_s

    async def search(self, query: str, k: int) -> list[Passage]:
        try:
            async with asyncio.timeout(self.timeout_s), httpx.AsyncClient() as client:
                response = await client.post(self.url, json={"query": query, "k": k})
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise RetriableToolError(
                f"search service {self.url} did not answer within {self.timeout_s} s"
            ) from exc
        except httpx.TransportError as exc:
            raise RetriableToolError(f"search service {self.url} unreachable: {exc!r}") from exc
        status = response.status_code
        if status >= 500:
            raise RetriableToolError(f"search service {self.url} answered {status}")
        if status != 200:  # a 4xx: the query or the URL is wrong, and will stay wrong
            raise RuntimeError(
                f"search service {self.url} answered {status}, not 200: {response.text[:200]!r}"
            )
        try:
            return _parse(response.json())[:k]
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"search service {self.url} sent a malformed answer: {exc}") from exc


def _parse(body: Any) -> list[Passage]:
    """The passages in a search service's answer; ValueError/KeyError/TypeError if malformed."""
    passages = []
    for item in body["passages"]:
        title, text, score = item["title"], item["text"], item["score"]
        if not (isinstance(title, str) and isinstance(text, str)):
            raise TypeError("a passage's title and text must be strings")
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            raise TypeError(f"a passage's score must be a finite number, got {score!r}")
        doc_id = item.get("id", title)
        passages.append(Passage(str(doc_id), title, text, float(score)))
    return passages
