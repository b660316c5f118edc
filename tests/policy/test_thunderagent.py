"""ThunderAgent's program scheduler on hand-built views.

Numbers (tiny profile): KV capacity 200 blocks x 16 = 3,200 tokens; every live program also
reserves a buffer of 100 tokens. A program's tokens are its context.
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
from interlude.policy.thunderagent import ThunderAgentPolicy
from interlude.sim.batch import Batch
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival

ViewFactory = Callable[..., SchedulerView]
RequestFactory = Callable[..., Any]
Recorder = Callable[..., list[tuple[SchedulerView, Decision]]]


@pytest.fixture
def policy(make_profile: Callable[..., Profile]) -> ThunderAgentPolicy:
    p = make_policy("thunderagent", make_profile())
    assert isinstance(p, ThunderAgentPolicy)
    return p


def test_defaults_are_the_released_code_s(policy: ThunderAgentPolicy) -> None:
    assert (policy.interval_s, policy.buffer_tokens, policy.acting_weight) == (5.0, 100, 1.0)
    assert policy.capacity == 3200


def test_admission_refuses_a_program_whose_kv_would_not_fit(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    a = fake_request("a", pending=2900)
    d = policy.decide(make_view(waiting=[a]))
    assert d.hold == frozenset() and policy.active == {"a"}  # 3,200 >= 2,900 + 100
    # a now runs with 2,900 tokens: 3,200 - 3,000 = 200 remain, b needs 300 + 100.
    a = fake_request("a", phase=Phase.RUNNING, gpu=2900)
    b = fake_request("b", arrival=1.0, pending=300)
    d = policy.decide(make_view(now=1.0, running=[a], waiting=[b]))
    assert d.hold == frozenset({"b"})
    assert "b" in policy.pool and "b" not in policy.active
    # c would fit (50 + 100 <= 200), but b waits first: new work queues behind the pool.
    c = fake_request("c", arrival=2.0, pending=50)
    d = policy.decide(make_view(now=2.0, running=[a], waiting=[b, c]))
    assert d.hold == frozenset({"b", "c"})


def test_held_programs_resume_at_the_next_check_and_queue_from_then(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    a = fake_request("a", phase=Phase.RUNNING, gpu=2900)
    c = fake_request("c", phase=Phase.RUNNING, gpu=100)
    b = fake_request("b", arrival=1.0, pending=300)
    # 3,200 - (2,900 + 100 + 2 x 100) = 0 remain; the first check runs at once (1.0).
    d = policy.decide(make_view(now=1.0, running=[a, c], waiting=[b]))
    assert d.hold == frozenset({"b"}) and d.review_at == 6.0
    policy.on_finish(a, 3.0)
    # Memory is free at 3.0, but the pool is only looked at every 5 s.
    assert policy.decide(make_view(now=3.0, running=[c], waiting=[b])).hold == frozenset({"b"})
    d = policy.decide(make_view(now=6.0, running=[c], waiting=[b]))
    assert d.hold == frozenset() and d.requeue == ("b",) and d.review_at == 11.0
    # Its turn reaches vLLM now: it queues behind what was sent before 6.0.
    assert policy.queue_key(b, 6.0) == (6.0,)


def known(policy: ThunderAgentPolicy, pool: list[str], started: list[str]) -> None:
    """State a run would have built: `pool` paused (in this order), `started` ran before."""
    for rid in pool:
        policy.seen.add(rid)
        policy.pool[rid] = len(policy.pool)
    policy.started.update(started)


def test_resume_order_returned_then_new_then_acting_smallest_first_while_they_fit(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    big = fake_request("big", phase=Phase.RUNNING, gpu=1000)
    policy.decide(make_view(now=0.0, running=[big]))  # the first check runs at once
    known(policy, ["r1", "act", "new", "r2"], started=["r1", "r2", "act"])
    returned = [
        fake_request("r1", arrival=1.0, pending=900, calls_done=1),
        fake_request("r2", arrival=2.0, pending=400, calls_done=1),
    ]
    new = fake_request("new", arrival=3.0, pending=800)
    acting = fake_request("act", phase=Phase.PAUSED, arrival=0.5, paused_at=4.0)
    acting.context_tokens = 100  # paused while acting: its KV is gone already
    # remaining = 3,200 - 1,100 = 2,100. Returned first, smallest first: r2 (500), r1
    # (1,000); then new (900) does not fit the 600 left, act (200) does.
    d = policy.decide(make_view(now=5.0, running=[big], waiting=[*returned, new], paused=[acting]))
    assert d.requeue == ("r2", "r1")  # the waiting ones resumed, in resume order
    assert policy.active == {"big", "r1", "r2", "act"} and list(policy.pool) == ["new"]
    assert d.hold == frozenset({"new"})


def test_resume_skips_a_program_too_big_for_what_is_left(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    big = fake_request("big", phase=Phase.RUNNING, gpu=2000)
    policy.decide(make_view(now=0.0, running=[big]))
    known(policy, ["huge", "small"], started=["huge", "small"])
    huge = fake_request("huge", arrival=1.0, pending=1500, calls_done=1)
    small = fake_request("small", arrival=2.0, pending=200, calls_done=1)
    # remaining = 3,200 - 2,100 = 1,100: small (300) fits, huge (1,600) does not.
    d = policy.decide(make_view(now=5.0, running=[big], waiting=[huge, small]))
    assert d.requeue == ("small",) and d.hold == frozenset({"huge"})


def test_pressure_pauses_acting_programs_shortest_first(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    # Live: 1,500 + 800 + 400 + 600 = 3,300 tokens + 4 x 100 = 3,700: 500 over.
    runner = fake_request("run", phase=Phase.RUNNING, gpu=1500)
    acting = [
        fake_request(rid, phase=Phase.PAUSED, arrival=i, gpu=n, paused_at=1.0)
        for i, (rid, n) in enumerate((("p800", 800), ("p400", 400), ("p600", 600)))
    ]
    d = policy.decide(make_view(now=2.0, running=[runner], paused=acting))
    # Pausing the smallest (400 + 100) is enough; its KV is dropped, the others keep theirs.
    assert d.kv == (KVAction("p400", Handling.DISCARD, 25),)
    assert set(policy.pool) == {"p400"} and policy.marked == set()


def test_pressure_beyond_acting_programs_marks_the_smallest_reasoning_one(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    # Live: 2,000 + 1,200 + 200 = 3,400 + 300 = 3,700: 500 over; pausing p (300) leaves 200.
    r1 = fake_request("r1", phase=Phase.RUNNING, gpu=2000)
    r2 = fake_request("r2", phase=Phase.RUNNING, arrival=1.0, gpu=1200)
    p = fake_request("p", phase=Phase.PAUSED, arrival=2.0, gpu=200, paused_at=1.0)
    d = policy.decide(make_view(now=2.0, running=[r1, r2], paused=[p]))
    assert d.kv == (KVAction("p", Handling.DISCARD, 13),)
    assert policy.marked == {"r2"}  # 1,200 covers the 200 still over; r1 is left alone
    # r2 reaches its tool call: it is paused there, and its KV goes.
    r2 = fake_request("r2", phase=Phase.PAUSED, arrival=1.0, gpu=1210, paused_at=3.0)
    d = policy.decide(make_view(now=3.0, running=[r1], paused=[r2]))
    assert d.kv == (KVAction("r2", Handling.DISCARD, 76),)
    assert "r2" in policy.pool and not policy.marked


@pytest.mark.parametrize("decay", [False, True])
def test_acting_token_decay_lets_a_long_call_stop_blocking_resumes(
    decay: bool,
    make_profile: Callable[..., Profile],
    fake_request: RequestFactory,
    make_view: ViewFactory,
) -> None:
    policy = make_policy("thunderagent-decay" if decay else "thunderagent", make_profile())
    assert isinstance(policy, ThunderAgentPolicy) and policy.acting_decay is decay
    p = fake_request("p", phase=Phase.PAUSED, gpu=2900, paused_at=0.0)
    policy.decide(make_view(now=0.0, paused=[p]))  # acting, live; first check at 0
    n = fake_request("n", arrival=0.5, pending=300)
    assert policy.decide(make_view(now=0.5, waiting=[n], paused=[p])).hold == {"n"}
    d = policy.decide(make_view(now=5.0, waiting=[n], paused=[p]))
    if decay:
        # p has acted 5 s: it counts 2,900 / 32 = 91 tokens on the resume side, so n goes in;
        # the pressure check counts it whole (-200 left) and pauses p, the only acting one.
        assert d.requeue == ("n",) and d.hold == frozenset()
        assert d.kv == (KVAction("p", Handling.DISCARD, 182),)
    else:
        assert d.hold == {"n"} and d.kv == ()


def test_with_nothing_live_the_first_candidate_starts_even_if_it_does_not_fit(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    # 3,150 + 100 > 3,200: admission refuses it, yet nothing else could ever free memory.
    a = fake_request("a", pending=3150)
    d = policy.decide(make_view(waiting=[a]))
    assert d.hold == frozenset() and policy.active == {"a"}


def test_finished_programs_are_forgotten(
    policy: ThunderAgentPolicy, make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    a = fake_request("a", phase=Phase.RUNNING, gpu=3000)
    b = fake_request("b", arrival=1.0, pending=500)
    policy.decide(make_view(now=1.0, running=[a], waiting=[b]))
    assert "b" in policy.pool
    policy.on_finish(b, 2.0)
    policy.on_finish(a, 2.0)
    assert not (policy.active or policy.pool or policy.marked)


# --- in the simulator -----------------------------------------------------------------------
def test_sim_admission_keeps_the_pressure_workload_from_thrashing(
    pressure_arrivals: list[Arrival],
    make_simulator: Callable[..., Simulator],
    record_decisions: Recorder,
) -> None:
    """24 programs of 200-600 tokens against 3,200 tokens of KV: other policies preempt and
    recompute here (tests/sim/test_integrity.py); ThunderAgent lets programs in only while
    they fit with their buffers, holds the rest, and never loses a token of KV."""
    preempted: list[str] = []
    admitted_while_held: list[str] = []
    holds: list[frozenset[str]] = []

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        preempted.extend(r.request_id for r in batch.preempted)
        held = holds[-1] if holds else frozenset()
        admitted_while_held.extend(r.request_id for r in batch.admitted if r.request_id in held)

    sim = make_simulator("thunderagent", pressure_arrivals, observer=observe)
    record_decisions(sim, lambda view, d: holds.append(d.hold))
    m = sim.run()
    assert m.finished == m.arrived == 24
    assert max(len(h) for h in holds) >= 10  # most of the 24 waited in the pool at some point
    assert admitted_while_held == []
    assert preempted == [] and m.recomputed_tokens == 0


def test_sim_under_pressure_pauses_the_smallest_acting_programs(
    pressure_arrivals: list[Arrival],
    make_simulator: Callable[..., Simulator],
    make_profile: Callable[..., Profile],
) -> None:
    """No buffer and a check every 0.5 s: the live programs outgrow the KV between checks.
    Each check that pauses acting programs pauses the smallest ones; the run stays whole."""
    policy = ThunderAgentPolicy(make_profile(), buffer_tokens=0, interval_s=0.5)
    sim = make_simulator(policy, pressure_arrivals)
    decide = policy.decide
    paused_at_checks = 0

    def checked(view: SchedulerView) -> Decision:
        nonlocal paused_at_checks
        marked, active = set(policy.marked), set(policy.active)
        d = decide(view)
        acting = {r.request_id: r.context_tokens for r in view.paused if r.request_id in active}
        dropped = {a.request_id for a in d.kv} - marked
        if dropped:
            paused_at_checks += 1
            kept = [n for rid, n in acting.items() if rid not in dropped]
            assert max(acting[rid] for rid in dropped) <= min(kept, default=math.inf)
        return d

    policy.decide = checked  # type: ignore[method-assign]
    m = sim.run()
    assert m.finished == m.arrived == 24
    assert paused_at_checks > 0
