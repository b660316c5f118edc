"""Synthetic tool-using agents: a request is an agent program, a tool loop over a growing context.

An agent program opens with a long prompt (a system head, the advertised tool catalog and the
task), then goes around its tool loop `steps` times: it generates a turn that ends in a tool
call, the tool runs, its result is appended, and the next turn reads the whole context again;
a last turn answers. In our request model (`types.py`) that is one `TraceRequest` whose
segments are the turns, so every policy sees an agent's pauses as the pauses of one request,
as an intercept-aware server does (the KV of the whole context is there to keep, move or drop).

The knobs carry the names of inference-perf's `synthetic_agentic` generator
(kubernetes-sigs/inference-perf #716) so a configuration reads the same in both:
`shared_system_prompt_len`, `tool_catalog_size_per_agent` (at its 380 tokens per advertised
tool), `tool_loop_depth`, `output_tokens_per_turn`, `tool_call_latency_sec`, `max_model_len`.
The values come from published trajectory statistics; `docs/workloads.md` cites each.

Distributions (all draws from one `random.Random(seed)`, so a pool is reproducible):

* steps: gamma(mean, std) clipped to [lo, hi];
* tokens generated per turn: gamma with mean `output_tokens_per_turn` and a coefficient of
  variation of 0.5, at least 1;
* tokens a tool result appends: lognormal(median, sigma) clipped to [lo, hi];
* a call's duration: lognormal fitted to two published quantiles of an agent's pause, clipped;
* a program ends early, with fewer calls than drawn, when its next turn and result would
  leave no room under `max_model_len` for one more generated token (agents compact or stop).

The system head and the catalog are the same in every program of a profile (inference-perf's
`shared_system_prompt_len` is shared by definition; we give every agent the same catalog):
`shared_prefix_tokens`, in `prefix_group` the profile's name, which a prefix cache holds once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from types import MappingProxyType

from interlude_workloads.types import Segment, TraceCall, TraceRequest

TOKENS_PER_TOOL = 380  # inference-perf's CATALOG_TOKENS_PER_TOOL: one advertised tool schema
_GEN_CV = 0.5  # coefficient of variation of a turn's generated tokens (our assumption)
# Tool names, so that per-tool duration estimates (policies learn them) see a coding agent's
# mix: fast reads, searches and edits, slow builds and test runs. A call's tool is a noisy
# function of its duration (our assumption): a slow tool with probability
# Phi(ln(d / _SLOW_S) / _SLOW_SIGMA), so 1 s calls are slow tools 1 % of the time, 10 s
# calls half the time, 100 s calls 99 % of the time; the tools' durations overlap, as a
# test run that fails at once and a file read of a large file do.
_FAST_TOOLS = ("read_file", "grep", "list_dir", "edit_file")
_SLOW_TOOLS = ("run_tests", "build", "shell")
_SLOW_S = 10.0
_SLOW_SIGMA = 1.0
_NORMAL = NormalDist()


def _lognormal_from_quantiles(
    q1: tuple[float, float], q2: tuple[float, float]
) -> tuple[float, float]:
    """(mu, sigma) of the lognormal whose CDF is p1 at x1 and p2 at x2."""
    (p1, x1), (p2, x2) = q1, q2
    z1, z2 = _NORMAL.inv_cdf(p1), _NORMAL.inv_cdf(p2)
    sigma = (math.log(x2) - math.log(x1)) / (z2 - z1)
    return math.log(x1) - z1 * sigma, sigma


@dataclass(frozen=True)
class Clipped:
    """A positive distribution clipped to [lo, hi]: gamma (mean, spread = std) or lognormal
    (mean = its median, spread = sigma of the log)."""

    kind: str  # "gamma" or "lognormal"
    mean: float
    spread: float
    lo: float
    hi: float

    def __post_init__(self) -> None:
        if self.kind not in ("gamma", "lognormal"):
            raise ValueError(f"distribution kind must be gamma or lognormal, got {self.kind!r}")
        if not (self.mean > 0 and self.spread > 0 and 0 <= self.lo <= self.hi):
            raise ValueError(f"bad {self.kind} distribution: {self}")

    def draw(self, rng: random.Random) -> float:
        if self.kind == "gamma":
            x = rng.gammavariate((self.mean / self.spread) ** 2, self.spread**2 / self.mean)
        else:
            x = rng.lognormvariate(math.log(self.mean), self.spread)
        return min(self.hi, max(self.lo, x))


# vllm-project/router #285: in a coding agent's trace, 86 % of an agent's next requests came
# back within 1 s and 95 % within 10 s; the clip keeps a test run under 10 minutes.
_MU, _SIGMA = _lognormal_from_quantiles((0.86, 1.0), (0.95, 10.0))
ROUTER_285_LATENCY = Clipped("lognormal", math.exp(_MU), _SIGMA, 0.001, 600.0)


@dataclass(frozen=True)
class AgentProfile:
    """One agent workload: the knobs of inference-perf's `synthetic_agentic`, with values."""

    name: str
    shared_system_prompt_len: int  # system head every program opens with
    tool_catalog_size_per_agent: int  # tools advertised in the prompt, TOKENS_PER_TOOL each
    task_tokens: tuple[int, int]  # the task statement, uniform in [lo, hi]
    tool_loop_depth: Clipped  # tool calls per program (turns = this + 1)
    output_tokens_per_turn: float  # mean generated tokens per turn
    tool_result_tokens: Clipped  # tokens a tool's result appends
    tool_call_latency_sec: Clipped  # seconds a call takes
    max_model_len: int  # context window: no program's context exceeds it

    def __post_init__(self) -> None:
        lo, hi = self.task_tokens
        if not (0 < lo <= hi):
            raise ValueError(f"agent profile {self.name!r}: bad task_tokens {self.task_tokens}")
        if self.shared_system_prompt_len < 0 or self.tool_catalog_size_per_agent < 0:
            raise ValueError(f"agent profile {self.name!r}: negative prompt part")
        if self.output_tokens_per_turn < 1 or self.tool_loop_depth.lo < 1:
            raise ValueError(f"agent profile {self.name!r}: turns need >= 1 token and >= 1 call")
        if self.prompt_max + 2 * self.output_tokens_per_turn > self.max_model_len:
            raise ValueError(f"agent profile {self.name!r}: the prompt leaves no room to work")

    @property
    def prompt_max(self) -> int:
        head = self.shared_system_prompt_len + self.tool_catalog_size_per_agent * TOKENS_PER_TOOL
        return head + self.task_tokens[1]


