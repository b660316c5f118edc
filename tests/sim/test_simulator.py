"""The simulator's configuration, limits and event jumping."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from interlude.policy import POLICIES, Profile, RequestView
from interlude.policy.base import KeyRows, RowArray
from interlude.sim.config import SimConfig, SimulationError
from interlude.sim.metrics import RunMetrics
from interlude.sim.ranked_queue import RankedQueue
from interlude.sim.simulator import Simulator
from interlude_workloads import (
    Arrival,
    Segment,
    TraceCall,
    TraceRequest,
    generate,
    poisson_arrivals,
)

SimFactory = Callable[..., Simulator]
RequestsFactory = Callable[..., list[TraceRequest]]
ArrivalsFactory = Callable[..., list[Arrival]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"horizon_s": 0.0}, r"horizon_s must be > 0"),
        ({"horizon_s": -5.0}, r"horizon_s must be > 0"),
        ({"max_jump": 0}, r"max_jump must be >= 1"),
    ],
)
def test_sim_config_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)  # type: ignore[arg-type]


def test_request_larger_than_the_gpu_is_refused(
    make_simulator: SimFactory, make_requests: RequestsFactory, make_arrivals: ArrivalsFactory
) -> None:
    # The tiny profile holds 200 x 16 = 3,200 tokens. 3,100 + 2 x 50 + 1 = 3,201.
    ok = make_requests(1, prompt=100, prefix="ok")
    big = make_requests(1, prompt=3100, gen=50, calls=1, return_tokens=1, prefix="huge")
    assert big[0].max_context == 3201
    with pytest.raises(SimulationError, match=r"'huge0' reaches 3201 tokens .* holds 3200"):
        make_simulator("vllm", make_arrivals([*ok, *big]))


@pytest.mark.parametrize("name", list(POLICIES))
def test_request_exactly_filling_the_gpu_runs(
    name: str,
    make_simulator: SimFactory,
    make_requests: RequestsFactory,
    make_arrivals: ArrivalsFactory,
) -> None:
    # 3,100 + 50 + 49 + 1 = 3,200 tokens: every block of the GPU, and it must still finish.
    full = make_requests(1, prompt=3100, gen=50, calls=1, return_tokens=49, final_gen=1)
    assert full[0].max_context == 3200
    m = make_simulator(name, make_arrivals(full)).run()
    assert m.finished == 1


def test_preemption_that_frees_memory_is_not_a_deadlock(
    make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    """Every request fits the GPU alone, so the run must finish.

    20 GPU blocks (320 tokens). `big` reaches exactly 320 tokens, the two `mid` ones 170.
    InferCept swaps the paused `mid`s out within its budget and, on resume, back in over
    several iterations, so a swap-queued `mid` holds part of its KV on the GPU while `big`
    decodes. When `big` needs a block and none is free, the engine preempts it (the only
    running request), which frees 14 blocks; the step's batch is then empty. The freed
    blocks are enough to finish the swap-in, yet the engine waits for an event that never
    comes and raises "deadlock".
    """
    p = make_profile(gpu_kv_bytes=20 * 16_000)
    big = TraceRequest("big", "k", 200, (Segment(50, TraceCall("t", 0.2, 20)), Segment(50, None)))
    mid = TraceRequest("mid", "k", 100, (Segment(20, TraceCall("t", 0.1, 20)), Segment(30, None)))
    arrivals = [Arrival(0.0, big, "0:big"), Arrival(0.0, mid, "1:mid"), Arrival(0.05, mid, "2:mid")]
    assert max(a.request.max_context for a in arrivals) == p.gpu_blocks * p.block_size
    m = make_simulator("infercept", arrivals, profile=p).run()
    assert m.finished == 3


def test_horizon_stops_the_run(
    pressure_arrivals: list[Arrival], make_simulator: SimFactory
) -> None:
    sim = make_simulator("preserve", pressure_arrivals, horizon_s=1.05)
    m = sim.run()
    # The last step may overrun the horizon by less than one iteration (T_fwd <= 0.2 s here).
    assert 1.05 <= sim.now < 1.05 + 0.2
    assert 0 <= m.finished < m.arrived
    assert m.makespan_s == pytest.approx(sim.now)  # first arrival at 0


def test_horizon_counts_only_requests_that_arrived(
    pressure_arrivals: list[Arrival], make_simulator: SimFactory
) -> None:
    """Arrivals after the horizon never entered the system.

    The pressure workload arrives every 0.1 s from 0 to 2.3 s; a 1.05 s horizon sees the
    first 11 (0.0 ... 1.0 s). Counting the other 13 as "arrived" gives them a negative
    latency (end - arrival < 0) that drags the normalized-latency median below zero.
    """
    sim = make_simulator("preserve", pressure_arrivals, horizon_s=1.05)
    m = sim.run()
    assert sim.now < 1.1  # before the 12th arrival
    assert m.arrived == 11
    assert m.normalized_latency_median > 0


COMPARED = [f.name for f in dataclasses.fields(RunMetrics) if f.name != "steps"]


def assert_same_run(jumped: RunMetrics, single: RunMetrics) -> None:
    """Equal up to float summation order: a jump adds k x dt where single steps add dt k times."""
    for name in COMPARED:
        a, b = getattr(jumped, name), getattr(single, name)
        if isinstance(a, float):
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12, nan_ok=True), name
        else:
            assert a == b, name


@pytest.mark.parametrize("name", list(POLICIES))
def test_event_jumping_matches_single_iterations_under_pressure(
    name: str, pressure_arrivals: list[Arrival], make_simulator: SimFactory
) -> None:
    jumped = make_simulator(name, pressure_arrivals)
    single = make_simulator(name, pressure_arrivals, max_jump=1)
    a, b = jumped.run(), single.run()
    assert b.steps == b.iterations  # max_jump=1: one iteration per step
    assert a.steps < a.iterations  # the default really jumped
    assert_same_run(a, b)
    assert jumped.finish_log == single.finish_log


@pytest.mark.parametrize("name", list(POLICIES))
def test_event_jumping_matches_single_iterations_on_generated_work(
    name: str, make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    p = make_profile(gpu_kv_bytes=600 * 16_000, cpu_kv_bytes=300 * 16_000)
    arrivals = poisson_arrivals(generate("mixed", 40, seed=2), 1.0, 10.0, seed=3)
    a = make_simulator(name, arrivals, profile=p, horizon_s=30.0).run()
    b = make_simulator(name, arrivals, profile=p, horizon_s=30.0, max_jump=1).run()
    assert a.steps < b.steps
    assert_same_run(a, b)


@pytest.mark.parametrize("name", ["lamps", "lamps-predicted"])
def test_waiting_queue_rerank_at_admission_matches_every_iteration(
    name: str,
    pressure_arrivals: list[Arrival],
    make_simulator: SimFactory,
    make_profile: Callable[..., Profile],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A re-ranking policy's waiting queue is re-ranked only when admission reaches it; runs
    must be the same, bit for bit, as re-ranking it after every decision."""
    p = make_profile(gpu_kv_bytes=600 * 16_000, cpu_kv_bytes=300 * 16_000)
    generated = poisson_arrivals(generate("mixed", 40, seed=2), 3.0, 10.0, seed=3)
    workloads = [(pressure_arrivals, None), (generated, p)]

    def run(arrivals: list[Arrival], profile: Profile | None) -> tuple[RunMetrics, list[str], int]:
        sim = make_simulator(name, arrivals, profile=profile, horizon_s=30.0)
        asked = [0]
        keys = sim.policy.rank_keys  # what the simulator asks (`queue_keys`, maybe an array)

        def counted(
            reqs: Sequence[RequestView], now: float, rows: RowArray | None = None
        ) -> list[tuple[float, ...]] | npt.NDArray[np.float64] | KeyRows:
            asked[0] += len(reqs)
            return keys(reqs, now, rows)

        monkeypatch.setattr(sim.policy, "rank_keys", counted)
        return sim.run(), sim.finish_log, asked[0]

    def runs() -> list[tuple[RunMetrics, list[str], int]]:
        return [run(arrivals, profile) for arrivals, profile in workloads]

    later = runs()
    monkeypatch.setattr(RankedQueue, "rekey_later", RankedQueue.rekey)  # re-rank at once
    every = runs()
    for (m_later, log_later, asked_later), (m_every, log_every, asked_every) in zip(
        later, every, strict=True
    ):
        assert m_later == m_every
        assert log_later == log_every
        assert asked_later < asked_every  # iterations that admitted nothing were not re-ranked
