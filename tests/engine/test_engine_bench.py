"""`interlude bench engine`: a small real run of two arms, and the summary, ratios and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from interlude.bench.engine_bench import (
    EngineBenchSpec,
    _resubmitted_context,
    output_tokens,
    run_engine_bench,
    scale,
    scripted,
    system_block,
)
from interlude.bench.engine_report import plot_engine, ratios, summarize_runs
from interlude.bench.scripted import SessionResult
from interlude.loadgen.markup import Markup
from interlude.loadgen.plan import Conversation, Step
from interlude_workloads.arrivals import resolve_workload


def row(arm: str, fps: float, lat: float, run: int = 0) -> dict[str, Any]:
    return {
        "arm": arm,
        "run": run,
        "sessions": 10,
        "finished": fps * 10,
        "finished_per_s": fps,
        "median_norm_latency_s": lat,
        "ttft_mean_s": 1.0,
        "ttft_p99_s": 2.0,
        "recomputed_tokens": 100,
        "prefix_cache_hit_rate": 0.5,
        "kv_waste_gb_s": 0.0,
    }


def test_summary_keeps_every_run_and_ratios_use_the_means() -> None:
    rows = [row("vllm-prefix", 4.0, 0.3), row("interlude", 7.0, 0.01)]
    rows += [row("vllm-prefix", 2.0, 0.5, 1), row("interlude", 8.0, 0.03, 1)]
    summary = summarize_runs(rows)
    assert [r["arm"] for r in summary] == ["vllm-prefix", "interlude"]
    stock, ours = summary
    assert stock["runs"] == 2 and stock["finished_per_s"] == pytest.approx(3.0)
    assert stock["finished_per_s_range"] == (2.0, 4.0)
    assert ours["median_norm_latency_s"] == pytest.approx(0.02)
    got = ratios(summary)
    assert set(got) == {"vllm-prefix"}  # no no-prefix arm ran
    assert got["vllm-prefix"] == {"ratio": pytest.approx(7.5 / 3.0), "target": 1.5}
    assert ratios(summary[:1]) == {}  # without our arm there is nothing to compare


def test_plot_writes_a_png(tmp_path: Path) -> None:
    spec = {"num_gpu_blocks": 40, "rate": 16.0, "duration_s": 30.0}
    rows = [row("vllm-prefix", 4.0, 0.3), row("vllm-noprefix", 3.5, 0.4), row("interlude", 7, 0.01)]
    out = tmp_path / "plots" / "engine.png"
    plot_engine({"spec": spec, "rows": rows}, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_conversations_declaring_the_same_tools_share_their_system_block() -> None:
    """As a chat template renders them: a header for all, then each tool's declaration; a
    prefix cache can share those ids, and nothing after them."""
    mk = Markup(120, 85, 55, prefix_tokens=111)
    conv = {
        cid: Conversation(cid, "k", 0.0, 40, (Step(5, tool, 0.1, 3), Step(5)))
        for cid, tool in (("a", "calc"), ("b", "calc"), ("c", "search"))
    }
    s = {cid: scripted(c, mk) for cid, c in conv.items()}
    assert [len(x.prompt_token_ids) for x in s.values()] == [40 + 120] * 3
    assert common(s["a"], s["b"]) == 111  # the same tool: the whole system block
    assert common(s["a"], s["c"]) == 111 - 85  # another tool: the header only
    steps = (Step(5, "calc", 0.1, 3), Step(5, "x", 0.1, 3), Step(5))
    two = scripted(Conversation("d", "k", 0.0, 40, steps), mk)
    assert common(two, s["a"]) == 111 and len(system_block(mk, ["calc", "x"])) == 111 + 85
    # Without a measured prefix (`Markup()` or an old one) every id is the conversation's.
    assert common(scripted(conv["a"], Markup(120, 85, 55)), scripted(conv["b"], Markup())) == 0
    with pytest.raises(ValueError, match="prefix_tokens"):
        Markup(10, 0, 0, prefix_tokens=11)


def common(x: Any, y: Any) -> int:
    """How many leading prompt ids two scripted sessions share."""
    n = 0
    for a, b in zip(x.prompt_token_ids, y.prompt_token_ids, strict=False):
        if a != b:
            break
        n += 1
    return n


@pytest.mark.engine
def test_markup_sessions_hold_the_http_contexts_and_count_only_content_as_output() -> None:
    """`--markup`: the template's tokens go into the context (prompt, each answer) within the
    same budget as over HTTP, and never into the output the latency is normalized by."""
    bare = EngineBenchSpec(model="m")
    marked = EngineBenchSpec(model="m", markup=Markup(100, 20, 30))
    budget = (bare.num_gpu_blocks - 2) * 32 // 2
    fewer = 0
    for i, r in enumerate(resolve_workload("generated:mixed", 0)[:200]):
        plain, s = scale(r, bare, f"s{i}"), scale(r, marked, f"s{i}")
        calls = [st for st in s.steps if st.tool is not None]
        assert all(st.markup_tokens == 30 for st in calls)
        assert all(st.markup_tokens == 0 for st in plain.steps)
        tools = len({st.tool for st in calls})
        context = len(s.prompt_token_ids) + sum(
            st.gen_tokens + st.return_tokens + st.markup_tokens for st in s.steps
        )
        # The HTTP cut: content plus markup within the budget (a last segment that starts at
        # the budget still generates its one token).
        assert context <= budget + 1
        # The prompt's own tokens: the trace's, cut at most as much as without markup.
        content = len(s.prompt_token_ids) - marked.markup.fixed(tools)
        assert 8 <= content <= len(plain.prompt_token_ids)
        fewer += len(calls) < len([st for st in plain.steps if st.tool])
        done = SessionResult(s.session_id, start=0.0)
        done.turns = [[0] * st.gen_tokens for st in s.steps]
        assert output_tokens(s, done) == sum(st.gen_tokens + st.return_tokens for st in s.steps)
        if calls:  # stock vLLM resubmits the answers with their markup
            first = len(s.prompt_token_ids) + s.steps[0].gen_tokens - 1
            assert _resubmitted_context(s, 1) == first
            if len(calls) > 1:
                second = first + 1 + calls[0].return_tokens + 30 + s.steps[1].gen_tokens - 1
                assert _resubmitted_context(s, 2) == first + second
    assert fewer > 0  # the markup's tokens leave some conversations fewer calls


def test_small_run_compares_stock_and_ours(tiny_model: str) -> None:
    spec = EngineBenchSpec(
        model=tiny_model, workload="generated:mixed", rate=2.0, duration_s=3.0, horizon_s=60.0
    )
    lines: list[str] = []
    result = run_engine_bench(spec, ["vllm-prefix", "interlude"], lines.append)
    stock, ours = result["rows"]
    assert stock["sessions"] == ours["sessions"] > 0  # the same arrivals for both arms
    # Light load and a long horizon: every session finishes in both arms.
    assert stock["finished"] == stock["sessions"] and ours["finished"] == ours["sessions"]
    assert stock["prefix_cache_hit_rate"] > 0  # resubmitted contexts hit the prefix cache
    assert set(result["ratios"]) == {"vllm-prefix"}
    assert any("[2/2] interlude (run 1/1)" in line for line in lines)


def test_no_two_conversations_of_a_run_share_a_prompt_block() -> None:
    """Only the system block may be shared: ids seeded by a sum of the id's characters gave
    half of a run's conversations another's prompt, which a prefix cache found."""
    from interlude.loadgen.client import opening
    from interlude_workloads.arrivals import poisson_arrivals

    arrivals = poisson_arrivals(resolve_workload("shared", 0), 5.0, 60.0, 0)
    convs = [
        Conversation(a.arrival_id, "k", 0.0, 40, (Step(5, "calc", 0.1, 3), Step(5)))
        for a in arrivals
    ]
    first_blocks = {scripted(c, Markup()).prompt_token_ids[:32] for c in convs}
    assert len(first_blocks) == len(convs) > 200

    class Seeds:
        def text(self, tokens: int, seed: int) -> str:
            return str(seed)

    seeds = {opening(c, Seeds())[0] for c in convs}  # type: ignore[arg-type]
    assert len(seeds) == len(convs)


def test_conversations_of_a_group_open_with_the_same_head_on_both_paths() -> None:
    """The engine's scripted ids and the HTTP client's text share the group's head and
    nothing after it, behind the template's system block (which depends on the tools)."""
    import zlib

    from interlude.loadgen.client import opening
    from interlude.loadgen.text import TextMaker

    mk = Markup(base_tokens=120, per_tool_tokens=85, per_call_tokens=55, prefix_tokens=111)
    steps = (Step(5, "calc", 0.1, 3), Step(5))
    a, b, c = (
        Conversation(f"c{i}", "k", 0.0, 300, steps, 200, "g" if i < 2 else "h") for i in range(3)
    )
    ia, ib, ic = (scripted(x, mk).prompt_token_ids for x in (a, b, c))
    system, n = mk.shared(1), mk.shared(1) + 200
    assert len(ia) == 300 + mk.fixed(1)
    assert ia[:n] == ib[:n] and ia[n : n + 32] != ib[n : n + 32]
    assert ia[:system] == ic[:system] and ia[system:n] != ic[system:n]
    texts = TextMaker.estimated()
    ta, tb, tc = (opening(x, texts)[1][0]["content"] for x in (a, b, c))
    head = texts.text(200, zlib.crc32(b"g"))
    assert ta.startswith(head) and tb.startswith(head) and not tc.startswith(head)
    assert ta != tb and len(ta.split()) == 300
