"""Continuum's KV time-to-live, on hand-built views and in the simulator.

Numbers (tiny profile): a reload of C tokens is a chunked recompute of C alone, in chunks of
S = 256: (0.05 ms x C + ceil(C / 256) x 10 ms), so 18 ms for 160 tokens and 60 ms for 600.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import (
    Decision,
    Handling,
    KVAction,
    Phase,
    Profile,
    SchedulerView,
    make_policy,
)
from interlude.policy.continuum import ContinuumPolicy, Correlation, DurationWindow, best_ttl
from interlude.policy.predict import PAST
from interlude.policy.types import UNKNOWN_TOOL
from interlude.sim.simulator import Simulator
from interlude_workloads import (
    Arrival,
    Segment,
    TraceCall,
    TraceRequest,
    generate,
    poisson_arrivals,
)

ViewFactory = Callable[..., SchedulerView]
RequestFactory = Callable[..., Any]
Recorder = Callable[..., list[tuple[SchedulerView, Decision]]]


@pytest.fixture
def policy(make_profile: Callable[..., Profile]) -> ContinuumPolicy:
    p = make_policy("continuum", make_profile())
    assert isinstance(p, ContinuumPolicy)
    return p


def warm_up(policy: ContinuumPolicy, fake_request: RequestFactory) -> None:
    """101 calls of tool "t" (80 of 0.5 s, 21 of 10 s): past the cold start. Three finished
    programs of 4 turns each: (k, N - k) falls as k rises, so eta = 1."""
    for i in range(101):
        r = fake_request(f"w{i}", phase=Phase.PAUSED, kind="t", paused_at=0.0)
        policy.on_resume(r, 1.0, 0.5 if i < 80 else 10.0)
    for i in range(3):
        policy.on_finish(fake_request(f"f{i}", calls_done=3), 1.0)


def test_reload_is_a_chunked_recompute(policy: ContinuumPolicy) -> None:
    assert policy.reload_s(160) == pytest.approx(0.018)
    assert policy.reload_s(600) == pytest.approx(0.060)


def test_cold_start_ttl_weighs_reload_and_queueing_against_an_exponential_prior(
    policy: ContinuumPolicy,
) -> None:
    # B = T x 1 + reload; with mean-1 s exponential calls, U(tau) = (1 - e^-tau) B - tau
    # peaks at tau = ln B, and holding is never worth it while B <= 1 s.
    assert policy.ttl("t", 160) == 0.0  # B = 0.018 s
    policy.waits.extend([2.0, 4.0])  # evicted requests waited 3 s on average
    assert policy.queue_delay_s() == pytest.approx(3.0)
    assert policy.ttl("t", 160) == pytest.approx(math.log(3.018))
    assert policy.ttl("t", 600) == pytest.approx(math.log(3.060))  # dearer reload: longer


def test_cold_start_ttl_from_reload_alone(make_profile: Callable[..., Profile]) -> None:
    # A slow model: reloading 200 tokens (one chunk) takes e seconds, so tau = ln e = 1 s.
    p = make_profile(fwd_a_ms=(1000 * math.e - 10) / 200)
    policy = ContinuumPolicy(p)
    assert policy.reload_s(200) == pytest.approx(math.e)
    assert policy.ttl("t", 200) == pytest.approx(1.0)


def test_cold_start_ttl_with_another_prior_mean(make_profile: Callable[..., Profile]) -> None:
    # A prior of mean mu: U(tau) = (1 - e^(-tau / mu)) B - tau peaks at tau = mu ln(B / mu).
    policy = ContinuumPolicy(make_profile(), prior_mean_s=0.5)
    policy.waits.extend([2.0, 4.0])  # B = 3 s + 0.018 s of reload
    assert policy.ttl("t", 160) == pytest.approx(0.5 * math.log(3.018 / 0.5))
    # The swept variants are this policy at other priors and fixed TTLs.
    slow = make_policy("interlude.policy.variants:Prior4", make_profile())
    assert isinstance(slow, ContinuumPolicy) and slow.prior_mean_s == 4.0
    slow.waits.extend([2.0, 4.0])
    assert slow.ttl("t", 160) == 0.0  # B < mu: holding never pays under this prior
    fixed = make_policy("interlude.policy.variants:FixedTtl8", make_profile())
    assert isinstance(fixed, ContinuumPolicy) and fixed.ttl("never-seen", 160) == 8.0
    with pytest.raises(ValueError, match="prior_mean_s"):
        ContinuumPolicy(make_profile(), prior_mean_s=0.0)


def test_best_ttl_maximises_probability_times_benefit_minus_hold() -> None:
    d = [0.5] * 80 + [10.0] * 21
    # B = 2: U(0.5) = 80/101 x 2 - 0.5 = 1.08 beats U(0) = 0 and U(10) < 0.
    assert best_ttl(d, 2.0) == 0.5
    # B = 60: U(10) = 60 - 10 = 50 beats U(0.5) = 47.0.
    assert best_ttl(d, 60.0) == 10.0
    assert best_ttl(d, 0.1) == 0.0  # never worth holding
    assert best_ttl([0.0, 0.0, 3.0], 1.0) == 0.0  # calls of 0 s are back at tau = 0


def test_duration_window_best_ttl_equals_best_ttl() -> None:
    """The policy's TTL comes from `DurationWindow.best_ttl` (arrays, kept between samples):
    the same number as `best_ttl` over the window's samples, ties and evictions included."""
    import random

    rng = random.Random(4)
    window = DurationWindow(50)
    assert window.best_ttl(5.0) == best_ttl([], 5.0) == 0.0
    for _ in range(400):
        # Few distinct values (ties) and some spread; zeros as in calls that return at once.
        window.append(rng.choice((0.0, 0.5, 1.0, 2.0, rng.expovariate(0.5))))
        for benefit in (0.0, 0.3, 1.7, rng.uniform(0, 40), 1e6):
            assert window.best_ttl(benefit) == best_ttl(list(window), benefit)
    assert len(window) == 50