# fmt: off
AGENT_PROFILES: Mapping[str, AgentProfile] = MappingProxyType({p.name: p for p in (
    # A coding agent (SWE-bench-like tasks): 10-60 steps, contexts growing to 8-32k tokens.
    AgentProfile(
        "agent-coding", 1000, 8, (200, 1500), Clipped("gamma", 30, 15, 10, 60), 220,
        Clipped("lognormal", 80, 1.0, 5, 4000), ROUTER_285_LATENCY, 32768,
    ),
    # OpenHands on SWE-rebench: 64 turns on average, at most 100, ~27k tokens at the deepest.
    AgentProfile(
        "agent-coding-long", 1000, 8, (200, 1500), Clipped("gamma", 64, 20, 10, 100), 220,
        Clipped("lognormal", 80, 1.0, 5, 4000), ROUTER_285_LATENCY, 131072,
    ),
    # Sub-agents a coordinator fans out: many short programs (inference-perf's default loop
    # of 2, here 1-8), a smaller catalog, the same tools.
    AgentProfile(
        "agent-subagents", 1000, 4, (100, 800), Clipped("gamma", 3, 2, 1, 8), 220,
        Clipped("lognormal", 80, 1.0, 5, 4000), ROUTER_285_LATENCY, 32768,
    ),
)})
# fmt: on
AGENT_WORKLOADS: tuple[str, ...] = tuple(AGENT_PROFILES)


def _tool_name(rng: random.Random, duration_s: float) -> str:
    slow = rng.random() < _NORMAL.cdf(math.log(duration_s / _SLOW_S) / _SLOW_SIGMA)
    return rng.choice(_SLOW_TOOLS if slow else _FAST_TOOLS)


def agent_program(rng: random.Random, rid: str, p: AgentProfile) -> TraceRequest:
    """One agent program drawn from profile `p`."""
    head = p.shared_system_prompt_len + p.tool_catalog_size_per_agent * TOKENS_PER_TOOL
    prompt = head + rng.randint(*p.task_tokens)
    steps = round(p.tool_loop_depth.draw(rng))

    def turn() -> int:
        mean = p.output_tokens_per_turn
        return max(1, round(rng.gammavariate(1 / _GEN_CV**2, mean * _GEN_CV**2)))

    ctx, segments = prompt, []
    gen = turn()
    for _ in range(steps):
        duration = p.tool_call_latency_sec.draw(rng)
        result = round(p.tool_result_tokens.draw(rng))
        if ctx + gen + result + 1 > p.max_model_len:
            break
        segments.append(Segment(gen, TraceCall(_tool_name(rng, duration), duration, result)))
        ctx += gen + result
        gen = turn()
    segments.append(Segment(max(1, min(gen, p.max_model_len - ctx)), None))
    # Every program of a profile opens with the same system head and catalog.
    return TraceRequest(rid, p.name, prompt, tuple(segments), head, p.name)


def generate_agents(name: str, n: int, seed: int) -> list[TraceRequest]:
    """`n` programs of agent workload `name`, reproducible from `seed`."""
    if name not in AGENT_PROFILES:
        raise ValueError(f"unknown agent workload {name!r}; valid: {', '.join(AGENT_WORKLOADS)}")
    rng = random.Random(seed)
    return [agent_program(rng, f"{name}-{i:05d}", AGENT_PROFILES[name]) for i in range(n)]
