"""The "retrieval" tool: BM25 over the shipped corpus and over local files, and the HTTP backend
against a real local HTTP server (answers, retried 5xx, timeouts, refusals, malformed bodies).

Sync tests driving coroutines with `asyncio.run`, as in the rest of tests/bus/.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from interlude.api.bus import ToolCall, ToolResult
from interlude.bus import EngineBus
from interlude_tools import Registry, ToolArgumentError, Worker
from interlude_tools.context import ToolEnv
from interlude_tools.tools.retrieval import (
    Bm25Backend,
    Corpus,
    HttpBackend,
    Passage,
    Retrieval,
    RetrievalConfig,
)

EngineFactory = Callable[..., AbstractAsyncContextManager[EngineBus]]
WorkerFactory = Callable[..., AbstractAsyncContextManager[Worker]]
Collect = Callable[..., Awaitable[list[ToolResult]]]
MakeCall = Callable[..., ToolCall]


@pytest.fixture(scope="module")
def shipped() -> Retrieval:
    """BM25 over the corpus shipped with the package, indexed once for the module."""
    return Retrieval()


def execute(tool: Retrieval, call: ToolCall) -> ToolResult:
    return asyncio.run(Registry([tool]).execute(call))


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("Which planet has the Great Red Spot?", "outer-planets.md › Jupiter"),
        ("What is the capital of Australia?", "capitals-asia-oceania.md › Oceania"),
        (
            "who constructed a regular 17-sided polygon",
            "modern-mathematicians.md › Carl Friedrich Gauss",
        ),
        ("the only metal that is liquid at room temperature", "metals.md › Mercury the metal"),
        ("why do neon signs glow", "noble-gases.txt"),
        ("how many astronauts walked on the Moon", "the-moon.md › Exploration"),
    ],
)
def test_bm25_finds_the_right_document(
    shipped: Retrieval, make_call: MakeCall, query: str, title: str
) -> None:
    [best, *_] = asyncio.run(shipped.backend.search(query, 3))
    assert best.title == title and best.score > 0
    result = execute(shipped, make_call("c1", "retrieval", {"query": query}))
    assert result.ok and result.content.startswith(f"[1] {title} (score ")


@pytest.mark.parametrize("k", [1, 2, 5])
def test_k_passages_at_most(shipped: Retrieval, make_call: MakeCall, k: int) -> None:
    passages = asyncio.run(shipped.backend.search("capital city", k))
    assert len(passages) == k
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)
    result = execute(shipped, make_call("c1", "retrieval", {"query": "capital city", "k": k}))
    assert result.content.count("\n[") == k - 1 and f"[{k}] " in result.content


def test_k_defaults_to_three(shipped: Retrieval, make_call: MakeCall) -> None:
    result = execute(shipped, make_call("c1", "retrieval", {"query": "capital city"}))
    assert "[3] " in result.content and "[4] " not in result.content


@pytest.mark.parametrize("query", ["zebra quantum xylophone", "what is the", "?!"])
def test_no_match_says_so(shipped: Retrieval, make_call: MakeCall, query: str) -> None:
    assert asyncio.run(shipped.backend.search(query, 3)) == []
    result = execute(shipped, make_call("c1", "retrieval", {"query": query}))
    assert result.ok and result.content == f"No passage matches the query {query!r}."


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"query": ""},
        {"query": "   "},
        {"query": "x" * 1001},
        {"query": 7},
        {"query": "tides", "k": 0},
        {"query": "tides", "k": 11},
        {"query": "tides", "k": "3"},
        {"query": "tides", "k": 2.5},
        {"query": "tides", "top": 3},
    ],
)
def test_bad_arguments_are_refused(
    shipped: Retrieval, make_call: MakeCall, arguments: dict[str, Any]
) -> None:
    result = execute(shipped, make_call("c1", "retrieval", arguments))
    assert not result.ok and result.error_kind == "bad_arguments", result.error


def test_run_checks_its_arguments_without_the_registry(shipped: Retrieval) -> None:
    with pytest.raises(ToolArgumentError, match="'k'"):
        asyncio.run(shipped.run({"query": "tides", "k": True}))
    with pytest.raises(ToolArgumentError, match="non-blank"):
        asyncio.run(shipped.run({"query": "\n"}))


def test_the_answer_is_capped(make_call: MakeCall) -> None:
    tool = Retrieval(config=RetrievalConfig(max_passage_chars=60, max_answer_chars=150))
    result = execute(tool, make_call("c1", "retrieval", {"query": "capital city", "k": 10}))
    assert result.ok and len(result.content) <= 150 and result.content.endswith("…")
    texts = [line for line in result.content.splitlines() if line and not line.startswith("[")]
    assert texts and all(len(text) <= 60 for text in texts)


def test_corpus_from_a_directory(tmp_path: Path, make_call: MakeCall, redis_url: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    long = " ".join(f"Sentence number {i} is about teapots." for i in range(20))
    (docs / "kitchen.md").write_text(
        f"Intro line before any heading.\n\n# Kitchen\n\n## Kettles\n\nA kettle boils water.\n"
        f"It whistles.\n\n## Teapots\n\n{long}\n"
    )
    (docs / "notes.txt").write_text("Plain notes about bicycles.\n\n\nSecond note on tyres.\n")
    (docs / "skip.py").write_text("print('not a document about kettles')\n")
    corpus = Corpus.from_directory(docs, max_passage_chars=120)
    titles = [p.title for p in corpus.passages]
    assert titles[:2] == ["kitchen.md", "kitchen.md › Kettles"]
    assert corpus.passages[1].text == "A kettle boils water. It whistles."
    teapots = [p for p in corpus.passages if p.title == "kitchen.md › Teapots"]
    assert len(teapots) > 1 and all(len(p.text) <= 120 for p in teapots)
    assert " ".join(p.text for p in teapots) == long  # cut between sentences, nothing lost
    assert titles[-2:] == ["notes.txt", "notes.txt"] and "skip.py" not in {
        p.doc_id for p in corpus.passages
    }
    [found] = asyncio.run(Bm25Backend(corpus).search("tyres", 3))
    assert found == Passage("notes.txt", "notes.txt", "Second note on tyres.", found.score)
    # A tool factory reads a relative corpus_dir from the config file's directory.
    tool = Retrieval.from_env(
        ToolEnv(redis_url, tmp_path), RetrievalConfig(corpus_dir=Path("docs"))
    )
    result = execute(tool, make_call("c1", "retrieval", {"query": "does a kettle whistle"}))
    assert result.content.startswith("[1] kitchen.md › Kettles")


def test_an_empty_corpus_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no passages"):
        Corpus.from_directory(tmp_path)


@pytest.mark.parametrize(
    "options",
    [
        {"url": "http://search", "corpus_dir": Path("docs")},
        {"url": "ftp://search"},
        {"timeout_s": 0},
        {"timeout_s": math.nan},
        {"max_passage_chars": 10},
        {"max_passage_chars": 600, "max_answer_chars": 500},
    ],
)
def test_config_is_checked(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetrievalConfig(**options)


def test_through_a_worker(
    make_call: MakeCall, open_engine: EngineFactory, open_worker: WorkerFactory, collect: Collect
) -> None:
    async def scenario() -> ToolResult:
        async with open_engine() as bus, open_worker(registry=Registry([Retrieval()])):
            await bus.submit(make_call("c1", "retrieval", {"query": "rings of ice", "k": 1}))
            [result] = await collect(bus, 1)
            return result

    result = asyncio.run(scenario())
    assert result.ok and result.content.startswith("[1] outer-planets.md › Saturn"), result


# --- the HTTP backend against a real local server -------------------------------------------
@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=lambda: {"passages": []})  # bytes are sent as they are
    delay_s: float = 0.0


@dataclass
class Service:
    """A search service on 127.0.0.1: answers `replies` in turn, then `default`."""

    url: str = ""
    replies: list[Reply] = field(default_factory=list)
    default: Reply = field(default_factory=Reply)
    requests: list[Any] = field(default_factory=list)


@pytest.fixture
def service() -> Iterator[Service]:
    state = Service()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            state.requests.append(json.loads(self.rfile.read(length)))
            reply = state.replies.pop(0) if state.replies else state.default
            time.sleep(reply.delay_s)
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up waiting (the timeout test)
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/search"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


PASSAGES = {
    "passages": [
        {
            "id": "tea-guide",
            "title": "Tea guide › Green tea",
            "text": "Brew at 80 C.",
            "score": 2.5,
        },
        {"title": "Tea guide › Black tea", "text": "Brew at 95 C.", "score": 1},
        {"title": "Unrelated", "text": "No match at all.", "score": 0},
    ]
}


def test_http_backend_answers(service: Service, make_call: MakeCall) -> None:
    service.default = Reply(body=PASSAGES)
    tool = Retrieval(config=RetrievalConfig(url=service.url))
    result = execute(tool, make_call("c1", "retrieval", {"query": "how hot for tea", "k": 3}))
    assert service.requests == [{"query": "how hot for tea", "k": 3}]
    assert result.ok and result.content == (
        "[1] Tea guide › Green tea (score 2.50)\nBrew at 80 C.\n\n"
        "[2] Tea guide › Black tea (score 1.00)\nBrew at 95 C."
    )
    passages = asyncio.run(HttpBackend(service.url).search("tea", 1))
    assert passages == [Passage("tea-guide", "Tea guide › Green tea", "Brew at 80 C.", 2.5)]


def test_http_5xx_is_retried_then_fails(service: Service, make_call: MakeCall) -> None:
    service.default = Reply(503, b"busy")
    result = execute(
        Retrieval(HttpBackend(service.url)), make_call("c1", "retrieval", {"query": "tea"})
    )
    assert not result.ok and result.error_kind == "tool_error"
    assert "answered 503" in result.error and "after 3 attempts" in result.error
    assert len(service.requests) == 3  # the first try and the tool's 2 retries


def test_http_5xx_once_then_answers(service: Service, make_call: MakeCall) -> None:
    service.replies = [Reply(502, b"bad gateway")]
    service.default = Reply(body=PASSAGES)
    result = execute(
        Retrieval(HttpBackend(service.url)), make_call("c1", "retrieval", {"query": "tea"})
    )
    assert result.ok and "Green tea" in result.content and len(service.requests) == 2


def test_http_timeout_is_retried_then_fails(service: Service, make_call: MakeCall) -> None:
    service.default = Reply(body=PASSAGES, delay_s=0.5)
    tool = Retrieval(HttpBackend(service.url, timeout_s=0.05))
    started = time.monotonic()
    result = execute(tool, make_call("c1", "retrieval", {"query": "tea"}))
    assert not result.ok and result.error_kind == "tool_error", result.error
    assert "did not answer within 0.05 s" in result.error and "after 3 attempts" in result.error
    assert time.monotonic() - started < 1.0  # 3 x 0.05 s and 0.3 s of backoff, not 3 x 0.5 s


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(404, b"no such index"), "answered 404, not 200: 'no such index'"),
        (Reply(body=b"<html>oops</html>"), "malformed answer"),
        (Reply(body={"results": []}), "malformed answer"),
        (Reply(body={"passages": [{"title": 1, "text": "t", "score": 1}]}), "malformed answer"),
        (Reply(body={"passages": [{"title": "t", "text": "t", "score": "high"}]}), "malformed"),
    ],
)
def test_http_refusals_are_not_retried(
    service: Service, make_call: MakeCall, reply: Reply, message: str
) -> None:
    service.default = reply
    result = execute(
        Retrieval(HttpBackend(service.url)), make_call("c1", "retrieval", {"query": "tea"})
    )
    assert not result.ok and result.error_kind == "tool_error"
    assert message in result.error and "attempts" not in result.error
    assert len(service.requests) == 1


def test_http_unreachable_is_retried(free_port: Callable[[], int], make_call: MakeCall) -> None:
    tool = Retrieval(HttpBackend(f"http://127.0.0.1:{free_port()}/search"))
    result = execute(tool, make_call("c1", "retrieval", {"query": "tea"}))
    assert not result.ok and "unreachable" in result.error and "after 3 attempts" in result.error


def test_http_backend_checks_its_settings() -> None:
    with pytest.raises(ValueError, match="url"):
        HttpBackend("search.local")
    with pytest.raises(ValueError, match="timeout_s"):
        HttpBackend("http://search.local", timeout_s=-1)
