"""Results of HTTP runs: the side-by-side table, the SLO verdict, `loadgen compare`, plans."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from interlude.cli import app
from interlude.loadgen.plan import TINY, Scale, conversations, scaled
from interlude.loadgen.report import judge, load_rows, table_lines, verdict_lines
from interlude_workloads.types import Segment, TraceCall, TraceRequest


def row(arm: str, rate: float, median_ms: float, run: int = 0, **kw: Any) -> dict[str, Any]:
    base = {
        "arm": arm,
        "rate": rate,
        "run": run,
        "median_norm_latency_s": median_ms / 1000,
        "p90_norm_latency_s": median_ms / 500,
        "p99_norm_latency_s": median_ms / 250,
        "unfinished_fraction": 0.0,
        "finished_per_s": rate,
        "ttft_mean_s": 0.1,
        "ttft_p99_s": 0.2,
        "e2e_mean_s": 1.0,
        "e2e_p99_s": 2.0,
        "tokens_per_s": 50.0 * rate,
    }
    return base | kw


# The reference arm sets the SLO at 3 x 10 ms = 30 ms/token: it sustains 2, the other arm 4.
ROWS = [
    row("vllm-noprefix", 1, 10),
    row("vllm-noprefix", 2, 25),
    row("vllm-noprefix", 4, 90, unfinished_fraction=0.3),
    row("interlude", 1, 8),
    row("interlude", 2, 9),
    row("interlude", 4, 20),
]


def test_the_verdict_uses_the_reference_arms_slo_and_gives_the_ratio() -> None:
    v = judge(ROWS, "vllm-noprefix")
    (only,) = v["rounds"]
    assert math.isclose(only["slo_s_per_token"], 0.030)
    assert only["sustainable"]["vllm-noprefix"] == {"median": 2, "tail": 2}
    assert only["sustainable"]["interlude"] == {"median": 4, "tail": 4}
    assert v["ratios"]["vllm-noprefix"]["median"]["mean"] == 2.0
    assert v["ratios"]["vllm-noprefix"]["median"]["median"] == 2.0
    assert any("median rule 2.00x median of rounds" in line for line in verdict_lines(v))
    with pytest.raises(ValueError, match="reference arm"):
        judge(ROWS, "vllm-prefix")


def test_a_given_slo_judges_every_round_without_the_reference_arm() -> None:
    # A sweep continuing an earlier one at higher rates: the earlier round's SLO, no reference.
    mine = [r for r in ROWS if r["arm"] == "interlude"] + [row("vllm-prefix", 4, 40)]
    v = judge(mine, "vllm-noprefix", slo=0.030)
    (only,) = v["rounds"]
    assert math.isclose(only["slo_s_per_token"], 0.030)
    assert only["sustainable"]["interlude"] == {"median": 4, "tail": 4}
    assert only["sustainable"]["vllm-prefix"] == {"median": None, "tail": None}
    assert "SLO given (30.0 ms/token)" in verdict_lines(v)[-1]
    # The same rows with the reference arm's own SLO (10 ms at its lowest rate x 3) differ.
    assert judge(ROWS, "vllm-noprefix", slo=0.0085)["rounds"][0]["sustainable"]["interlude"] == {
        "median": 1,
        "tail": 1,
    }


def test_the_verdict_lines_name_the_ratio_and_say_when_there_is_no_reference() -> None:
    lines = verdict_lines(judge(ROWS, "vllm-noprefix"))
    assert lines[2].startswith("| 1 | 30.0 |")
    assert "median rule 2.00x" in lines[-1]
    # `bench http --arms interlude` runs no reference arm: a line, not a KeyError.
    (only,) = verdict_lines({})
    assert "reference arm did not run" in only


def test_the_table_has_a_line_per_rate_and_a_column_per_arm() -> None:
    lines = table_lines([*ROWS, row("interlude", 8, 50)])
    assert lines[0].count("|") == 4  # rate + two arms
    assert [ln.split("|")[1].strip() for ln in lines[2:]] == ["1", "2", "4", "8"]
    assert "not run" in lines[-1]  # the reference arm has no run at 8
    assert "20 / 80, 4, 0%" in lines[4]  # interlude at 4: p50 / p99 ms/token, fin/s, unfinished
    assert "30%" in lines[4]


def test_compare_prints_both_tables_from_files_and_draws_the_plot(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"meta": {}, "rows": ROWS[:3]}))
    b.write_text(json.dumps({"meta": {}, "rows": ROWS[3:]}))
    png = tmp_path / "curves.png"
    out = CliRunner().invoke(app, ["loadgen", "compare", str(a), str(b), "--plot", str(png)])
    assert out.exit_code == 0, out.output
    assert "vllm-noprefix: p50" in out.output and "interlude: p50" in out.output
    assert "| 1 | 30.0 | 2 / 2 | 4 / 4 |" in out.output
    assert "interlude / vllm-noprefix: median rule 2.00x" in out.output
    assert png.stat().st_size > 10_000
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a loadgen results file"):
        load_rows([bad])


def test_scaling_cuts_a_conversation_to_its_budget() -> None:
    call = TraceCall("qa", 40.0, 300)
    r = TraceRequest("r", "qa", 900, (Segment(90, call), Segment(90, call), Segment(30, None)))
    tiny = scaled(r, TINY, "c0", 1.5)
    assert tiny.prompt_tokens == 300 and tiny.arrival_s == 1.5
    assert [(s.gen_tokens, s.tool, s.delay_s, s.return_tokens) for s in tiny.steps] == [
        (30, "qa", 3.0, 100),  # 40 s / 10, capped at 3 s
        (30, "qa", 3.0, 100),
        (10, None, 0.0, 0),
    ]
    assert scaled(r, Scale(), "c0", 0).steps[0].return_tokens == 300
    small = Scale(budget_tokens=400)
    assert [s.tool for s in scaled(r, small, "c0", 0).steps] == [None]  # the first call leaves it


def test_poisson_plans_are_seeded_and_jsonl_plans_keep_their_times(tmp_path: Path) -> None:
    a = conversations("generated:mixed", 2.0, 10, 7, TINY, "x-")
    assert a == conversations("generated:mixed", 2.0, 10, 7, TINY, "x-")
    assert a[0].conv_id == "x-c0" and all(c.arrival_s < 10 for c in a)
    path = tmp_path / "t.jsonl"
    lines = [
        {"id": "b", "arrival_s": 3, "prompt_tokens": 9, "segments": [{"gen_tokens": 2}]},
        {"id": "a", "arrival_s": 1, "prompt_tokens": 9, "segments": [{"gen_tokens": 2}]},
        {"id": "z", "arrival_s": 99, "prompt_tokens": 9, "segments": [{"gen_tokens": 2}]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    timed = conversations(str(path), None, 10, 0, Scale(), "")
    assert [(c.arrival_s, c.prompt_tokens) for c in timed] == [(1, 9), (3, 9)]
    with pytest.raises(ValueError, match="give a rate"):
        conversations("generated:mixed", None, 10, 0, Scale())


def test_each_trace_call_type_becomes_a_declared_client_tool() -> None:
    from interlude.loadgen.client import tool_defs, tool_name
    from interlude.loadgen.plan import Conversation, Step

    assert tool_name("toolbench:weather") == "toolbench_weather"
    conv = Conversation("c", "mixed", 0, 9, (Step(2, "qa", 1, 3), Step(2, "math", 0, 1), Step(1)))
    assert [t["function"]["name"] for t in tool_defs(conv)] == ["math", "qa"]


def _rendered_tokens(model: str, conv: Any, texts: Any) -> int:
    """The conversation's whole context as the client sends it, through the chat template."""
    from transformers import AutoTokenizer

    from interlude.loadgen.client import tool_defs, tool_name

    tok = AutoTokenizer.from_pretrained(model)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": texts.text(conv.prompt_tokens, 1)}]
    for i, s in enumerate(conv.steps[:-1]):
        fn = {"name": tool_name(s.tool), "arguments": "{}"}
        call = {"id": f"c{i}", "type": "function", "function": fn}
        said, got = texts.text(s.gen_tokens, 2), texts.text(s.return_tokens, 3)
        msgs.append({"role": "assistant", "content": said, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": got})
    ids = tok.apply_chat_template(msgs, tools=tool_defs(conv), add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids) + conv.steps[-1].gen_tokens


def test_the_budget_counts_the_chat_templates_markup(tiny_model: str) -> None:
    from dataclasses import replace

    from transformers import AutoTokenizer

    from interlude.cli.loadgen import _with_markup
    from interlude.loadgen.markup import declare, measure
    from interlude.loadgen.text import TextMaker

    texts = TextMaker.from_tokenizer(tiny_model)
    budget = (28 - 2) * 32 // 2  # `bench http --blocks 28`: half the pool
    bare = replace(TINY, budget_tokens=budget)
    sized = _with_markup(bare, tiny_model, "generated:mixed", 0)
    assert sized.markup.per_call_tokens > 20 and sized.markup.base_tokens > 20
    # The system block: what two conversations with the same tool and different prompts share.
    assert 20 < sized.markup.prefix_tokens < sized.markup.base_tokens
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tools = declare(["calc"])
    one, two = (
        list(tok.apply_chat_template([{"role": "user", "content": text}], tools=tools)["input_ids"])
        for text in (" alpha beta", " gamma")
    )
    shared = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)
    assert shared == measure(tiny_model, ["calc"]).prefix_tokens
    plans = conversations("generated:mixed", 2.0, 20, 0, sized)
    assert any(len(c.steps) > 2 for c in plans)  # calls are still made
    assert max(_rendered_tokens(tiny_model, c, texts) for c in plans) <= budget
    # Content alone in the budget, as before: the markup takes some conversations past it.
    unsized = conversations("generated:mixed", 2.0, 20, 0, bare)
    assert max(_rendered_tokens(tiny_model, c, texts) for c in unsized) > budget


def test_the_stock_arms_command_lines(tiny_model: str) -> None:
    from interlude.bench.http_bench import ARMS
    from interlude.bench.http_servers import stock_vllm_argv

    argv = stock_vllm_argv(tiny_model, 8000, True, 40)
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "40"
    assert "--enable-prefix-caching" in argv and "--no-async-scheduling" not in argv
    sync = ARMS["vllm-prefix-sync"]
    argv = stock_vllm_argv(tiny_model, 8000, sync.prefix_caching, 40, sync.async_scheduling)
    assert "--enable-prefix-caching" in argv and argv[-1] == "--no-async-scheduling"
    assert "--no-enable-prefix-caching" in stock_vllm_argv(tiny_model, 8000, False, 40)
    # Tokens per streamed chunk, as our engine takes them (`--stream-interval` there too).
    chunky = stock_vllm_argv(tiny_model, 8000, True, 40, stream_interval=4)
    assert chunky[chunky.index("--stream-interval") + 1] == "4"


def test_resume_waits_count_a_continuation_still_waiting_at_the_horizon() -> None:
    """The resume wait (tool answer sent → next first token) of a continuation cut at the
    horizon counts with its wait so far, as unfinished conversations count in the latencies."""
    from interlude.loadgen.client import ConversationResult
    from interlude.loadgen.plan import Conversation, Step
    from interlude.loadgen.replay import summarize

    conv = Conversation("a", "qa", 0.0, 10, (Step(3, "qa", 1.0, 4), Step(2)))
    done = ConversationResult("a", start=0.0, first_token=0.1, end=2.0, segment_tokens=[3, 2])
    done.resume_sent = 1.2
    done.first_seen(1.4)  # the continuation's first token: 0.2 s after the answer went out
    assert done.resume_waits == [pytest.approx(0.2)] and done.first_token == 0.1
    cut = ConversationResult("b", start=0.5, first_token=0.6, segment_tokens=[3])
    cut.resume_sent = 3.0  # answer sent, no token yet when the run stops at 4.0
    done.answers_sent = cut.answers_sent = 1
    row = summarize("arm", "resume", [(conv, done), (conv, cut)], (0.0, 4.0))
    assert row["resumes"] == row["answers_sent"] == 2
    assert row["resume_wait_mean_s"] == pytest.approx((0.2 + 1.0) / 2)
    assert row["resume_wait_p99_s"] == pytest.approx(0.2 + 0.99 * 0.8)
    assert row["finished"] == 1 and row["unfinished"] == 1


def test_scaling_keeps_a_shared_head_within_the_prompt() -> None:
    r = TraceRequest("r", "k", 900, (Segment(30, None),), 600, "g")
    whole = scaled(r, Scale(), "c0", 0)
    assert (whole.shared_prefix_tokens, whole.prefix_group) == (600, "g")
    tiny = scaled(r, TINY, "c0", 0)  # tokens / 3
    assert (tiny.prompt_tokens, tiny.shared_prefix_tokens) == (300, 200)
    cut = scaled(r, Scale(budget_tokens=100), "c0", 0)  # the prompt cut to half the budget
    assert cut.shared_prefix_tokens == cut.prompt_tokens == 50
    alone = scaled(TraceRequest("r", "k", 900, (Segment(30, None),)), TINY, "c0", 0)
    assert (alone.shared_prefix_tokens, alone.prefix_group) == (0, "")
