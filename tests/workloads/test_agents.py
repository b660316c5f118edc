"""Agent programs: the published statistics they are drawn to, the context window, the
tools' overlap, determinism and names (`interlude_workloads.agents`, docs/workloads.md)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from interlude_workloads import WORKLOADS, generate, resolve_workload
from interlude_workloads.agents import (
    AGENT_PROFILES,
    AGENT_WORKLOADS,
    ROUTER_285_LATENCY,
    TOKENS_PER_TOOL,
    AgentProfile,
    Clipped,
    agent_program,
    generate_agents,
)


@pytest.mark.parametrize("name", AGENT_WORKLOADS)
def test_programs_are_valid_and_within_their_window(name: str) -> None:
    p = AGENT_PROFILES[name]
    programs = generate(name, 300, seed=1)
    assert len({r.request_id for r in programs}) == 300
    assert all(r.max_context <= p.max_model_len for r in programs)
    assert all(r.num_calls >= 1 for r in programs)
    assert all(r.prompt_tokens <= p.prompt_max for r in programs)
    assert name in WORKLOADS and resolve_workload(f"generated:{name}", 0)


def test_tool_durations_match_the_published_quantiles() -> None:
    # vllm-project/router #285: 86 % of next requests within 1 s, 95 % within 10 s.
    durations = [c.duration_s for r in generate("agent-coding", 400, 0) for c in r.calls]
    assert len(durations) > 5000
    within = [sum(d <= s for d in durations) / len(durations) for s in (1.0, 10.0)]
    assert within == pytest.approx([0.86, 0.95], abs=0.015)
    assert max(durations) <= ROUTER_285_LATENCY.hi


def test_coding_agents_grow_to_the_published_contexts() -> None:
    coding = generate("agent-coding", 400, 0)
    steps = [r.num_calls for r in coding]
    assert min(steps) >= 10 and max(steps) <= 60
    assert statistics.mean(steps) == pytest.approx(30, abs=2)
    deepest = [r.max_context for r in coding]
    assert 8000 < statistics.median(deepest) < 20000 and max(deepest) > 25000
    # OpenHands on SWE-rebench: 64.3 turns on average, ~27k tokens at the deepest turn.
    long = generate("agent-coding-long", 400, 0)
    assert statistics.mean(r.num_calls for r in long) == pytest.approx(64.3, abs=3)
    assert statistics.mean(r.max_context for r in long) == pytest.approx(27_000, rel=0.1)
    turns = [s.gen_tokens for r in coding for s in r.segments]
    assert statistics.mean(turns) == pytest.approx(220, rel=0.05)  # SGLang's agentic default


def test_fast_and_slow_tools_overlap() -> None:
    calls = [c for r in generate("agent-coding", 400, 0) for c in r.calls]
    slow = [c.duration_s for c in calls if c.tool in ("run_tests", "build", "shell")]
    fast = [c.duration_s for c in calls if c.tool in ("read_file", "grep", "list_dir", "edit_file")]
    assert len(slow) + len(fast) == len(calls)
    assert statistics.median(slow) > 10 * statistics.median(fast)
    assert max(fast) > min(slow) * 10  # a tool does not give its duration away


def test_a_window_too_small_ends_programs_early() -> None:
    tight = AgentProfile(
        "tight", 1000, 2, (100, 200), Clipped("gamma", 50, 5, 40, 60), 220,
        Clipped("lognormal", 500, 0.5, 100, 2000), ROUTER_285_LATENCY, 8192,
    )  # fmt: skip
    rng = random.Random(0)
    programs = [agent_program(rng, f"t{i}", tight) for i in range(50)]
    assert all(r.max_context <= 8192 for r in programs)
    assert all(1 <= r.num_calls < 40 for r in programs)


def test_reproducible_and_checked() -> None:
    assert generate_agents("agent-subagents", 20, 5) == generate_agents("agent-subagents", 20, 5)
    assert generate_agents("agent-subagents", 20, 5) != generate_agents("agent-subagents", 20, 6)
    with pytest.raises(ValueError, match="unknown agent workload"):
        generate_agents("agent-nope", 1, 0)
    with pytest.raises(ValueError, match="no room"):
        AgentProfile(
            "x", 8000, 0, (100, 200), Clipped("gamma", 5, 1, 1, 9), 220,
            Clipped("lognormal", 80, 1.0, 5, 4000), ROUTER_285_LATENCY, 8192,
        )  # fmt: skip
    with pytest.raises(ValueError, match="gamma or lognormal"):
        Clipped("pareto", 1, 1, 0, 1)
    assert math.isfinite(ROUTER_285_LATENCY.spread)


@pytest.mark.parametrize("name", AGENT_WORKLOADS)
def test_every_program_of_a_profile_shares_its_system_head_and_catalog(name: str) -> None:
    p = AGENT_PROFILES[name]
    head = p.shared_system_prompt_len + p.tool_catalog_size_per_agent * TOKENS_PER_TOOL
    programs = generate(name, 50, seed=2)
    assert {(r.shared_prefix_tokens, r.prefix_group) for r in programs} == {(head, name)}
    assert all(r.prompt_tokens > head for r in programs)  # and a task of its own
