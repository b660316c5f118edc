"""Synthetic augmented workloads, for when the shared InferCept trace is not at hand.

The six augmentation types follow DESIGN section 4's table (InferCept's measurements): tool time,
number of interceptions and context at a call, each as (mean, spread). The table labels the
spread "var", but we read it as a STANDARD DEVIATION: as a variance, the calculator's 6e-5 s^2
would be a standard deviation of 7.7 ms around a 90 us mean, and ALFWorld's 0.014 one of 0.12 s
around 0.09 s; the shared trace has 48 us and 0.015 s, i.e. the table's numbers as standard
deviations. Everything the table does not give is our assumption, marked as such below.

How a request is drawn (all quantities positive, gamma distributions matched to mean and std):

* number of calls n: gamma(calls_mean, calls_std), rounded, at least 1;
* context at the first call C1 (prompt + first generation): gamma, with the mean lowered by the
  expected growth of the context over later calls, so that the mean context over ALL calls
  matches the table (the table's statistic is per interception, not per request);
* generation per segment and tokens returned per call: gamma with our assumed means and a
  coefficient of variation of 0.5 (the trace's chat-derived requests truncate completions, so it
  gives no better shape);
* each call's duration: gamma(duration_mean, duration_std).

Contexts are capped so that max_context <= MAX_CONTEXT = 8192 tokens (a common model window;
InferCept's GPT-J had 2048): C1 <= 4096, each answer <= 2048, and a request whose next call would
leave no room for one more generated token ends early (fewer calls than drawn, rare).

"toolbench" is a multi-call mix in the spirit of ToolBench, entirely our assumption: 2-8 calls to
different APIs ("toolbench:<api>"), durations lognormal with median 1 s clipped to 0.2-5 s,
answers of 30-300 tokens, prompts of 800-2000 tokens (API documentation).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from interlude_workloads.agents import AGENT_WORKLOADS, generate_agents
from interlude_workloads.types import Segment, TraceCall, TraceRequest

MAX_CONTEXT = 8192
_CV = 0.5  # coefficient of variation assumed for per-segment generation and answer lengths


@dataclass(frozen=True)
class AugmentationProfile:
    """One row of DESIGN section 4's table plus the two lengths the table leaves open."""

    name: str
    # --- from the table (mean, standard deviation) ---
    duration_mean_s: float  # interception time
    duration_std_s: float
    calls_mean: float  # interceptions per request
    calls_std: float
    context_mean: float  # context (tokens) when a call starts
    context_std: float
    # --- our assumptions (informed by the shared trace's means for the same type) ---
    gen_mean: float  # tokens generated per segment
    return_mean: float  # tokens a call appends

    def __post_init__(self) -> None:
        values = [v for k, v in vars(self).items() if k != "name"]
        if not all(isinstance(v, (int, float)) and v > 0 for v in values):
            raise ValueError(f"profile {self.name!r}: every number must be positive")


# fmt: off
# Read-only: every workload in a run must come from the same table.
PROFILES: Mapping[str, AugmentationProfile] = MappingProxyType({p.name: p for p in (
    #                    duration (s)    calls         context        gen    return
    AugmentationProfile("math", 9e-5, 6e-5, 3.75, 1.3, 1422, 738, 130, 21),
    AugmentationProfile("qa", 0.69, 0.17, 2.52, 1.73, 1846, 428, 190, 57),
    AugmentationProfile("venv", 0.09, 0.014, 28.18, 15.2, 2185, 115, 3, 5),  # see below
    AugmentationProfile("chat", 28.6, 15.6, 4.45, 1.96, 753, 703, 60, 40),
    AugmentationProfile("image", 20.03, 7.8, 6.91, 3.93, 1247, 792, 40, 20),
    AugmentationProfile("tts", 17.24, 7.6, 6.91, 3.93, 1251, 792, 40, 20),
)})
# fmt: on
# venv: the trace's ALFWorld-like requests generate 4 tokens and get ~9 back per step, but over
# the table's ~28 calls that growth alone would spread the context far beyond its 115-token
# standard deviation; 3 + 5 tokens per step is what that spread allows.
AUGMENTATIONS: tuple[str, ...] = tuple(PROFILES)
# The InferCept-table family, capped at MAX_CONTEXT (what `bench engine`/`http` can run), then
# the agent programs of `agents.py`, with their own context windows.
TABLE_WORKLOADS: tuple[str, ...] = (*AUGMENTATIONS, "mixed", "toolbench")
WORKLOADS: tuple[str, ...] = (*TABLE_WORKLOADS, *AGENT_WORKLOADS)

# ToolBench-like mix (all our assumptions, see the module docstring).
TOOLBENCH_APIS: tuple[str, ...] = (
    "weather", "web_search", "maps", "stocks", "translate", "news",
    "flights", "hotels", "recipes", "sports", "currency", "movies",
)  # fmt: skip
TOOLBENCH_CALLS = (2, 8)  # inclusive range, uniform
TOOLBENCH_DURATION_S = (0.2, 5.0)  # clip range of a lognormal with median 1 s
TOOLBENCH_SIGMA = 0.82  # ln(5)/1.96: 0.2-5 s is the central 95 % before clipping
TOOLBENCH_RETURN = (30, 300)  # inclusive, uniform
TOOLBENCH_PROMPT = (800, 2000)  # inclusive, uniform
TOOLBENCH_GEN_MEAN = 80.0


def _gamma(rng: random.Random, mean: float, std: float) -> float:
    """A positive draw with the given mean and standard deviation (gamma by moments)."""
    shape = (mean / std) ** 2
    return rng.gammavariate(shape, std * std / mean)