def test_warm_ttl_uses_the_tool_s_own_cdf(
    policy: ContinuumPolicy, fake_request: RequestFactory
) -> None:
    warm_up(policy, fake_request)
    assert policy.correlation.eta() == pytest.approx(1.0)
    policy.waits.append(2.0)  # B = 2 x 1 + 0.018
    assert policy.ttl("t", 160) == 0.5
    policy.waits[0] = 60.0  # B = 60.018
    assert policy.ttl("t", 160) == 10.0


def test_a_tool_with_few_calls_uses_every_tool_s_calls(
    policy: ContinuumPolicy, fake_request: RequestFactory
) -> None:
    warm_up(policy, fake_request)
    for i in range(5):
        r = fake_request(f"u{i}", phase=Phase.PAUSED, kind="u", paused_at=0.0)
        policy.on_resume(r, 1.0, 0.1)
    policy.waits.append(2.0)  # B = 2.018
    # Its own 5 calls of 0.1 s would give tau = 0.1; pooled with the 101 others, 0.5 wins:
    # U(0.5) = 85/106 x 2.018 - 0.5 = 1.12 > U(0.1) = 5/106 x 2.018 - 0.1 = -0.005.
    assert policy.ttl("u", 160) == 0.5


def test_a_real_models_call_that_names_no_tool_yet_is_learned_by_its_kind(
    policy: ContinuumPolicy, fake_request: RequestFactory
) -> None:
    # An engine's pause of a real model names `UNKNOWN_TOOL` (the front end parses the call
    # after the turn): its duration goes to its kind's window, not to one pooled "tool".
    for kind in ("chat", "calc"):
        r = fake_request(kind, phase=Phase.PAUSED, kind=kind, paused_at=0.0)
        r.tool = UNKNOWN_TOOL
        policy.on_resume(r, 1.0, 1.0)
    assert sorted(policy.durations) == ["calc", "chat"]


