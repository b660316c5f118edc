"""An admission needs free blocks for its whole prompt, not only for its first chunk: vLLM
0.32's `scheduler_reserve_full_isl` (on by default), which the engine runs under."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from interlude.engine.config import EngineConfig
from interlude.policy import Profile
from interlude.policy.types import Phase
from interlude.sim import simulator, swapping
from interlude.sim.batch import Batch
from interlude.sim.kv import KVBook
from interlude.sim.ranked_queue import RankedQueue
from interlude.sim.running import Running
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceRequest

# A model path that exists: only vLLM's arguments are built (no model loads), and offline
# (tests/conftest.py) vLLM resolves a path that does not exist as a Hugging Face repo id.
NO_MODEL = str(Path(__file__).parent)


def _admissions(
    make_simulator: Callable[..., Simulator], profile: Profile, arrivals: list[Arrival]
) -> tuple[dict[str, float], dict[str, float]]:
    """(first admission time, finish time) of every request under `vllm`."""
    admitted: dict[str, float] = {}

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        for r in batch.admitted:
            admitted.setdefault(r.request_id, sim.now)

    sim = make_simulator("vllm", arrivals, profile=profile, observer=observe)
    sim.run()
    finished = {r.request_id: r.finished_at for r in sim.requests if r.finished_at is not None}
    return admitted, finished


def test_a_prompt_whose_first_chunk_fits_waits_for_room_for_all_of_it(
    make_simulator: Callable[..., Simulator], make_profile: Callable[..., Profile]
) -> None:
    # 20 blocks of 16 tokens, prefill chunks of 64. `a` holds 13 blocks (200 + its decodes);
    # `b`'s first chunk (4 blocks) would fit in the 7 left, its 200-token prompt (13) not.
    profile = make_profile(gpu_kv_bytes=20 * 16 * 1000, saturation_tokens=64, max_batched_tokens=64)
    reqs = [TraceRequest(x, "k", 200, (Segment(40, None),)) for x in "ab"]
    arrivals = [Arrival(0.05 * i, r, r.request_id) for i, r in enumerate(reqs)]
    admitted, finished = _admissions(make_simulator, profile, arrivals)
    assert set(finished) == {"a", "b"}
    assert admitted["b"] >= finished["a"]  # no chunk of `b` ran beside `a`
    # With room for both prompts, `b` runs beside `a` (the rule is about room, not order).
    roomy = make_profile(gpu_kv_bytes=40 * 16 * 1000, saturation_tokens=64, max_batched_tokens=64)
    admitted, finished = _admissions(make_simulator, roomy, arrivals)
    assert admitted["b"] < finished["a"]


def test_the_engine_runs_vllm_with_the_rule() -> None:
    args: Any = EngineConfig(model=NO_MODEL, policy="interlude", num_gpu_blocks=40).engine_args(
        cpu=True
    )
    # The default: our config leaves it alone (vllm/config/scheduler.py).
    assert getattr(args, "scheduler_reserve_full_isl", True) is True
    # vLLM's other admission gates stay off, so the simulator need not model them: no
    # watermark of free blocks (0.0, its default), and no reserve for asynchronous KV loads
    # (`InterludeScheduler._inflight_prefill_reserved_blocks`).
    assert args.watermark == 0.0


def test_a_swap_in_starts_only_when_its_whole_sequence_fits(
    pressure_arrivals: list[Arrival],
    make_simulator: Callable[..., Simulator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The engine's vLLM starts loading a resumed request's host copy only when its whole
    # sequence (the copy and the new tokens) fits the free blocks, and allocates the copy's
    # blocks then; the request joins the batch with its whole copy (`sim/swapping.py`).
    sim = make_simulator("infercept", pressure_arrivals)
    started = joined = 0

    def checked_swap_in(
        queue: RankedQueue, running: Running, kv: KVBook, *args: Any
    ) -> swapping.SwapIns:
        nonlocal started, joined
        loads: swapping.Loads = args[-1]
        before = {r.request_id: (r, r.gpu_tokens, r.cpu_tokens) for r in queue}
        loading = set(loads.items)
        free = kv.gpu_free  # a request joining frees its load's blocks and takes as many
        out = swapping.swap_in(queue, running, kv, *args)
        for rid, load in loads.items.items():
            if rid in loading:
                continue
            r, gpu, cpu = before[rid]
            assert load.reserved == kv.blocks(gpu + cpu) - kv.blocks(gpu)
            assert kv.blocks(gpu + cpu + r.pending_tokens) - kv.blocks(gpu) <= free, rid
            free -= load.reserved
            started += 1
        for rid in loading - set(loads.items):
            r, gpu, cpu = before[rid]
            if r.phase is Phase.RUNNING:
                assert r.cpu_tokens == 0 and r.gpu_tokens == gpu + cpu  # whole
                joined += 1
        return out

    monkeypatch.setattr(simulator, "swap_in", checked_swap_in)
    m = sim.run()
    assert m.finished == m.arrived and started > 0 and joined > 0 and m.swapped_tokens > 0


def test_admissions_wait_behind_a_swap_in_that_cannot_be_allocated(
    make_pressure_arrivals: Callable[..., list[Arrival]],
    make_simulator: Callable[..., Simulator],
) -> None:
    # The engine's vLLM ranks a resumed request with a host copy ahead of new ones and stops
    # at the first request it cannot allocate: while a swap-in's whole sequence does not fit,
    # nobody is admitted behind it. Otherwise admissions go beside the swap-ins.
    sim = make_simulator("infercept", make_pressure_arrivals(n=32))
    form = sim.batcher.form
    blocked = beside = 0

    def checked_form(*args: Any) -> Batch:
        nonlocal blocked, beside
        reserve, free = args[-1], sim.kv.gpu_free
        batch = form(*args)
        if reserve:
            assert reserve > free and not batch.admitted
            blocked += sim.waiting.items[:1] != []
        elif sim.swap_queue and batch.admitted:
            beside += 1
        return batch

    sim.batcher.form = checked_form  # type: ignore[method-assign]
    m = sim.run()
    assert m.finished == m.arrived
    assert blocked > 0 and beside > 0  # both sides of the rule were exercised
