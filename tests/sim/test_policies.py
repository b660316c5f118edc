"""Each policy's defining behaviour, observed through the simulator."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.policy import (
    POLICIES,
    BatchMode,
    Decision,
    Handling,
    Phase,
    Profile,
    SchedulerView,
)
from interlude.sim.batch import Batch
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceCall, TraceRequest

SimFactory = Callable[..., Simulator]
RequestsFactory = Callable[..., list[TraceRequest]]
ArrivalsFactory = Callable[..., list[Arrival]]
Recorder = Callable[..., list[tuple[SchedulerView, Decision]]]

CHUNKED = [n for n, c in POLICIES.items() if c.traits.batch_mode is BatchMode.CHUNKED]
PREFILL_FIRST = [n for n, c in POLICIES.items() if c.traits.batch_mode is BatchMode.PREFILL_FIRST]


def compute_time(profile: Profile, steps: list[tuple[int, int]]) -> float:
    """Forward time of (batch tokens, identical iterations) steps: sum of k x T_fwd(tokens)."""
    return sum(k * profile.t_fwd(tokens) for tokens, k in steps)


# --- batching ------------------------------------------------------------------------------
def many_decoders(make_requests: RequestsFactory, make_arrivals: ArrivalsFactory) -> list[Arrival]:
    """40 short prompts whose calls return nothing (kept KV resumes straight into decoding),
    then 10 longer prompts that must wait for prefill budget."""
    first = make_requests(40, prompt=8, gen=30, calls=3, duration=0.05, return_tokens=0)
    late = make_requests(10, prompt=60, gen=10, duration=0.05, return_tokens=5, prefix="late")
    return [*make_arrivals(first, gap=0.001), *make_arrivals(late, gap=0.01, start=0.3)]


@pytest.mark.parametrize("name", CHUNKED)
def test_chunked_iterations_stay_within_s(
    name: str,
    make_simulator: SimFactory,
    make_profile: Callable[..., Profile],
    make_requests: RequestsFactory,
    make_arrivals: ArrivalsFactory,
) -> None:
    s = 16
    p = make_profile(saturation_tokens=s, gpu_kv_bytes=1000 * 16_000)
    full_steps = 0

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        nonlocal full_steps
        assert batch.tokens == len(batch.decodes) + sum(n for _, n, _ in batch.chunks)
        if batch.chunks:
            assert batch.tokens <= s  # decodes + prefill chunks fill the batch up to S
            full_steps += batch.tokens == s
        if len(batch.decodes) >= s:
            assert batch.chunks == []  # decodes alone fill S (or more): no prefill at all

    m = make_simulator(
        name, many_decoders(make_requests, make_arrivals), profile=p, observer=observe
    ).run()
    assert m.finished == 50
    assert full_steps > 0  # the limit was reached, not just respected


def test_decodes_beyond_s_leave_no_room_for_prefill(
    make_simulator: SimFactory,
    make_profile: Callable[..., Profile],
    make_requests: RequestsFactory,
    make_arrivals: ArrivalsFactory,
) -> None:
    s = 16
    p = make_profile(saturation_tokens=s, gpu_kv_bytes=1000 * 16_000)
    crowded = 0

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        nonlocal crowded
        if len(batch.decodes) > s:
            assert batch.chunks == []  # no prefill at all, although requests wait for it
            crowded += bool(sim.waiting)

    make_simulator(
        "infercept", many_decoders(make_requests, make_arrivals), profile=p, observer=observe
    ).run()
    assert crowded > 0


@pytest.mark.parametrize("name", PREFILL_FIRST)
def test_prefill_first_iterations_run_no_decodes(
    name: str, pressure_arrivals: list[Arrival], make_simulator: SimFactory
) -> None:
    kinds: set[str] = set()

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        if batch.chunks:
            kinds.add("prefill")
            assert batch.decodes == []  # vLLM v0: a prefill iteration runs no decodes
            assert batch.tokens <= sim.p.max_batched_tokens
            assert k == 1
        elif batch.decodes:
            kinds.add("decode")

    make_simulator(name, pressure_arrivals, observer=observe).run()
    assert kinds == {"prefill", "decode"}


# --- vllm and improved-discard -------------------------------------------------------------
def queue_race() -> list[Arrival]:
    """a runs, calls a 0.5 s tool (its KV discarded); c fills the GPU (3,050 + 100 tokens of
    3,200); b arrives at 0.3 s and waits; a returns at ~0.62 s and waits too. When c ends
    both fit; the order of the waiting queue decides who goes first."""
    a = TraceRequest("a", "k", 100, (Segment(10, TraceCall("t", 0.5, 10)), Segment(10, None)))
    c = TraceRequest("c", "k", 3050, (Segment(100, None),))
    b = TraceRequest("b", "k", 150, (Segment(10, None),))
    return [Arrival(0.0, a, "0:a"), Arrival(0.02, c, "1:c"), Arrival(0.3, b, "2:b")]


@pytest.mark.parametrize(
    ("name", "order"),
    [
        ("vllm", ["2:b", "0:a"]),  # the continuation is a new request: behind b
        ("improved-discard", ["0:a", "2:b"]),  # a keeps its arrival time 0: ahead of b (0.3)
    ],
)
def test_continuation_queue_position(
    name: str, order: list[str], make_simulator: SimFactory
) -> None:
    queues: list[list[str]] = []

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        waiting = [r.request_id for r in sim.waiting]
        if len(waiting) == 2:
            queues.append(waiting)

    sim = make_simulator(name, queue_race(), observer=observe)
    m = sim.run()
    assert queues and all(q == order for q in queues)
    assert sim.finish_log == ["1:c", *order]
    # a's 110 tokens of context at the call were dropped and computed again.
    assert m.recomputed_tokens == 110


@pytest.mark.parametrize(
    ("name", "recomputed", "swapped", "found"),
    [
        # a has 160 + 10 = 170 tokens of KV at its call. vllm-v0 frees them and recomputes all
        # 170 on resume; vllm finds its 10 whole blocks in the prefix cache and recomputes the
        # last 10 tokens; swap copies 170 out and 170 back in.
        ("vllm-v0", 170, 0, 0),
        ("vllm", 10, 0, 160),
        ("improved-discard", 170, 0, 0),
        ("swap", 0, 340, 0),
        ("preserve", 0, 0, 0),
    ],
)
def test_policy_handles_a_call_even_when_nothing_else_runs(
    name: str, recomputed: int, swapped: int, found: int, make_simulator: SimFactory
) -> None:
    """The only request pauses; the engine must still let the policy handle its KV."""
    a = TraceRequest("a", "k", 160, (Segment(10, TraceCall("t", 1.0, 0)), Segment(50, None)))
    m = make_simulator(name, [Arrival(0.0, a, "0:a")]).run()
    assert m.finished == 1
    assert (m.recomputed_tokens, m.swapped_tokens) == (recomputed, swapped)
    assert m.prefix_hit_tokens == found


# --- swap (synchronous) ---------------------------------------------------------------------
def run_with_compute(
    make_simulator: SimFactory, name: str, arrivals: list[Arrival]
) -> tuple[Simulator, float]:
    steps: list[tuple[int, int]] = []

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        steps.append((batch.tokens, k))

    sim = make_simulator(name, arrivals, observer=observe)
    sim.run()
    return sim, compute_time(sim.p, steps)


def test_sync_swap_stalls_the_batch(
    pressure_arrivals: list[Arrival], make_simulator: SimFactory
) -> None:
    sim, compute = run_with_compute(make_simulator, "swap", pressure_arrivals)
    swapped = sum(r.swapped_tokens for r in sim.requests)
    assert swapped > 0
    # Every token copied (out or in) stalls the batch for T_swap = 1e-4 s: busy time is the
    # forward time plus exactly T_swap(all swapped tokens).
    assert sim.acc.busy_s - compute == pytest.approx(sim.p.t_swap(swapped))
    assert sim.acc.busy_s > compute
    assert sim.acc.waste_stall > 0


def test_sync_swap_in_stall_is_charged_once(make_simulator: SimFactory) -> None:
    """A resumed request whose tool returned no tokens decodes right after its swap-in.

    a (160 + 10 tokens) is swapped out at its call and back in 0.5 s later while b keeps
    decoding: 340 tokens copied, a stall of T_swap(340) = 0.034 s in all. The swap-in step
    must not be repeated over the identical decode iterations that follow it.
    """
    a = TraceRequest("a", "k", 160, (Segment(10, TraceCall("t", 0.5, 0)), Segment(50, None)))
    b = TraceRequest("b", "k", 100, (Segment(300, None),))
    sim, compute = run_with_compute(
        make_simulator, "swap", [Arrival(0.0, a, "0:a"), Arrival(0.0, b, "1:b")]
    )
    assert sum(r.swapped_tokens for r in sim.requests) == 340
    assert sim.acc.busy_s - compute == pytest.approx(0.034)


# --- infercept --------------------------------------------------------------------------------
def test_infercept_swaps_within_budget_all_run(
    pressure_arrivals: list[Arrival], make_simulator: SimFactory, record_decisions: Recorder
) -> None:
    partial = 0

    def check(view: SchedulerView, d: Decision) -> None:
        nonlocal partial
        bs = view.profile.block_size
        want_in = sum(r.cpu_tokens for r in view.swap_queue)
        budget_tokens = view.swap_budget_tokens - min(view.swap_budget_tokens, want_in)
        out = [a for a in d.kv if a.handling is Handling.SWAP]
        assert sum(a.blocks for a in out) * bs <= budget_tokens
        assert sum(a.blocks for a in out) <= view.free_cpu_blocks
        paused = {r.request_id: r for r in view.paused}
        for a in out:
            partial += a.blocks < view.profile.blocks(paused[a.request_id].gpu_tokens)

    sim = make_simulator("infercept", pressure_arrivals)
    log = record_decisions(sim, check)
    m = sim.run()
    assert m.swapped_tokens > 0
    assert partial > 0  # the budget was binding: some contexts went out in pieces
    assert any(a.handling is Handling.DISCARD for _, d in log for a in d.kv)


# --- lamps ------------------------------------------------------------------------------------
def test_lamps_promotes_a_starving_request(
    make_simulator: SimFactory,
    make_requests: RequestsFactory,
    record_decisions: Recorder,
) -> None:
    """A 1,500-token request is discarded at its call and comes back to a queue full of small
    new requests, which rank ahead of it by memory-time area. After 100 iterations of waiting
    it is promoted to the head of the queue.

    `lamps-predicted`: it expects the call to take the 1 s prior and discards. `lamps` reads
    the true 0.1 s and preserves, so the request never waits again (the guard is the same).
    """
    big = make_requests(1, prompt=1500, gen=5, duration=0.1, return_tokens=5, prefix="big")
    small = make_requests(150, prompt=100, gen=100, calls=0, prefix="s")
    arrivals = [Arrival(0.0, big[0], "0:big0")] + [
        Arrival(0.05 + 0.01 * i, r, f"{i + 1}:{r.request_id}") for i, r in enumerate(small)
    ]
    promotions: list[str] = []
    at_head_after: list[bool] = []

    def check(view: SchedulerView, d: Decision) -> None:
        if promotions and not at_head_after:
            # The engine moved it; next iteration it is first in line (or already admitted).
            head = view.waiting[0].request_id if view.waiting else None
            at_head_after.append(
                head == "0:big0" or any(r.request_id == "0:big0" for r in view.running)
            )
        for rid in d.requeue:
            r = next(r for r in view.waiting if r.request_id == rid)
            assert r.scheduled_once and r.phase is Phase.WAITING
            assert view.iteration - r.queue_iteration >= 100
            assert view.waiting[0].request_id != rid  # it was starving behind others
            promotions.append(rid)

    sim = make_simulator("lamps-predicted", arrivals)
    record_decisions(sim, check)
    m = sim.run()
    assert m.finished == 151
    assert promotions == ["0:big0"]
    assert at_head_after == [True]


# --- interlude --------------------------------------------------------------------------------
def test_interlude_never_discards_without_pressure(
    make_simulator: SimFactory,
    make_requests: RequestsFactory,
    make_arrivals: ArrivalsFactory,
    record_decisions: Recorder,
) -> None:
    # 6 requests of at most 100 + 3 x 20 + 2 x 10 = 180 tokens: 6 x 12 = 72 of 200 blocks.
    reqs = make_requests(6, prompt=100, gen=20, calls=2, duration=2.0, return_tokens=10)
    sim = make_simulator("interlude", make_arrivals(reqs, gap=0.05))
    log = record_decisions(sim)
    m = sim.run()
    assert m.finished == 6
    assert not any(a.handling is Handling.DISCARD for _, d in log for a in d.kv)
    assert m.recomputed_tokens == 0


def test_interlude_discards_under_pressure(
    pressure_arrivals: list[Arrival], make_simulator: SimFactory, record_decisions: Recorder
) -> None:
    pressured = 0

    def check(view: SchedulerView, d: Decision) -> None:
        nonlocal pressured
        if any(a.handling is Handling.DISCARD for a in d.kv):
            pressured += 1
            assert sim.policy.memory_pressure(view)  # type: ignore[attr-defined]

    sim = make_simulator("interlude", pressure_arrivals)
    record_decisions(sim, check)
    sim.run()
    assert pressured > 0


def test_interlude_swap_not_delayed_by_event_jumping(
    make_simulator: SimFactory, make_profile: Callable[..., Profile]
) -> None:
    """A long call of a kind never seen before, while another request keeps decoding.

    Interlude's estimate for an unknown kind is the elapsed time, so the expected preserve
    waste grows until it passes the swap price; and without pressure it swaps only once
    more than 3/4 of the GPU KV is in use (48 blocks here: the paused request holds 11, the
    decoding one passes 25 after some 300 tokens). Simulated one iteration at a time the
    paused request is swapped out when both hold; with event jumping the simulator must
    stop at that moment too (the policy's `review_at` and `review_iteration`), not keep the
    KV on the GPU until the next event. The runs must agree.
    """
    a = TraceRequest("a", "new", 160, (Segment(10, TraceCall("new", 5.0, 10)), Segment(10, None)))
    b = TraceRequest("b", "other", 100, (Segment(400, None),))
    arrivals = [Arrival(0.0, a, "0:a"), Arrival(0.0, b, "1:b")]
    p = make_profile(gpu_kv_bytes=48 * 16_000)
    single = make_simulator("interlude", arrivals, max_jump=1, profile=p).run()
    jumped = make_simulator("interlude", arrivals, profile=p).run()
    assert single.swapped_tokens > 0
    assert jumped.swapped_tokens == single.swapped_tokens
    assert jumped.waste_fraction == pytest.approx(single.waste_fraction, rel=1e-6)