def test_released_code_variant_pins_short_tools_for_a_fixed_ttl(
    make_profile: Callable[..., Profile], fake_request: RequestFactory
) -> None:
    policy = make_policy("continuum-fixed-ttl", make_profile())  # fixed_ttl_s=2.0
    assert isinstance(policy, ContinuumPolicy)
    assert policy.ttl("never-seen", 160) == 2.0  # unknown tools count as 0 s
    for i, d in enumerate((1.0, 4.0)):
        policy.on_resume(fake_request(f"s{i}", phase=Phase.PAUSED, kind="slow", paused_at=0), 1, d)
    assert policy.ttl("slow", 160) == 0.0  # mean 2.5 s > 2 s: not pinned


def test_eta_is_minus_the_correlation_of_calls_done_and_calls_left() -> None:
    c = Correlation()
    assert c.eta() == 0.0  # no finished program: undefined, no ordering benefit
    c.observe(2)  # pairs (1, 1)
    c.observe(4)  # pairs (1, 3), (2, 2), (3, 1)
    assert c.eta() == pytest.approx(5 / 11)  # corr = -1.25 / 2.75
    small = Correlation(size=1)
    small.observe(2)
    small.observe(4)  # the 2-turn program leaves the window: a clean line, eta = 1
    assert small.eta() == pytest.approx(1.0)


def pinned_view(
    policy: ContinuumPolicy, make_view: ViewFactory, fake_request: RequestFactory, now: float
) -> tuple[Any, SchedulerView]:
    a = fake_request("a", phase=Phase.PAUSED, gpu=160, paused_at=10.0)
    return a, make_view(now=now, paused=[a])


