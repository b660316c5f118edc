"""`bench sim-check` (bench/sim_check.py): both sides get the same conversations, the engine's
runs are measured by the simulator's rules, and the verdict says where the two disagree."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from interlude.bench.engine_bench import output_tokens
from interlude.bench.scripted import ScriptedSession, SessionResult, Step
from interlude.bench.sim_check import (
    CheckSpec,
    _session,
    engine_metrics,
    prompt_markup,
    run_sim_check,
    simulate,
    tool_times,
    verdict,
)
from interlude.bench.sweep import REFERENCE_POLICY
from interlude.loadgen.markup import Markup

SPEC = CheckSpec(policies=("vllm", "interlude"), rates=(4.0, 8.0), duration_s=10.0)


def test_both_sides_get_the_same_conversations_with_shortened_tools() -> None:
    arrivals = SPEC.arrivals(4.0)
    assert arrivals == SPEC.arrivals(4.0)  # the same draw every time
    for a in arrivals:
        s = _session(a, 3.0, Markup())
        r = a.request
        assert len(s.prompt_token_ids) == r.prompt_tokens
        assert [st.gen_tokens for st in s.steps] == [seg.gen_tokens for seg in r.segments]
        for st, seg in zip(s.steps, r.segments, strict=True):
            assert st.markup_tokens == 0
            if seg.call is not None:
                assert st.return_tokens == seg.call.return_tokens
                assert st.delay_s == pytest.approx(3.0 * seg.call.duration_s)
    original = tool_times(arrivals[0].request, SPEC.time_scale)
    calls = [s.call for s in original.segments if s.call]
    shortened = [s.call for s in arrivals[0].request.segments if s.call]
    for long, short in zip(calls, shortened, strict=True):
        assert short.duration_s == pytest.approx(long.duration_s / SPEC.time_scale)
    tool = max(sum(s.call.duration_s for s in a.request.segments if s.call) for a in arrivals)
    assert SPEC.horizon(arrivals) == pytest.approx(SPEC.duration_s + 1.2 * tool)


def test_engine_runs_are_measured_by_the_simulators_rules_on_the_devices_clock() -> None:
    session = ScriptedSession("s", (1, 2, 3), (Step(4, "t", 1.0, 2), Step(4)))
    done = SessionResult("s", start=10.0, first_token=10.5, end=18.0, tool_wait_s=2.0)
    done.turns = [[1] * 4, [1] * 4]
    cut = SessionResult("s", start=12.0)  # never got a first token before the end at 30
    cut.turns = []
    m = engine_metrics([(session, done), (session, cut)], (10.0, 30.0), k=2.0)
    assert output_tokens(session, done) == 10
    # (18 - 10 - 2) / 2 / 10 = 0.3 and (30 - 12) / 2 / 1 = 9: the cut one censored at the end.
    assert m["normalized_latency_p99"] == pytest.approx(9.0, rel=0.02)
    assert m["ttft_mean"] == pytest.approx(((10.5 - 10) / 2 + (30 - 12) / 2) / 2)
    assert m["unfinished_fraction"] == 0.5 and m["finished"] == 1
    assert m["throughput_rps"] == pytest.approx(1 / 10.0)  # one finished in 20 s / 2


def _engine_like(sim_rows: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    return [
        r | {"side": "engine", "normalized_latency_median": r["normalized_latency_median"] * factor}
        for r in sim_rows
    ]


@pytest.mark.parametrize(("factor", "agrees"), [(1.1, True), (0.9, True), (1.3, False)])
def test_the_verdict_holds_the_medians_to_15_percent_below_saturation(
    factor: float, agrees: bool
) -> None:
    sim = [simulate(SPEC, p, r) for p in SPEC.policies for r in SPEC.rates]
    v = verdict(SPEC, sim + _engine_like(sim, factor))
    ours = v["policies"]["interlude"]
    assert ours["sim_rate_median"] == 8.0  # this workload at these rates is below saturation
    assert ours["latency_agrees"] is agrees
    assert set(ours["median_gap_below_saturation"]) == {4.0, 8.0}


def test_rates_more_than_a_step_apart_disagree() -> None:
    spec = dataclasses.replace(SPEC, rates=(4.0, 8.0, 12.0, 16.0, 20.0))
    sim = [simulate(spec, "interlude", r) for r in spec.rates]
    slow = [r | {"side": "engine", "normalized_latency_median": 1.0} for r in sim]  # fails all
    v = verdict(spec, sim + slow)["policies"]["interlude"]
    assert v["sim_rate_median"] == 20.0 and v["engine_rate_median"] is None
    assert v["rates_agree"] is False


def test_a_simulator_only_check_writes_no_engine_rows(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    result = run_sim_check(SPEC, tmp_path, print, seen.append, engine=False)
    assert {r["side"] for r in result["rows"]} == {"sim"} and seen == result["rows"]
    assert len(result["rows"]) == len(SPEC.policies) * len(SPEC.rates)
    assert "engine_rate_median" not in result["verdict"]["policies"]["vllm"]


def test_the_command_writes_json_plot_and_verdict(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from interlude.cli import app

    out = tmp_path / "check.json"
    args = ["bench", "sim-check", "--sim-only", "--json", str(out), "--rates", "4,8"]
    res = CliRunner().invoke(app, [*args, "--policies", "vllm,interlude", "--duration", "10"])
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert result["spec"]["policies"] == ["vllm", "interlude"] and len(result["rows"]) == 4
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "interlude: sustainable (median / tail rule) sim 8.0 / 8.0" in res.output
    bad = CliRunner().invoke(app, ["bench", "sim-check", "--json", str(out), "--policies", "nope"])
    assert bad.exit_code == 2 and "unknown policy 'nope'" in bad.output


def test_every_answer_is_at_least_a_token_on_both_sides() -> None:
    from interlude_workloads import resolve_workload

    pool = resolve_workload(SPEC.workload, SPEC.seed)
    assert any(s.call.return_tokens == 0 for r in pool for s in r.segments if s.call)
    for rate in (4.0, 16.0):
        for a in SPEC.arrivals(rate):
            assert all(s.call.return_tokens >= 1 for s in a.request.segments if s.call)
            _session(a, 2.0, Markup())  # the engine's session takes it (it refuses an empty answer)


def test_an_interrupted_check_keeps_its_engine_runs(tmp_path: Path) -> None:
    kept = [
        simulate(SPEC, p, r) | {"side": "engine", "kept": True}
        for p in SPEC.policies
        for r in SPEC.rates
    ]
    lines: list[str] = []
    result = run_sim_check(SPEC, tmp_path, lines.append, done=kept)  # starts no engine
    engine = [r for r in result["rows"] if r["side"] == "engine"]
    assert len(engine) == 4 and all(r["kept"] for r in engine)
    assert sum("kept from the last run" in line for line in lines) == 4
    assert result["verdict"]["policies"]["interlude"]["latency_agrees"] is True


MARKUP = Markup(base_tokens=40, per_tool_tokens=12, per_call_tokens=55, prefix_tokens=30)


def test_with_markup_both_sides_hold_the_contexts_a_chat_has() -> None:
    spec = dataclasses.replace(SPEC, markup=MARKUP)
    for a in spec.arrivals(8.0):
        s, r = _session(a, 3.0, MARKUP), prompt_markup(a.request, MARKUP)
        tools = {c.tool for c in a.request.calls}
        assert r.prompt_tokens == a.request.prompt_tokens + MARKUP.fixed(len(tools))
        assert len(s.prompt_token_ids) == r.prompt_tokens
        for st, seg in zip(s.steps, r.segments, strict=True):
            assert st.gen_tokens == seg.gen_tokens
            if seg.call is not None:
                assert st.return_tokens == seg.call.return_tokens
                assert st.markup_tokens == MARKUP.per_call_tokens
    # The simulator runs the marked-up contexts, with the same output tokens: every
    # policy's median grows (stock vLLM's, without prefix caching, recomputes every one).
    for policy in ("vllm-v0", "vllm", "interlude"):
        plain, marked = simulate(SPEC, policy, 8.0), simulate(spec, policy, 8.0)
        assert marked["normalized_latency_median"] > plain["normalized_latency_median"]


def test_the_engine_side_is_also_judged_by_its_own_reference(tmp_path: Path) -> None:
    spec = dataclasses.replace(SPEC, reference_on_engine=True, slo_rate=4.0)
    sim = [simulate(spec, p, r) for p in spec.policies for r in spec.rates]
    reference = simulate(spec, REFERENCE_POLICY, 4.0) | {"side": "engine"}
    # The reference's median at 4/s makes an SLO only the vllm rows at 4/s meet (x3 of a
    # median 10x smaller than theirs would not): then the engine's own rates differ.
    reference["normalized_latency_median"] = sim[0]["normalized_latency_median"] / 2.9
    engine = _engine_like(sim, 1.0)
    lines: list[str] = []
    result = run_sim_check(spec, tmp_path, lines.append, done=[reference, *engine])
    assert lines[0].startswith(f"[1/5] engine, {REFERENCE_POLICY} at 4/s: kept")
    v = result["verdict"]
    assert v["engine_slo"] == pytest.approx(3 * reference["normalized_latency_median"])
    own = v["policies"]["vllm"]["engine_own_slo_rates"]
    assert own[0] == 4.0  # 3 / 2.9 of its median at 4/s; at 8/s its median is higher
    assert "engine_own_slo_rates" in v["policies"]["interlude"]
    plain = verdict(SPEC, sim + engine)
    assert "engine_slo" not in plain and "engine_own_slo_rates" not in plain["policies"]["vllm"]


def test_the_command_measures_the_markup_it_is_asked_for(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from interlude.cli import app

    out = tmp_path / "check.json"
    args = ["bench", "sim-check", "--sim-only", "--json", str(out), "--rates", "4"]
    res = CliRunner().invoke(app, [*args, "--policies", "vllm", "--duration", "5", "--markup"])
    assert res.exit_code == 0, res.output
    mk = json.loads(out.read_text())["spec"]["markup"]
    # The tiny model's template: a system block declaring the tools, markup with each call.
    assert mk["per_call_tokens"] > 0 and mk["base_tokens"] >= mk["prefix_tokens"] > 0


def test_with_markup_the_simulator_shares_what_the_engines_prompts_share() -> None:
    """Two conversations declaring the same tools open with the same ids on the engine's side
    (the system block, then any head of their own group) for exactly the tokens the
    simulator counts as their group's shared head; other tools share less than a block."""
    arrivals = dataclasses.replace(SPEC, markup=MARKUP).arrivals(8.0)
    by_tools: dict[frozenset[str], list[Any]] = {}
    for a in arrivals:
        by_tools.setdefault(frozenset(c.tool for c in a.request.calls), []).append(a)
    pairs = [group[:2] for group in by_tools.values() if len(group) >= 2]
    assert len(pairs) >= 3
    for a, b in pairs:
        ra, rb = prompt_markup(a.request, MARKUP), prompt_markup(b.request, MARKUP)
        ia = _session(a, 3.0, MARKUP).prompt_token_ids
        ib = _session(b, 3.0, MARKUP).prompt_token_ids
        common = next(i for i, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y)
        assert ra.prefix_group == rb.prefix_group != ""
        assert common == ra.shared_prefix_tokens == rb.shared_prefix_tokens
    (x, _), (y, _) = pairs[0], pairs[1]
    assert (
        prompt_markup(x.request, MARKUP).prefix_group
        != prompt_markup(y.request, MARKUP).prefix_group
    )
    head = dataclasses.replace(x.request, shared_prefix_tokens=50, prefix_group="agent")
    marked = prompt_markup(head, MARKUP)
    declared = {c.tool for c in x.request.calls} or {"tool"}
    assert marked.shared_prefix_tokens == MARKUP.shared(len(declared)) + 50
    assert marked.prefix_group.startswith("agent|")
    plain = prompt_markup(x.request, Markup())
    assert (plain.shared_prefix_tokens, plain.prefix_group) == (0, "")
