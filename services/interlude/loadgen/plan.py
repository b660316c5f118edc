"""Workloads as timed, scripted conversations: which conversation starts when, and its script.

A workload spec is `shared` (InferCept's trace), `generated:NAME` (`generate.WORKLOADS`), a trace
JSON path, or a `.jsonl` file in the user format (`userjsonl`). Arrivals are Poisson at a rate
(`arrivals.poisson_arrivals`, seeded) or, for a JSONL file with `arrival_s`, the file's own.

`Scale` shrinks a trace to a small model the way `bench engine` does (token counts and tool
times divided, tool times capped, each conversation cut to fit a context budget). Over HTTP the
budget also counts the chat template's markup (`Scale.markup`, measured by `markup.measure`),
which `bench engine` does not send, so its conversations are cut shorter than the in-process
ones. `Scale()` with factors of 1 and no budget replays a trace as it is (real models).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interlude.loadgen.markup import Markup
from interlude_workloads.arrivals import poisson_arrivals, resolve_workload
from interlude_workloads.types import TraceRequest
from interlude_workloads.userjsonl import load_jsonl


@dataclass(frozen=True)
class Step:
    """Generate `gen_tokens`; then, unless `tool` is None, call it: it answers `return_tokens`
    tokens after `delay_s` seconds."""

    gen_tokens: int
    tool: str | None = None
    delay_s: float = 0.0
    return_tokens: int = 0


@dataclass(frozen=True)
class Conversation:
    conv_id: str
    kind: str
    arrival_s: float
    prompt_tokens: int
    steps: tuple[Step, ...]
    # The prompt's first tokens that every conversation of `prefix_group` sends alike
    # (`TraceRequest.shared_prefix_tokens`); 0 and "": the whole prompt is its own.
    shared_prefix_tokens: int = 0
    prefix_group: str = ""

    @property
    def calls(self) -> int:
        return len(self.steps) - 1


@dataclass(frozen=True)
class Scale:
    token_scale: float = 1.0  # trace token counts are divided by this
    time_scale: float = 1.0  # tool times are divided by this
    max_tool_s: float | None = None  # and capped here
    budget_tokens: int | None = None  # a conversation's whole context stays within this
    markup: Markup = field(default_factory=Markup)  # template tokens, counted in the budget

    def __post_init__(self) -> None:
        if self.token_scale <= 0 or self.time_scale <= 0:
            raise ValueError("token_scale and time_scale must be > 0")
        if self.budget_tokens is not None and self.budget_tokens < 16:
            raise ValueError("budget_tokens must be >= 16")


# What `bench engine` replays on the tiny model: a 40-block pool of 32-token blocks (its
# `scale`: budget (40 - 2) * 32 // 2 tokens a conversation, so two fit at once at least).
TINY = Scale(token_scale=3.0, time_scale=10.0, max_tool_s=3.0, budget_tokens=(40 - 2) * 32 // 2)


def scaled(r: TraceRequest, scale: Scale, conv_id: str, arrival_s: float) -> Conversation:
    """`r` shrunk by `scale`; cut at the first call that would leave the budget (content plus
    the template's markup). `bench engine` cuts its scripted sessions with this too."""
    budget = scale.budget_tokens
    per_call = scale.markup.per_call_tokens
    if budget is not None:
        tools = {c.tool for c in r.calls}
        budget = max(16, budget - scale.markup.fixed(len(tools)))
    prompt = max(1, int(r.prompt_tokens / scale.token_scale))
    if budget is not None:
        prompt = max(8, min(prompt, budget // 2))
    steps: list[Step] = []
    total = prompt
    for seg in r.segments:
        gen = max(1, int(seg.gen_tokens / scale.token_scale))
        call = seg.call
        ret = max(1, int(call.return_tokens / scale.token_scale)) if call else 0
        if call is None or (budget is not None and total + gen + ret + per_call > budget):
            last = gen if budget is None else max(1, min(gen, budget - total))
            steps.append(Step(last))
            break
        delay = call.duration_s / scale.time_scale
        if scale.max_tool_s is not None:
            delay = min(delay, scale.max_tool_s)
        steps.append(Step(gen, call.tool, delay, ret))
        total += gen + ret + per_call
    shared = min(prompt, int(r.shared_prefix_tokens / scale.token_scale))
    group = r.prefix_group if shared else ""
    return Conversation(conv_id, r.kind, arrival_s, prompt, tuple(steps), shared, group)


def conversations(
    workload: str,
    rate: float | None,
    duration_s: float,
    seed: int,
    scale: Scale,
    prefix: str = "",
) -> list[Conversation]:
    """The run's conversations in arrival order. `rate` None: the JSONL file's own arrival
    times (those before `duration_s`). Ids are `prefix` + index, so every run has its own."""
    if workload.endswith(".jsonl"):
        user = load_jsonl(workload)
        if rate is None:
            if user.arrivals is None:
                raise ValueError(f"{workload} has no arrival_s: give a rate instead")
            timed = sorted(zip(user.arrivals, user.requests, strict=True), key=lambda x: x[0])
            return [
                scaled(r, scale, f"{prefix}c{i}", t)
                for i, (t, r) in enumerate(timed)
                if t < duration_s
            ]
        pool = list(user.requests)
    else:
        if rate is None:
            raise ValueError("timed arrivals need a JSONL trace with arrival_s; give a rate")
        pool = _pool(workload, seed)
    assert rate is not None
    arrivals = poisson_arrivals(pool, rate, duration_s, seed)
    return [scaled(a.request, scale, f"{prefix}c{i}", a.time_s) for i, a in enumerate(arrivals)]


def tool_kinds(workload: str, seed: int) -> set[str]:
    """Every call type in `workload`'s conversations (to measure their markup)."""
    pool = load_jsonl(workload).requests if workload.endswith(".jsonl") else _pool(workload, seed)
    return {s.call.tool for r in pool for s in r.segments if s.call is not None}


def _pool(workload: str, seed: int) -> list[TraceRequest]:
    """`auto`: the shared InferCept trace when this checkout has it, else `generated:mixed`."""
    if workload != "auto":
        return resolve_workload(workload, seed)
    try:
        return resolve_workload("shared", seed)
    except ValueError:
        return resolve_workload("generated:mixed", seed)
