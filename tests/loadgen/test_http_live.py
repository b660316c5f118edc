"""The HTTP load generator against real servers: stock vLLM's OpenAI server and the Interlude
stack, both on the tiny model. Each client mode runs a short script; what the servers
generated must be what the script asked, segment by segment."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from interlude.bench.http_servers import interlude_stack, served_name, stock_vllm
from interlude_loadgen.http.client import Target
from interlude_loadgen.http.plan import Conversation, Step
from interlude_loadgen.http.replay import replay, summarize
from interlude_loadgen.http.text import TextMaker

pytestmark = pytest.mark.engine

BLOCKS = 40
PLAN = [
    Conversation("a", "qa", 0.0, 40, (Step(6, "qa", 0.2, 9), Step(4, "qa", 0.1, 5), Step(3))),
    Conversation("b", "math", 0.1, 25, (Step(5, "math", 0.0, 3), Step(2))),
]


@pytest.fixture(scope="module")
def texts(tiny_model: str) -> TextMaker:
    return TextMaker.from_tokenizer(tiny_model)


@pytest.fixture(scope="module")
def stock(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("stock") / "vllm.log"
    with stock_vllm(tiny_model, True, BLOCKS, log) as url:
        yield url


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="module")
def interlude(tiny_model: str, stack_dir: Path) -> Iterator[str]:
    with interlude_stack(tiny_model, BLOCKS, stack_dir, 10.0) as url:
        yield url


def run(
    target: Target, plan: list[Conversation], texts: TextMaker, horizon: float
) -> dict[str, Any]:
    runs, span = asyncio.run(replay(target, plan, texts, horizon))
    row = summarize("arm", target.mode, runs, span)
    row["results"] = {r.conv_id: r for _, r in runs}
    return row


def test_texts_have_exact_token_counts(texts: TextMaker) -> None:
    for n in (1, 7, 300):
        assert texts.count(texts.text(n, seed=n)) == n
    assert texts.text(20, 1) != texts.text(20, 2)


def test_resubmit_mode_against_stock_vllm(stock: str, tiny_model: str, texts: TextMaker) -> None:
    row = run(Target(stock, served_name(tiny_model), "resubmit"), PLAN, texts, 60)
    got = {k: r.segment_tokens for k, r in row["results"].items()}
    assert got == {"a": [6, 4, 3], "b": [5, 2]}, row["first_errors"]
    assert (row["finished"], row["unfinished"], row["errors"]) == (2, 0, 0)
    assert row["results"]["a"].returned_tokens == 14
    assert row["results"]["a"].tool_wait_s >= 0.3
    assert row["routes"] == {}  # a stock server has no `interlude` extension
    # One wait per tool answer sent (2 + 1) whose continuation showed text (a random model's
    # few tokens may all decode to none), from the send to that first text.
    assert row["answers_sent"] == 3 and 1 <= row["resumes"] <= 3
    assert 0 < row["resume_wait_mean_s"] <= row["resume_wait_p99_s"] < 30


def test_resume_mode_resumes_the_parked_sessions(
    interlude: str, tiny_model: str, texts: TextMaker, stack_dir: Path
) -> None:
    row = run(Target(interlude, served_name(tiny_model), "resume"), PLAN, texts, 60)
    results = row["results"]
    assert {k: r.segment_tokens for k, r in results.items()} == {"a": [6, 4, 3], "b": [5, 2]}
    assert results["a"].routes == ["new", "resume", "resume"]
    assert results["b"].routes == ["new", "resume"]
    assert row["segments_off_script"] == 0 and row["finished"] == 2
    assert row["answers_sent"] == 3 and 1 <= row["resumes"] <= 3
    assert 0 < row["resume_wait_mean_s"] < 30
    metrics = httpx.get(interlude.removesuffix("/v1") + "/metrics", timeout=5).text
    fallbacks = [ln for ln in metrics.splitlines() if ln.startswith("interlude:gateway_fallbacks")]
    assert all(float(ln.rsplit(" ", 1)[1]) == 0 for ln in fallbacks), fallbacks
    # The scheduler parked each scripted call under the policy and resumed it (3 pauses).
    engine = json.loads((stack_dir / "stack.json").read_text())["engines"][0]
    load = httpx.get(engine + "/v1/load", timeout=5).json()
    assert sum(load["resumes"].values()) >= 3, load


def test_server_tools_mode_runs_the_calls_inside_one_request(
    interlude: str, tiny_model: str, texts: TextMaker
) -> None:
    row = run(Target(interlude, served_name(tiny_model), "server-tools"), PLAN[:1], texts, 60)
    r = row["results"]["a"]
    assert r.ok, r.error
    assert r.segment_tokens == [13] and r.routes == ["new"]
    assert r.end is not None and r.end - r.start >= 0.3  # the scripted tool slept 0.2 + 0.1 s


def test_unfinished_conversations_count_at_the_horizon(
    stock: str, tiny_model: str, texts: TextMaker
) -> None:
    slow = Conversation("slow", "qa", 0.0, 20, (Step(3, "qa", 30.0, 4), Step(2)))
    row = run(Target(stock, served_name(tiny_model), "resubmit"), [PLAN[1], slow], texts, 3.0)
    assert (row["sessions"], row["finished"], row["unfinished"]) == (2, 1, 1)
    assert row["unfinished_fraction"] == 0.5
    assert row["results"]["slow"].segment_tokens == [3]  # what it did before the horizon
    # `slow`'s tool outlasts the horizon: its answer was never sent, so no wait is counted.
    assert row["answers_sent"] == 1 and row["resumes"] <= 1
    assert row["makespan_s"] == pytest.approx(3.0, abs=0.5)
