"""One rule for how much an iteration schedules (`policy.batching.step_budget`): the
simulator's batcher keeps to it under every policy's batch mode, and the engine gives vLLM the
same numbers (`max_num_batched_tokens`, `long_prefill_token_threshold`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from interlude.engine.config import EngineConfig
from interlude.policy import POLICIES, BatchMode, Profile
from interlude.policy.batching import StepBudget, next_step_tokens, step_budget
from interlude.sim.batch import Batch
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival

from .test_policies import ArrivalsFactory, RequestsFactory, many_decoders

# A model path that exists: only vLLM's arguments are built (no model loads), and offline
# (tests/conftest.py) vLLM resolves a path that does not exist as a Hugging Face repo id.
NO_MODEL = str(Path(__file__).parent)


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_engine_gives_vllm_the_simulators_budget(name: str) -> None:
    config = EngineConfig(model=NO_MODEL, policy=name, num_gpu_blocks=400)
    args = config.engine_args(cpu=True)
    step = step_budget(POLICIES[name].traits.batch_mode, config.resolved(True).engine_profile())
    assert args.max_num_batched_tokens == step.total
    assert args.long_prefill_token_threshold == min(step.per_request, args.max_model_len)


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_iteration_keeps_to_its_modes_budget(
    name: str,
    make_simulator: Callable[..., Simulator],
    make_profile: Callable[..., Profile],
    make_requests: RequestsFactory,
    make_arrivals: ArrivalsFactory,
) -> None:
    p = make_profile(saturation_tokens=16, max_batched_tokens=48, gpu_kv_bytes=1000 * 16_000)
    mode = POLICIES[name].traits.batch_mode
    step = step_budget(mode, p)
    widest = fullest = 0  # the most prefill tokens in an iteration; the most tokens with prefill

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        nonlocal widest, fullest
        assert all(n <= step.per_request for _, n, _ in batch.chunks)
        if batch.chunks:  # decodes alone may pass the budget: they are never cut
            assert batch.tokens <= step.total
        if mode is BatchMode.PREFILL_FIRST and batch.chunks:
            assert batch.decodes == []  # vLLM v0: a prefill iteration runs no decodes
        widest = max(widest, batch.prefill_tokens)
        fullest = max(fullest, batch.tokens if batch.chunks else 0)

    arrivals: list[Arrival] = many_decoders(make_requests, make_arrivals)
    m = make_simulator(name, arrivals, profile=p, observer=observe).run()
    assert m.finished == 50
    # The budget was reached: S for CHUNKED, beyond S (several requests' chunks) otherwise.
    assert fullest == 16 if mode is BatchMode.CHUNKED else widest > 16


def test_the_budgets_by_mode(make_profile: Callable[..., Profile]) -> None:
    p = make_profile(saturation_tokens=384, max_batched_tokens=8192)
    assert step_budget(BatchMode.CHUNKED, p) == StepBudget(384, 384)
    assert step_budget(BatchMode.THRESHOLD, p) == StepBudget(8192, 384)
    assert step_budget(BatchMode.PREFILL_FIRST, p) == StepBudget(8192, 8192)
    threshold = StepBudget(1000, 384)
    assert next_step_tokens(threshold, 10, [1000, 50]) == 10 + 384 + 50
    assert next_step_tokens(threshold, 900, [1000, 1000]) == 1000
    with pytest.raises(ValueError, match="per_request <= total"):
        StepBudget(10, 20)
