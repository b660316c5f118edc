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
from interlude.loadgen.client import Target
from interlude.loadgen.model_calls import CALL_TOKENS
from interlude.loadgen.plan import Conversation, Step
from interlude.loadgen.replay import replay, summarize
from interlude.loadgen.text import TextMaker

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
    # With its tool parser (the tiny model's markup is Hermes'), so the model-call test can
    # run; scripted runs send tool_choice "none" and parse nothing.
    with stock_vllm(tiny_model, True, BLOCKS, log, tool_parser="hermes") as url:
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


def test_model_written_calls_against_stock_vllm(
    stock: str, tiny_model: str, texts: TextMaker
) -> None:
    """`--calls model`: the model writes each call (a named tool choice makes the random one do
    it, through vLLM's own constrained decoding and tool parser); the client answers each
    with the trace's next call and resubmits."""
    target = Target(stock, served_name(tiny_model), "resubmit", calls="model", tool_choice="named")
    row = run(target, PLAN, texts, 60)
    assert (row["finished"], row["errors"]) == (2, 0), row["first_errors"]
    # vLLM 0.32 does not hold a random model's arguments to the schema, so a call may run to
    # its token cap and end the conversation early: every conversation's count must add up.
    assert row["calls_answered"] >= 1, row
    for conv in PLAN:
        r = row["results"][conv.conv_id]
        calls = len(conv.steps) - 1
        assert len(r.segment_tokens) == r.calls_answered + 1 <= calls + 1, r
        assert r.ended_early == (r.calls_answered < calls) and r.calls_past_trace == 0, r
        answered = conv.steps[: r.calls_answered]
        assert r.returned_tokens == sum(s.return_tokens for s in answered), r
        assert r.tool_wait_s >= sum(s.delay_s for s in answered)
        assert all(
            n <= s.gen_tokens + CALL_TOKENS
            for n, s in zip(r.segment_tokens, conv.steps, strict=False)
        )
    assert row["answers_sent"] == row["calls_answered"]
    assert row["ended_early"] == sum(row["results"][c.conv_id].ended_early for c in PLAN)


def test_model_written_calls_resume_the_parked_session(
    interlude: str, tiny_model: str, texts: TextMaker
) -> None:
    """Against Interlude the model's own call parks the session and the answer resumes it.
    A request's tool choice binds a session's first turn only, so a random model writes one
    call: a one-call conversation. `required` here: Interlude holds it to the schema."""
    one = Conversation("m", "qa", 0.0, 30, (Step(5, "qa", 0.1, 7), Step(4)))
    target = Target(
        interlude, served_name(tiny_model), "resume", calls="model", tool_choice="required"
    )
    row = run(target, [one], texts, 60)
    r = row["results"]["m"]
    assert r.ok, r.error
    assert r.routes == ["new", "resume"]
    assert (r.calls_answered, r.ended_early, r.calls_past_trace) == (1, False, 0)
    assert r.returned_tokens == 7 and len(r.segment_tokens) == 2


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