def test_kv_is_kept_until_the_ttl_expires_then_dropped(
    policy: ContinuumPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    policy.waits.append(3.0)
    a, _ = pinned_view(policy, make_view, fake_request, 10.0)
    policy.on_pause(a, 10.0)
    ttl = math.log(3.018)
    assert policy.deadline["a"] == pytest.approx(10.0 + ttl)
    kept = policy.decide(make_view(now=10.0 + ttl, paused=[a]))  # not yet: strictly after
    assert kept.kv == () and kept.review_at == pytest.approx(10.0 + ttl + PAST)
    dropped = policy.decide(make_view(now=10.0 + ttl + 1e-6, paused=[a]))
    assert dropped.kv == (KVAction("a", Handling.DISCARD, 10),)
    assert dropped.review_at is None


def test_a_ttl_of_zero_drops_the_kv_at_once(
    policy: ContinuumPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    a = fake_request("a", phase=Phase.PAUSED, gpu=160, paused_at=10.0)
    policy.on_pause(a, 10.0)  # B = 0.018 s: not worth a pin
    d = policy.decide(make_view(now=10.0 + 1e-6, paused=[a]))
    assert d.kv == (KVAction("a", Handling.DISCARD, 10),)


def test_memory_pressure_unpins_latest_programs_first(
    policy: ContinuumPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    policy.waits.append(3.0)  # every pin lasts ln(3.0x) > 1 s
    pinned = [
        fake_request("old", phase=Phase.PAUSED, arrival=0.0, gpu=160, paused_at=9.0),
        fake_request("new", phase=Phase.PAUSED, arrival=5.0, gpu=16, paused_at=9.0),
        fake_request("mid", phase=Phase.PAUSED, arrival=3.0, gpu=48, paused_at=9.0),
    ]
    for r in pinned:
        policy.on_pause(r, 9.0)
    # Two decodes whose last block is full need two new blocks; none is free.
    running = [fake_request(f"d{i}", phase=Phase.RUNNING, gpu=32) for i in range(2)]
    d = policy.decide(make_view(now=9.1, running=running, paused=pinned, free_gpu_blocks=0))
    # Latest program first: new (1 block) is not enough, mid (3 more) is; old keeps its KV.
    assert d.kv == (
        KVAction("new", Handling.DISCARD, 1),
        KVAction("mid", Handling.DISCARD, 3),
    )
    # With a free block per decode nothing is dropped.
    d = policy.decide(make_view(now=9.1, running=running, paused=pinned, free_gpu_blocks=2))
    assert d.kv == ()


def test_nothing_running_and_the_head_does_not_fit_unpins(
    policy: ContinuumPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    policy.waits.append(3.0)
    a = fake_request("a", phase=Phase.PAUSED, gpu=160, paused_at=9.0)
    policy.on_pause(a, 9.0)
    head = fake_request("h", pending=100)  # needs 7 blocks (100 tokens and the next one)
    d = policy.decide(make_view(now=9.1, waiting=[head], paused=[a], free_gpu_blocks=5))
    assert d.kv == (KVAction("a", Handling.DISCARD, 10),)
    d = policy.decide(make_view(now=9.1, waiting=[head], paused=[a], free_gpu_blocks=7))
    assert d.kv == ()


def test_program_level_fcfs(policy: ContinuumPolicy, fake_request: RequestFactory) -> None:
    early = fake_request("early", arrival=1.0, queue_time=9.0, pending=10)
    late = fake_request("late", arrival=2.0, queue_time=3.0, pending=10)
    warm = fake_request("warm", phase=Phase.SWAP_QUEUED, arrival=5.0, gpu=32, pending=5)
    keys = {r.request_id: policy.queue_key(r, 9.0) for r in (early, late, warm)}
    # Program arrival, not the turn's: early goes first although its turn came last; a
    # program still holding its KV goes ahead of both.
    assert sorted(keys, key=keys.__getitem__) == ["warm", "early", "late"]
    running = [
        fake_request(r, phase=Phase.RUNNING, arrival=t, gpu=16) for r, t in (("x", 1), ("y", 4))
    ]
    assert [r.request_id for r in policy.preemption_order(running)] == ["y", "x"]


def test_queueing_delay_of_dropped_requests_is_measured(
    policy: ContinuumPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    a = fake_request("a", phase=Phase.PAUSED, gpu=160, paused_at=1.0)
    policy.on_pause(a, 1.0)
    policy.decide(make_view(now=1.1, paused=[a]))  # TTL 0: dropped
    back = fake_request("a", queue_time=2.0, pending=170, calls_done=1)
    policy.queue_key(back, 2.0)
    other = fake_request("b", queue_time=2.5, pending=10)
    policy.queue_key(other, 2.5)  # never dropped: its wait does not count
    admitted = fake_request("a", phase=Phase.RUNNING, queue_time=4.5, gpu=170, calls_done=1)
    b = fake_request("b", phase=Phase.RUNNING, queue_time=4.5, gpu=10)
    policy.decide(make_view(now=4.6, running=[admitted, b]))
    assert list(policy.waits) == [2.5]


# --- in the simulator -----------------------------------------------------------------------
def test_sim_pins_a_short_call_and_drops_a_long_one_at_its_ttl(
    make_simulator: Callable[..., Simulator],
    make_profile: Callable[..., Profile],
    record_decisions: Recorder,
) -> None:
    """Reloading 200 tokens takes e seconds here, so every pin lasts 1 s. The 0.5 s call comes
    back to its KV; the 3 s call loses it 1 s in, and on resume finds 12 whole blocks of its 200
    tokens in the prefix cache (nothing else needed them) and recomputes the other 8."""
    p = make_profile(fwd_a_ms=(1000 * math.e - 10) / 200)
    short = TraceRequest("short", "k", 190, (Segment(10, TraceCall("t", 0.5, 5)), Segment(5, None)))
    long = TraceRequest("long", "k", 190, (Segment(10, TraceCall("t", 3.0, 5)), Segment(5, None)))
    arrivals = [Arrival(0, short, "0:short"), Arrival(0, long, "1:long")]
    sim = make_simulator("continuum", arrivals, profile=p)
    held_for: list[float] = []

    def check(view: SchedulerView, d: Decision) -> None:
        paused = {r.request_id: r for r in view.paused}
        for a in d.kv:
            at = paused[a.request_id].paused_at
            assert a.request_id == "1:long" and at is not None
            held_for.append(view.now - at)

    record_decisions(sim, check)
    m = sim.run()
    assert m.finished == 2
    assert (m.recomputed_tokens, m.prefix_hit_tokens) == (8, 192)
    # Dropped once, at the first iteration after the TTL (2 decodes take 37 ms here).
    assert len(held_for) == 1
    assert 1.0 < held_for[0] <= 1.0 + p.t_fwd(2) + 1e-9


def test_sim_fcfs_by_program_arrival(
    make_simulator: Callable[..., Simulator], make_profile: Callable[..., Profile]
) -> None:
    """One request runs at a time. a calls a 0.5 s tool and, its TTL 0 here, loses its KV; c
    runs meanwhile; b arrives at 0.3 s and a's turn comes back at ~0.6 s. When c ends, a
    (program arrival 0) goes before b (0.3) although its turn came back later."""
    p = make_profile(max_num_seqs=1)
    a = TraceRequest("a", "k", 100, (Segment(10, TraceCall("t", 0.5, 10)), Segment(10, None)))
    c = TraceRequest("c", "k", 500, (Segment(100, None),))
    b = TraceRequest("b", "k", 150, (Segment(10, None),))
    arrivals = [Arrival(0.0, a, "0:a"), Arrival(0.02, c, "1:c"), Arrival(0.3, b, "2:b")]
    queues: list[list[str]] = []

    def observe(sim: Simulator, batch: Any, k: int) -> None:
        if len(sim.waiting) == 2:
            queues.append([r.request_id for r in sim.waiting])

    sim = make_simulator("continuum", arrivals, profile=p, observer=observe)
    m = sim.run()
    assert queues and all(q == ["0:a", "2:b"] for q in queues)
    assert sim.finish_log == ["1:c", "0:a", "2:b"]
    # a's 110 tokens were dropped; c's 500 fit beside them, so 6 whole blocks are found again.
    assert (m.recomputed_tokens, m.prefix_hit_tokens) == (14, 96)
    # The vLLM baseline queues a's turn as a new request: behind b.
    vllm = make_simulator("vllm", arrivals, profile=p)
    vllm.run()
    assert vllm.finish_log == ["1:c", "2:b", "0:a"]


def test_sim_generated_work_pins_keeps_and_expires(
    make_simulator: Callable[..., Simulator], make_profile: Callable[..., Profile]
) -> None:
    """The mixed InferCept-like workload, integrity checks on: the first 100 calls get the
    exponential prior's TTL, later ones a TTL that is one of the observed call durations (or
    0); some calls come back to their KV, some pins expire first."""
    p = make_profile(gpu_kv_bytes=600 * 16_000, cpu_kv_bytes=300 * 16_000)
    arrivals = poisson_arrivals(generate("mixed", 60, seed=4), 2.0, 30.0, seed=5)
    sim = make_simulator("continuum", arrivals, profile=p, check_integrity=True)
    policy = sim.policy
    assert isinstance(policy, ContinuumPolicy)
    warm: list[tuple[float, bool]] = []  # (TTL, an observed duration)
    cold = 0
    came_back = {"kept": 0, "dropped": 0}
    on_pause, on_resume = policy.on_pause, policy.on_resume

    def pause(req: Any, now: float) -> None:
        nonlocal cold
        seen = set(policy.all_durations)
        was_warm = policy.calls_seen > 100
        on_pause(req, now)
        ttl = policy.deadline[req.request_id] - now
        if was_warm:  # deadline - now: equal to the TTL up to rounding
            warm.append((ttl, any(abs(ttl - d) < 1e-9 for d in seen)))
        else:
            cold += 1

    def resume(req: Any, now: float, duration: float) -> None:
        came_back["kept" if req.gpu_tokens > 0 else "dropped"] += 1
        on_resume(req, now, duration)

    policy.on_pause = pause  # type: ignore[method-assign]
    policy.on_resume = resume  # type: ignore[method-assign]
    m = sim.run()
    assert m.finished == m.arrived > 0
    assert cold > 0 and warm
    assert all(abs(ttl) < 1e-9 or observed for ttl, observed in warm)
    assert any(ttl > 0 for ttl, _ in warm)
    assert came_back["kept"] > 0 and came_back["dropped"] > 0