def _length(rng: random.Random, mean: float, minimum: int, cap: int) -> int:
    return min(cap, max(minimum, round(_gamma(rng, mean, _CV * mean))))


def _expected_growth(p: AugmentationProfile) -> tuple[float, float]:
    """Mean and variance, pooled over all calls, of the context added since the first call.

    The context at call j (0-based) is C1 + j * (gen + return) on average. A request with n
    calls contributes j = 0..n-1, so pooled over calls E[j] = E[n(n-1)/2] / E[n] and
    E[j^2] = E[(n-1)n(2n-1)/6] / E[n], with n's raw moments those of its gamma distribution
    (rounding ignored: this only sizes C1's distribution).
    """
    step = p.gen_mean + p.return_mean
    k, theta = (p.calls_mean / p.calls_std) ** 2, p.calls_std**2 / p.calls_mean
    m1, m2, m3 = p.calls_mean, k * (k + 1) * theta**2, k * (k + 1) * (k + 2) * theta**3
    mean_j = (m2 - m1) / (2 * m1)
    mean_j2 = (2 * m3 - 3 * m2 + m1) / (6 * m1)
    return step * mean_j, step * step * max(mean_j2 - mean_j**2, 0.0)


def _build(
    rid: str,
    kind: str,
    prompt: int,
    first_gen: int,
    n_calls: int,
    gen: Callable[[], int],
    call: Callable[[], TraceCall],
) -> TraceRequest:
    """Lay out segments for up to `n_calls` calls, ending early at the context cap.

    Callers keep prompt + first_gen <= MAX_CONTEXT // 2 and answers <= MAX_CONTEXT // 4, so the
    first call always fits and every request has at least one call.
    """
    g, ctx = first_gen, prompt
    segments: list[Segment] = []
    for _ in range(n_calls):
        c = call()
        # Keep room for the answer plus at least one token generated after it.
        if ctx + g + c.return_tokens + 1 > MAX_CONTEXT:
            break
        segments.append(Segment(g, c))
        ctx += g + c.return_tokens
        g = gen()
    segments.append(Segment(max(1, min(g, MAX_CONTEXT - ctx)), None))
    return TraceRequest(rid, kind, prompt, tuple(segments))


def _augmented(rng: random.Random, rid: str, p: AugmentationProfile) -> TraceRequest:
    n_calls = max(1, round(_gamma(rng, p.calls_mean, p.calls_std)))
    growth_mean, growth_var = _expected_growth(p)
    c1_mean = max(p.context_mean - growth_mean, 0.25 * p.context_mean)
    # The first-call spread plus the growth's spread should give the table's spread; keep at
    # least a quarter of it so the first contexts never collapse onto one value.
    c1_std = math.sqrt(max(p.context_std**2 - growth_var, (0.25 * p.context_std) ** 2))
    first_context = max(2, min(round(_gamma(rng, c1_mean, c1_std)), MAX_CONTEXT // 2))
    cap = MAX_CONTEXT // 4

    def gen() -> int:
        return _length(rng, p.gen_mean, 1, cap)

    def call() -> TraceCall:
        duration = _gamma(rng, p.duration_mean_s, p.duration_std_s)
        return TraceCall(p.name, duration, _length(rng, p.return_mean, 0, cap))

    first_gen = min(gen(), first_context - 1)
    return _build(rid, p.name, first_context - first_gen, first_gen, n_calls, gen, call)


def _toolbench(rng: random.Random, rid: str) -> TraceRequest:
    n_calls = rng.randint(*TOOLBENCH_CALLS)
    apis = rng.sample(TOOLBENCH_APIS, n_calls)  # several DIFFERENT APIs per request
    lo, hi = TOOLBENCH_DURATION_S
    pending = iter(apis)

    def gen() -> int:
        return _length(rng, TOOLBENCH_GEN_MEAN, 1, MAX_CONTEXT // 4)

    def call() -> TraceCall:
        duration = min(hi, max(lo, rng.lognormvariate(0.0, TOOLBENCH_SIGMA)))
        return TraceCall(f"toolbench:{next(pending)}", duration, rng.randint(*TOOLBENCH_RETURN))

    prompt = rng.randint(*TOOLBENCH_PROMPT)
    return _build(
        rid, "toolbench", prompt, min(gen(), MAX_CONTEXT // 2 - prompt), n_calls, gen, call
    )


def generate(name: str, n: int, seed: int) -> list[TraceRequest]:
    """`n` synthetic requests of workload `name`, reproducible from `seed`.

    Names: the six augmentation types, "mixed" (the six in equal shares, shuffled, like
    InferCept's evaluation mix; equal shares rather than independent draws keep small workloads
    balanced), "toolbench", and the agent programs of `agents.AGENT_WORKLOADS`.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid names: {', '.join(WORKLOADS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if name in AGENT_WORKLOADS:
        return generate_agents(name, n, seed)
    rng = random.Random(seed)
    if name == "mixed":
        kinds = [AUGMENTATIONS[i % len(AUGMENTATIONS)] for i in range(n)]
        rng.shuffle(kinds)
    else:
        kinds = [name] * n
    out: list[TraceRequest] = []
    for i, kind in enumerate(kinds):
        rid = f"gen-{kind}-{i:05d}"
        if kind == "toolbench":
            out.append(_toolbench(rng, rid))
        else:
            out.append(_augmented(rng, rid, PROFILES[kind]))
    return out
