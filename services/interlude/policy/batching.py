"""How many tokens one iteration schedules, by `BatchMode`: the one rule the simulator's
batcher follows and the engine hands vLLM (`engine/config.py`), so that both batch alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from interlude.policy.profile import Profile
from interlude.policy.types import BatchMode


@dataclass(frozen=True)
class StepBudget:
    """An iteration's token budget: `total` tokens, decodes included (vLLM's
    `max_num_batched_tokens`), of which one request's prefill takes at most `per_request`
    (vLLM's `long_prefill_token_threshold`)."""

    total: int
    per_request: int

    def __post_init__(self) -> None:
        if not 0 < self.per_request <= self.total:
            raise ValueError(f"StepBudget needs 0 < per_request <= total, got {self}")


def step_budget(mode: BatchMode, p: Profile) -> StepBudget:
    """The budget of an iteration under `mode` on `p`."""
    if mode is BatchMode.CHUNKED:  # InferCept: everything within the saturation point
        return StepBudget(p.saturation_tokens, p.saturation_tokens)
    if mode is BatchMode.THRESHOLD:
        return StepBudget(p.max_batched_tokens, min(p.saturation_tokens, p.max_batched_tokens))
    return StepBudget(p.max_batched_tokens, p.max_batched_tokens)  # V1, and v0's prompts


def budgeted_per_step(mode: BatchMode) -> bool:
    """Whether an iteration under `mode` runs decodes and prefill chunks within one
    `step_budget` (vLLM v1), rather than InferCept's S in total or v0's whole prompts."""
    return mode is BatchMode.THRESHOLD or mode is BatchMode.V1


def next_step_tokens(budget: StepBudget, decodes: int, prefills: list[int]) -> int:
    """Tokens the running requests schedule next iteration under `budget`: one per decode
    and, for each request with `prefills` tokens still to compute, its next chunk."""
    chunks = sum(min(n, budget.per_request) for n in prefills)
    return min(budget.total, decodes + chunks)
